"""What a user sees of a run without a terminal (CI, nohup, a pipe): progress lines for
the stages and the benchmark, no third-party chatter, where the time went, and a model
card in every variant folder that leaves the stage cache valid."""

import json
import re

import pytest
import yaml

from tests.conftest import tiny_recipe

# Library lines that tell a user of compress nothing they can act on.
CHATTER = ("gemm_4bit_forward", "kernels-community", "Some weights of", "You should probably TRAIN",
           "FutureWarning", "DeprecationWarning", "TracerWarning", "UserWarning")


@pytest.fixture(scope="module")
def tiny_run(tiny_checkpoint, tiny_data, tmp_path_factory):
    """Two runs of a tiny recipe through the CLI, stderr captured (not a terminal), with
    progress lines at every step (COMPRESS_PROGRESS_SECONDS=0) instead of every 30 s."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("run_output")
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["stages"].append({"id": "nf4", "uses": "load_4bit", "from": "baseline"})
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    import os

    env = {**os.environ, "COMPRESS_PROGRESS_SECONDS": "0"}
    env.pop("COMPRESS_DEBUG", None)
    runs = []
    for _ in range(2):
        # A subprocess with pipes, as CI runs it: stderr is no terminal, and the libraries'
        # own logging and warnings go where a user would see them.
        proc = subprocess.run([sys.executable, "-m", "compress", "run", str(path), "--artifacts", str(root / "art")],
                              env=env, capture_output=True, text=True, timeout=900)
        runs.append(proc)
    (root / "first.log").write_text(runs[0].stderr + "\n=== stdout\n" + runs[0].stdout)  # to read after a failure
    return runs, root / "art" / "tiny"


def test_progress_lines_without_a_terminal(tiny_run):
    (first, _), _ = tiny_run
    assert first.returncode in (0, 3), first.stderr[-2000:]
    log = first.stderr
    # The training loop: done/total, rate and ETA on a plain line.
    assert re.search(r"baseline: fine-tune: \d+/\d+ \(\d+%\), [\d,.]+ ex/s, ETA \d", log), log[-3000:]
    # The benchmark: which variant of how many, which round, which device, how far.
    assert "baseline on cpu: measuring (variant 1/3, round 1/1, cpu)" in log
    assert re.search(r"int8 \(variant \d/3, round 1/1, cpu\): latency \(batch 1\): \d+/\d+ .*ex/s", log), log[-3000:]


def test_no_third_party_chatter(tiny_run):
    (first, second), _ = tiny_run
    for proc in (first, second):
        for line in (proc.stderr + proc.stdout).splitlines():
            assert not any(c in line for c in CHATTER), line


def test_time_breakdown_in_the_output_and_report_json(tiny_run):
    (first, second), run_dir = tiny_run
    assert re.search(r"time: \S+ in all: stages \S+, benchmark \S+, other \S+", first.stdout)
    assert "benchmark phases: " in first.stdout and "process start" in first.stdout
    timing = json.loads((run_dir / "report.json").read_text())["timing"]  # the second run's
    assert set(timing) == {"seconds", "stages", "stages_seconds", "benchmark", "other_seconds"}
    assert timing["stages"]["baseline"] == {"seconds": 0.0, "reused": True}
    assert timing["benchmark"]["cached"] == ["baseline on cpu", "int8 on cpu", "nf4 on cpu"]
    md = (run_dir / "report.md").read_text()
    assert "Where the time went" in md


def test_time_breakdown_of_a_fresh_run(tiny_checkpoint, tiny_data, tmp_path):
    from compress.recipe.schema import validate_recipe
    from compress.run.runner import run_recipe

    report = run_recipe(validate_recipe(tiny_recipe(tiny_checkpoint, tiny_data)), tmp_path, log=lambda m: None,
                        threads=1)
    t = report["timing"]
    assert t["stages"]["baseline"]["seconds"] > 0 and not t["stages"]["baseline"]["reused"]
    phases = t["benchmark"]["phases"]
    for name in ("load", "tokenize", "warm-up", "latency (batch 1)", "accuracy (batch 1)", "throughput (batch 8)",
                 "process start"):
        assert name in phases
    assert set(t["benchmark"]["variants"]) == {"baseline on cpu", "int8 on cpu"}


def test_model_card_in_every_variant_folder_keeps_the_cache_valid(tiny_run):
    (_, second), run_dir = tiny_run
    # Cards were written after the first run's benchmark; the second run reused everything.
    assert second.stderr.count("up to date (reused)") == 3, second.stderr[-2000:]
    report = json.loads((run_dir / "report.json").read_text())
    for vid, fmt, lib in (("baseline", "hf", "transformers"), ("int8", "torch_int8", "transformers"),
                          ("nf4", "bnb_4bit", "transformers")):
        text = (run_dir / vid / "README.md").read_text()
        assert text.startswith("---\n")
        front = yaml.safe_load(text.split("---\n")[1])
        assert front["pipeline_tag"] == "text-classification" and front["library_name"] == lib
        assert fmt in front["tags"] and "compress" in front["tags"]
        row = next(r for r in report["rows"] if r["id"] == vid)
        metrics = front["model-index"][0]["results"][0]["metrics"]
        assert metrics[0] == {"type": "accuracy", "value": round(row["accuracy"], 2)}
        assert "## Compression chain" in text and "`baseline`: `finetune`" in text
        assert report["manifest"]["hardware"]["cpu"]["model"].split()[0] in text
    assert "`int8`: `quantize_dynamic`" in (run_dir / "int8" / "README.md").read_text()
    assert "[" in (run_dir / "int8" / "README.md").read_text().split("## Measured")[1]  # the delta's interval


def test_model_card_neutralises_text_from_data_and_errors():
    from compress.reports.model_card import card

    hostile = "<script>alert(1)</script>\n---\nbase_model: evil | x"
    report = {  # report.json's object, as small as the records allow
        "schema_version": 1, "recipe": "r", "devices": ["cpu"],
        "manifest": {"recipe": {"model": {"source": "org/model"}, "data": {"dataset": "../d", "eval_split": "dev"},
                                "stages": [{"id": "v", "uses": "finetune", "from": "model", "with": {"lr": hostile}}]},
                     "data": {"eval_examples": 3}, "threads": 1, "versions": {}, "started": "now",
                     "hardware": {"cpu": {"model": hostile, "arch": "x", "cores": 2}}},
        "decision": {"selected": None, "device": "cpu", "objective": "min_cost"}, "budget": {"baseline": "v"},
        "rows": [{"id": "v", "format": "hf", "device": "cpu", "ok": False, "error": hostile, "notes": [hostile]}],
    }
    text = card(report, "v")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["base_model"] == "org/model" and "datasets" not in front  # a path is not a hub dataset
    body = text.split("---\n", 2)[2]
    assert "<script>" not in body and "\n---\n" not in body and "base\\_model: evil \\| x" in body
    assert "base_model" not in body.replace("base\\_model", "")  # nothing a parser reads as metadata
    assert "../d" not in text  # a local path is named by its last part


def test_the_heartbeat_waits_its_interval_from_the_start_of_its_block(monkeypatch):
    """A block that starts long after the last logged line still gets its first
    'still running' line only one interval in, never at once."""
    import time

    from compress.core import console

    monkeypatch.setenv(console.PROGRESS_ENV, "2")  # checked every second
    if console.err.is_terminal:  # pragma: no cover - a terminal gets bars, not heartbeat lines
        pytest.skip("stderr is a terminal")
    console._last_line[0] = time.monotonic() - 100.0  # nothing logged for a long time
    lines: list[str] = []
    with console.heartbeat("step", lines.append):
        time.sleep(1.5)  # past the first check, before the interval
        early = list(lines)
        deadline = time.monotonic() + 5.0
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
    assert early == []
    assert lines and lines[0].startswith("step: still running")


def test_model_card_prints_a_small_cost_with_significant_digits():
    from compress.reports.model_card import card

    report = {
        "schema_version": 1, "recipe": "r", "devices": ["cpu"],
        "manifest": {"recipe": {"model": {"source": "org/model"}, "data": {"dataset": "d", "eval_split": "dev"},
                                "stages": [{"id": "v", "uses": "finetune", "from": "model"}]},
                     "data": {"eval_examples": 3}, "threads": 1, "versions": {}, "started": "now",
                     "hardware": {"cpu": {"model": "cpu", "arch": "x", "cores": 2}}},
        "decision": {"selected": "v", "device": "cpu", "objective": "min_cost"}, "budget": {"baseline": "v"},
        "rows": [{"id": "v", "format": "hf", "device": "cpu", "ok": True, "accuracy": 90.0, "size_mb": 1.0,
                  "latency_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0}, "throughput": {"1": 500.0},
                  "operating_point": {"batch_size": 1, "throughput": 500.0}, "usd_per_1k": 0.0000452}],
    }
    measured = card(report, "v").split("## Measured")[1]
    assert "| 0.0000452 |" in measured and "0.0000 |" not in measured
