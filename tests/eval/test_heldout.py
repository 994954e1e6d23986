"""eval/heldout.py on runs it cannot use: one line and exit 2 without report.json; a
variant whose folder is missing, incomplete, edited or named by an id that is no folder of
the run (an edited report.json) is not scored, and the worker's files are named by position,
never by the ids the report gives."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import yaml

from tests.conftest import ROOT, tiny_recipe


@pytest.fixture
def heldout():
    spec = importlib.util.spec_from_file_location("heldout_under_test", ROOT / "eval" / "heldout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recipe(tmp_path, tiny_checkpoint, tiny_data):
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["data"]["holdout"] = {"check": 20}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_a_run_without_report_json_is_one_line_and_exit_2(heldout, tmp_path, tiny_checkpoint, tiny_data,
                                                        monkeypatch, capsys):
    recipe = _recipe(tmp_path, tiny_checkpoint, tiny_data)
    monkeypatch.setattr(sys, "argv", ["heldout.py", str(recipe), "--artifacts", str(tmp_path / "artifacts")])
    assert heldout.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no such report" in err and len(err.strip().splitlines()) == 1, err


def test_only_intact_variants_are_scored_and_ids_never_name_files(heldout, tmp_path, tiny_checkpoint, tiny_data,
                                                                 monkeypatch, capsys):
    from compress.bench import benchmark
    from compress.bench.measure import Measurement
    from compress.data.artifacts import ArtifactStore
    from compress.reports.render import write_reports
    from tests.synthetic_report import make_report, measurement

    labels = np.array([0, 1] * 10)
    res = {vid: measurement(labels, labels) for vid in ("baseline", "int8", "edited", "../../outside")}
    run_dir = tmp_path / "artifacts" / "tiny"
    store = ArtifactStore(run_dir)
    for vid in ("baseline", "edited"):
        tmp = store.begin(vid)
        (tmp / "model.safetensors").write_bytes(b"weights")
        store.commit(vid, tmp, "fp", "hf")
    (run_dir / "edited" / "model.safetensors").write_bytes(b"other weights")  # changed since the run
    write_reports(make_report(res, labels), run_dir)
    calls = []

    def fake_worker(job, folder, vid, device, threads, **_):
        calls.append((job.path, folder, vid))
        return Measurement(ok=False, error="stub")

    monkeypatch.setattr(benchmark, "run_worker", fake_worker)
    recipe = _recipe(tmp_path, tiny_checkpoint, tiny_data)
    monkeypatch.setattr(sys, "argv", ["heldout.py", str(recipe), "--artifacts", str(tmp_path / "artifacts")])
    heldout.main()
    out = capsys.readouterr().out
    assert [(path, vid) for path, _, vid in calls] == [(str(run_dir / "baseline"), "v0")], calls
    assert "int8: not scored: no output yet" in out
    assert "edited: not scored: files changed since it was written" in out
    assert "../../outside: not scored: its id names no folder of the run" in out
    assert not (tmp_path / "outside").exists() and json.loads((run_dir / "report.json").read_text())
