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

import numpy as np
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

    from compress.tasks.classification.data import Data
    from compress.recipe.schema import DataSpec
    from compress.techniques.predict import encode

    rows = [("good " * 200_000, 1), ("bad", 0)] * 4
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    shutil.copy(tmp_path / "train.tsv", tmp_path / "dev.tsv")
    with open(tmp_path / "dev.tsv", "a") as fh:  # an eval split entirely of training rows is refused
        fh.write("a sentence not trained on\t0\n")
    data = Data(DataSpec(dataset=str(tmp_path)), tmp_path)
    assert max(len(t) for t in data.train.texts) > 500_000
    enc = encode(AutoTokenizer.from_pretrained(tiny_checkpoint), data.train, max_length=32)
    assert enc.lengths.max() == 32


# ---------------------------------------------------------------------------------------
# Second round (issue 26): faults the corpus above cannot express as one file.


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and len(line) < 600, line
    return line


def _recipe_file(folder: Path, tiny_checkpoint: Path, tiny_data: Path) -> Path:
    path = folder / "recipe.yaml"
    path.write_text(GOOD.replace("@CKPT@", str(tiny_checkpoint)).replace("@DATA@", str(tiny_data)))
    return path


def test_a_stage_output_with_nan_weights_is_not_committed(cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data):
    """A stage whose output holds non-finite weights (diverged training) fails with one line
    and leaves nothing a later run would reuse."""
    import dataclasses

    from compress.run import runner

    real = runner.get_stage

    def poisoned(name):
        kind = real(name)
        if name != "finetune":
            return kind

        def run(ctx):
            from safetensors.torch import load_file, save_file

            result = kind.run(ctx)
            tensors = load_file(str(ctx.out / "model.safetensors"))
            tensors["classifier.weight"][0, 0] = float("nan")
            save_file(tensors, str(ctx.out / "model.safetensors"), metadata={"format": "pt"})
            return result

        return dataclasses.replace(kind, run=run)

    monkeypatch.setattr(runner, "get_stage", poisoned)
    recipe = _recipe_file(tmp_path, tiny_checkpoint, tiny_data / "train.tsv")
    recipe.write_text(recipe.read_text().replace(str(tiny_data / "train.tsv"), str(tiny_data)))
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run", recipe.name)
    assert code == 2, err
    line = _one_line(err)
    assert "[baseline] finetune" in line and "NaN or infinite weights" in line and "classifier.weight" in line
    assert not (tmp_path / "artifacts" / "hostile" / "baseline").exists()


def test_report_json_never_holds_nan_or_infinity(tmp_path):
    from compress.reports.render import write_reports
    from tests.synthetic_report import make_report, measurement

    labels = np.array([0, 1] * 50)
    report = make_report({"baseline": measurement(labels, labels), "int8": measurement(labels, labels)}, labels)
    report["rows"][1]["speedup_vs_baseline"] = float("inf")
    report["rows"][1]["usd_per_1k"] = float("nan")
    write_reports(report, tmp_path)

    def refuse(token):
        raise AssertionError(f"report.json holds {token}")

    parsed = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)
    assert parsed["rows"][1]["speedup_vs_baseline"] is None and parsed["rows"][1]["usd_per_1k"] is None


@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, "{a: " * 3000 + "1" + "}" * 3000])
def test_a_deeply_nested_set_value_is_one_line(cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data, value):
    recipe = _recipe_file(tmp_path, tiny_checkpoint, tiny_data)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("validate", recipe.name, "--set", f"data.seed={value}")
    assert code == 2, err
    assert "nested too deeply" in _one_line(err)


def test_artifacts_pointing_at_a_file_is_one_line(cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data):
    recipe = _recipe_file(tmp_path, tiny_checkpoint, tiny_data)
    (tmp_path / "a_file").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run", recipe.name, "--artifacts", "a_file")
    assert code == 2, err
    assert "--artifacts" in _one_line(err) and "is a file" in _one_line(err)


def _valid_report(folder: Path) -> Path:
    from tests.synthetic_report import make_report, measurement, write_run

    labels = np.array([0, 1] * 50)
    res = {"baseline": measurement(labels, labels), "int8": measurement(labels, labels)}
    return write_run(folder, make_report(res, labels), res, labels)


