"""Broken and hostile inputs (the corpus in tests/hostile) end in one line and exit 2.

Each case goes through the real command line (`compress run`) with the working directory in
a fresh folder. It must exit 2 with one error line that names the file and the key or row
(expect.json lists the words each line must hold), print no traceback, and write nothing
outside the run's artifact folder.

- recipes/: whole recipes (@CKPT@ and @DATA@ stand for the tiny model and data).
- data/: data files, each read as the whole dataset by a sound recipe.
- models/: changes made to a copy of the tiny checkpoint (truncated weights, wrong model
  type, a pickle in place of safetensors, ...).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HOSTILE = Path(__file__).parent / "hostile"
EXPECT: dict[str, list[str]] = json.loads((HOSTILE / "expect.json").read_text())
GOOD = (HOSTILE / "good.yaml").read_text()  # the sound recipe data/ and models/ cases run with


def test_corpus_is_complete():
    files = {str(p.relative_to(HOSTILE)) for p in HOSTILE.rglob("*") if p.is_file() and p.name not in ("expect.json", "good.yaml")}
    assert files == set(EXPECT), "every case needs its expectation and the reverse"
    assert len(files) >= 50


def _snapshot(folder: Path) -> dict[str, tuple[int, float]]:
    out = {}
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if rel.parts[0] == "artifacts" or not p.is_file():
            continue
        out[str(rel)] = (p.stat().st_size, p.stat().st_mtime)
    return out


class _Pwned:
    """Unpickling this creates a file: the proof that a pickle was loaded."""

    def __reduce__(self):
        return (open, ("pwned_by_pickle", "w"))


def _mutated_model(tiny_checkpoint: Path, spec: dict, dest: Path) -> Path:
    shutil.copytree(tiny_checkpoint, dest)
    if "truncate" in spec:
        name, share = spec["truncate"]
        data = (dest / name).read_bytes()
        (dest / name).write_bytes(data[: int(len(data) * share)])
    if "write" in spec:
        name, text = spec["write"]
        (dest / name).write_text(text)
    if "write_hex" in spec:
        name, hexa = spec["write_hex"]
        (dest / name).write_bytes(bytes.fromhex(hexa) + b"{}")
    if "config" in spec:
        cfg = json.loads((dest / "config.json").read_text())
        cfg.update(spec["config"])
        (dest / "config.json").write_text(json.dumps(cfg))
    for name in spec.get("delete", []):
        (dest / name).unlink()
    if "rename" in spec:
        old, new = spec["rename"]
        (dest / old).rename(dest / new)
    if "safetensors_shape" in spec:  # the first tensor's header declares another shape
        name, shape = spec["safetensors_shape"]
        header, body = _read_safetensors(dest / name)
        first = next(k for k in header if k != "__metadata__")
        header[first]["shape"] = shape
        _write_safetensors(dest / name, header, body)
    if "drop_tensor" in spec or "nan" in spec:
        from safetensors.torch import load_file, save_file

        name, tensor, *how = spec.get("drop_tensor") or spec["nan"]
        tensors = load_file(str(dest / name))
        if "drop_tensor" in spec:
            del tensors[tensor]
        else:
            tensors[tensor][0, 0] = float(how[0] if how else "nan")
        save_file(tensors, str(dest / name), metadata={"format": "pt"})
    if spec.get("custom_tokenizer"):  # auto_map to code in the folder that proves it ran
        (dest / "evil_tokenizer.py").write_text(
            "open('pwned.txt', 'w').write('custom code ran')\n"
            "from transformers import BertTokenizerFast\n"
            "class EvilTokenizer(BertTokenizerFast):\n    pass\n")
        cfg = json.loads((dest / "tokenizer_config.json").read_text())
        cfg.update({"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": [None, "evil_tokenizer.EvilTokenizer"]}})
        (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    if "pickle_bomb" in spec:
        (dest / spec["pickle_bomb"]).write_bytes(pickle.dumps({"weight": _Pwned()}))
    return dest


def _read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8: 8 + n]), raw[8 + n:]


def _write_safetensors(path: Path, header: dict, body: bytes) -> None:
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + body)


def _case_recipe(case: str, work: Path, tiny_checkpoint: Path, tiny_data: Path) -> Path:
    kind = case.split("/")[0]
    src = HOSTILE / case
    model, data = tiny_checkpoint, tiny_data
    if kind == "recipes":
        raw = src.read_bytes()
        if b"@" in raw:
            raw = raw.replace(b"@CKPT@", str(model).encode()).replace(b"@DATA@", str(data).encode())
        path = work / src.name
        path.write_bytes(raw)
        return path
    if kind == "data":
        data = work / "input" / src.name
        data.parent.mkdir()
        shutil.copy(src, data)
    else:
        model = _mutated_model(tiny_checkpoint, json.loads(src.read_text()), work / "input" / "model")
    path = work / "recipe.yaml"
    path.write_text(GOOD.replace("@CKPT@", str(model)).replace("@DATA@", str(data)))
    return path


@pytest.mark.parametrize("case", sorted(EXPECT))
def test_bad_input_is_one_line_exit_2(case, cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data):
    work = tmp_path / "work"
    work.mkdir()
    recipe = _case_recipe(case, work, tiny_checkpoint, tiny_data)
    monkeypatch.chdir(work)
    before = _snapshot(work)

    code, out, err = cli("run", recipe.name)

    assert code == 2, f"{case}: exit {code}\n{err}"
    assert "Traceback" not in err and "Traceback" not in out
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and len(line) < 600, err
    for needle in EXPECT[case]:
        assert needle in line, f"{case}: {needle!r} not in {line!r}"
    if case.startswith("recipes/"):  # the recipe, or the key whose value named a missing file
        named = recipe.name in line or line.startswith(("error: model.source", "error: data.dataset", "error: /"))
        assert named, f"{case}: the file is not named: {line!r}"
    assert _snapshot(work) == before, f"{case}: files were written outside artifacts/"
    assert not (work / "pwned_by_pickle").exists() and not (work / "pwned.txt").exists()
    assert not Path("/tmp/compress-escape").exists()
    for p in (work / "artifacts").rglob("*") if (work / "artifacts").exists() else []:
        assert p.name in (".lock",) or p.is_dir(), f"{case}: {p} written for a rejected input"


@pytest.mark.parametrize("case", ["recipes/cycle.yaml", "data/label_huge.tsv", "models/truncated_safetensors.json"])
def test_no_traceback_reaches_stderr_of_the_real_process(case, tmp_path, tiny_checkpoint, tiny_data):
    recipe = _case_recipe(case, tmp_path, tiny_checkpoint, tiny_data)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("COMPRESS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "compress", "run", recipe.name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


def test_absurdly_long_texts_are_truncated_not_rejected(tmp_path, tiny_checkpoint):
    """Decision: a very long text is valid input; every tokenizer call truncates it to
    max_length (training, calibration and the benchmark alike)."""
    from transformers import AutoTokenizer

    from compress.data import Data
    from compress.recipe import DataSpec
    from compress.train import encode

    rows = [("good " * 200_000, 1), ("bad", 0)] * 4
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    shutil.copy(tmp_path / "train.tsv", tmp_path / "dev.tsv")
    with open(tmp_path / "dev.tsv", "a") as fh:  # an eval split entirely of training rows is refused
        fh.write("a sentence not trained on\t0\n")
    data = Data(DataSpec(dataset=str(tmp_path)), tmp_path)
    assert max(len(t) for t in data.train.texts) > 500_000
    enc = encode(AutoTokenizer.from_pretrained(tiny_checkpoint), data.train, max_length=32)
    assert enc.lengths.max() == 32
