"""Determinism (same recipe, seed and machine: same fingerprints and predictions) and
data-parallel training under `accelerate launch` (two CPU processes over gloo).

Both compare against the same single-process runs of one tiny recipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compress.recipe.schema import validate_recipe
from compress.run.runner import run_recipe
from tests.conftest import tiny_recipe


def _recipe(tiny_checkpoint, tiny_data) -> dict:
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    # Enough optimiser steps to learn the synthetic task with 2 x 16 examples per step too.
    recipe["stages"][0]["with"]["epochs"] = 4
    return recipe


def _fingerprints(run_dir: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text())["fingerprint"] for p in run_dir.glob("*/_complete.json")}


def _predictions(run_dir: Path) -> dict[str, list[int]]:
    return {p.name.split(".")[0]: json.loads(p.read_text())["predictions"] for p in run_dir.glob("bench/*.cpu.json")}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory, tiny_checkpoint, tiny_data):
    """The same recipe run twice, in two folders, in this process (1 thread)."""
    raw = _recipe(tiny_checkpoint, tiny_data)
    out = []
    for name in ("a", "b"):
        root = tmp_path_factory.mktemp(f"single-{name}")
        report = run_recipe(validate_recipe(raw), root, log=lambda m: None, threads=1)
        out.append((root / "tiny", report))
    return raw, out


def test_same_recipe_same_fingerprints_and_predictions(single_runs):
    _, [(dir_a, rep_a), (dir_b, rep_b)] = single_runs
    fp_a, fp_b = _fingerprints(dir_a), _fingerprints(dir_b)
    assert set(fp_a) == {"baseline", "int8"} and fp_a == fp_b
    pred_a, pred_b = _predictions(dir_a), _predictions(dir_b)
    assert set(pred_a) == {"baseline", "int8"} and pred_a == pred_b
    assert [(r["id"], r["accuracy"]) for r in rep_a["rows"]] == [(r["id"], r["accuracy"]) for r in rep_b["rows"]]
    # The weights themselves are bit for bit the same (result.json differs: it holds timings).
    for sid in ("baseline", "int8"):
        files_a = json.loads((dir_a / sid / "_complete.json").read_text())["files"]
        files_b = json.loads((dir_b / sid / "_complete.json").read_text())["files"]
        assert {k: v for k, v in files_a.items() if k != "result.json"} == {
            k: v for k, v in files_b.items() if k != "result.json"}, sid


def test_two_processes_under_accelerate_launch(single_runs, tmp_path):
    raw, [(single_dir, single_report), _] = single_runs
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false")
    # --multi_gpu is accelerate's torchrun launcher; with no GPU visible every process
    # trains on the CPU over gloo (`--cpu` alone starts a single process unless mpirun is used).
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), "-m", "compress", "run", "tiny.yaml"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    run_dir = tmp_path / "artifacts" / "tiny"
    # Written once, by the main process: one folder per stage, nothing left over, one report.
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == [".tmp", "baseline", "bench", "int8"]
    assert not list((run_dir / ".tmp").iterdir())
    assert proc.stderr.count("[baseline] finetune: running") == 1  # the other process prints nothing
    assert proc.stdout.count("deploy:") == 1
    report = json.loads((run_dir / "report.json").read_text())
    train = report["stages"]["baseline"]["result"]["train"]
    single_train = single_report["stages"]["baseline"]["result"]["train"]
    # Each process took half of the batches: half the optimiser steps, the same examples.
    assert train["steps"] * 2 >= single_train["steps"] and train["steps"] < single_train["steps"]

    acc = {r["id"]: r["accuracy"] for r in report["rows"]}
    single_acc = {r["id"]: r["accuracy"] for r in single_report["rows"]}
    print(f"accuracy: two processes {acc}, one process {single_acc}")
    for sid in ("baseline", "int8"):
        assert acc[sid] >= 90 and abs(acc[sid] - single_acc[sid]) <= 5, (acc, single_acc)