@pytest.mark.parametrize("edit", [
    lambda r: r.update(rows=[1, 2]),
    lambda r: r.update(rows="rows"),
    lambda r: r["rows"][0].pop("latency_ms"),
    lambda r: r["rows"][0].update(accuracy="high"),
    lambda r: r.update(decision=[]),
    lambda r: r["decision"].pop("device"),
    lambda r: r.update(manifest={"threads": "two"}),
    lambda r: r["budget"].update(max_accuracy_drop=None),
    lambda r: r["rows"][1].update(delta_ci95=[1]),
])
def test_a_malformed_report_json_is_one_line_for_report_gate_and_compare(cli, tmp_path, edit):
    good = _valid_report(tmp_path / "good")
    bad = _valid_report(tmp_path / "bad")
    report = json.loads((bad / "report.json").read_text())
    edit(report)
    (bad / "report.json").write_text(json.dumps(report))
    for args in (("report", bad), ("gate", bad, "--variant", "int8"), ("compare", good, bad), ("compare", bad, good)):
        code, _, err = cli(*args)
        assert code == 2, f"{args[0]}: exit {code}\n{err}"
        assert "malformed report.json" in _one_line(err)


@pytest.mark.parametrize("edit,problem", [
    (lambda r: r["rows"][1]["latency_ms"].update(p50=float("nan")), "rows.1.latency_ms.p50 is not a finite number"),
    (lambda r: r["rows"][0].update(accuracy=float("inf")), "rows.0.accuracy is not a finite number"),
    (lambda r: r["rows"][1].update(delta_ci95=[float("-inf"), 1.0]), "rows.1.delta_ci95.0 is not a finite number"),
    (lambda r: r.update(task={"name": "causal-lm"}), "schema_version 1 does not match its content: task (causal-lm)"),
    (lambda r: r["rows"][1].update(examples_to_pass=500), "rows.1.examples_to_pass first appears in schema 5"),
])
def test_a_forged_report_json_is_one_line_for_report_gate_and_compare(cli, tmp_path, edit, problem):
    """A NaN or an infinity (compress writes null for those) or a field newer than the
    report's schema_version: put there by hand or by another tool, never trusted."""
    good = _valid_report(tmp_path / "good")
    bad = _valid_report(tmp_path / "bad")
    report = json.loads((bad / "report.json").read_text())
    edit(report)
    (bad / "report.json").write_text(json.dumps(report))  # json writes NaN, Infinity, -Infinity
    for args in (("report", bad), ("gate", bad, "--variant", "int8"), ("compare", good, bad), ("compare", bad, good)):
        code, _, err = cli(*args)
        assert code == 2, f"{args[0]}: exit {code}\n{err}"
        assert problem in _one_line(err)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder", "huge"])
def test_a_recipe_that_is_not_a_small_regular_file_is_refused_without_reading_it(cli, tmp_path, monkeypatch, kind):
    """A FIFO (reading it would wait for a writer forever), /dev/zero (endless), a folder, or a
    file too large to be a recipe: one line, at once."""
    path = tmp_path / "recipe.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path = Path("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_text("# padding\n" * 200_000)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("validate", str(path))
    assert code == 2, err
    line = _one_line(err)
    assert str(path) in line and ("regular file" in line or "folder" in line or "too large" in line)


def test_a_huge_value_does_not_become_a_huge_error_line(cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data):
    recipe = _recipe_file(tmp_path, tiny_checkpoint, tiny_data)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("validate", recipe.name, "--set", "name=" + "x" * 50_000_000)
    assert code == 2, err
    line = _one_line(err)
    assert line.startswith("error: recipe.yaml: name:") and "characters left out" in line


def test_control_and_bidi_characters_in_an_error_are_escaped(cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data):
    recipe = _recipe_file(tmp_path, tiny_checkpoint, tiny_data)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("validate", recipe.name, "--set", 'stages[0].id="ok\\u202etxt.exe\\e[31m\\a"')  # YAML escapes
    assert code == 2, err
    line = _one_line(err)
    assert "\u202e" not in err and "\x1b" not in err and "\x07" not in err
    assert "\\u202e" in line and "\\u001b" in line


def test_an_artifacts_folder_inside_the_model_folder_is_not_part_of_the_model(tmp_path, tiny_classifier):
    """A run folder inside the model folder changes neither the model's fingerprint (stages
    would never be reused) nor its size (it would count the run's own outputs)."""
    from compress.formats import load_predictor
    from compress.data.sources import WEIGHT_SUFFIXES, fingerprint_files

    model = tmp_path / "model"
    shutil.copytree(tiny_classifier, model)
    before = fingerprint_files(model, WEIGHT_SUFFIXES)
    size = load_predictor("hf", model, "cpu", 1).size_bytes()
    run = model / "artifacts" / "tiny"
    (run / "baseline").mkdir(parents=True)
    (run / ".lock").write_text("1")
    shutil.copy(model / "model.safetensors", run / "baseline" / "model.safetensors")
    (run / "baseline" / "_complete.json").write_text("{}")
    (run / "bench").mkdir()
    (run / "bench" / "baseline.cpu.json").write_text("{}")
    assert fingerprint_files(model, WEIGHT_SUFFIXES) == before
    assert load_predictor("hf", model, "cpu", 1).size_bytes() == size


def test_report_writers_escape_hostile_text(tmp_path):
    """Error text and notes can quote a user's file: each report escapes it for its format,
    and every file still parses."""
    import html.parser
    import xml.etree.ElementTree as ET

    from compress.reports.render import write_reports
    from tests.synthetic_report import make_report, measurement

    hostile = "<img src=x onerror=alert(1)> & <script>x</script> | ] \x00\x07\x1b[31m \u202e \ud800 end"
    labels = np.array([0, 1] * 50)
    res = {"baseline": measurement(labels, labels), "int8": measurement(labels, labels),
           "broken": {"ok": False, "error": hostile}}
    report = make_report(res, labels)
    report["notes"].append(hostile)
    report["decision"]["notes"].append(hostile)
    report["rows"][1]["notes"] = [hostile]
    write_reports(report, tmp_path)

    md = (tmp_path / "report.md").read_text()
    assert "<img" not in md and "<script" not in md and "&lt;img src=x onerror=alert(1)&gt;" in md
    assert "\x00" not in md and "\x1b" not in md and "\u202e" not in md
    root = ET.fromstring((tmp_path / "junit.xml").read_text().encode())  # parses: no control characters
    messages = " ".join(el.get("message", "") for el in root.iter())
    assert "<img src=x onerror=alert(1)>" in messages  # the text survives, escaped by the XML writer
    page = (tmp_path / "report.html").read_text()
    assert "<img src=x" not in page and "<script>x" not in page
    html.parser.HTMLParser().feed(page)
    json.loads((tmp_path / "report.json").read_text())


@pytest.mark.parametrize("where", ["model", "data"])
def test_a_symlink_loop_is_not_reported_as_a_missing_file(cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data, where):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    recipe = _recipe_file(tmp_path, loop if where == "model" else tiny_checkpoint, loop if where == "data" else tiny_data)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run", recipe.name)
    assert code == 2, err
    line = _one_line(err)
    assert "symlink loop" in line and "no such" not in line


def test_cuda_as_the_only_device_is_refused_at_validation_without_a_gpu(cli, tmp_path, monkeypatch, tiny_checkpoint, tiny_data):
    from compress.recipe.schema import gpu_present

    recipe = _recipe_file(tmp_path, tiny_checkpoint, tiny_data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no device visible, whatever the machine
    assert not gpu_present()
    code, _, err = cli("validate", recipe.name, "--set", "benchmark.devices=[cuda]")
    assert code == 2, err
    assert "benchmark.devices" in _one_line(err) and "no NVIDIA GPU" in _one_line(err)
    code, _, err = cli("validate", recipe.name, "--set", "benchmark.devices=[cpu, cuda]")
    assert code == 0, err  # cuda is skipped with a note when cpu is listed too
