import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from compress.errors import RecipeError, StageError
from compress.formats import Predictor, load_predictor
from compress.formats.cascade import CascadePredictor, top_probability
from compress.recipe import validate_recipe
from compress.stages.cascade import choose_threshold
from tests.conftest import tiny_recipe

# ------------------------------------------------------------------ threshold choice


def test_threshold_answers_everything_when_the_small_model_is_as_good():
    conf = np.array([0.99, 0.9, 0.8, 0.6, 0.55])
    t, fig = choose_threshold(conf, np.ones(5, bool), np.ones(5, bool), 0.5)
    assert t == 0.55 and fig["small_share"] == 1.0 and fig["cascade_accuracy"] == 100.0


def test_threshold_keeps_the_budget_relative_to_the_large_model():
    # The small model errs on its least confident rows; the large one is always right.
    conf = np.linspace(0.99, 0.5, 100)
    small = np.ones(100, bool)
    small[-10:] = False  # the 10 least confident rows are wrong
    t, fig = choose_threshold(conf, small, np.ones(100, bool), max_drop=3.0)
    # at most 3 of the 10 wrong rows may stay with the small model
    assert fig["small_share"] == pytest.approx(0.93)
    assert t == pytest.approx(conf[92])
    assert fig["large_accuracy"] - fig["cascade_accuracy"] <= 3.0
    assert ((conf >= t).mean()) == pytest.approx(fig["small_share"])
    t0, fig0 = choose_threshold(conf, small, np.ones(100, bool), max_drop=0.0)
    assert fig0["small_share"] == pytest.approx(0.90) and t0 > t


def test_threshold_never_splits_ties_and_can_route_everything():
    conf = np.array([0.9, 0.7, 0.7, 0.6])
    small = np.array([True, True, False, True])
    t, fig = choose_threshold(conf, small, np.ones(4, bool), 0.0)
    assert t == 0.9 and fig["small_share"] == 0.25  # taking one 0.7 would take both
    t, fig = choose_threshold(conf, np.zeros(4, bool), np.ones(4, bool), 0.0)
    assert fig["small_share"] == 0.0 and t > 0.9 and not (conf >= t).any()
    assert len(fig["curve"]) == 11


# ------------------------------------------------------------------ the predictor


class Fixed(Predictor):
    """Logits from a table: row i of the batch is looked up by input_ids[:, 0]."""

    def __init__(self, table: np.ndarray, path: Path, params: int):
        super().__init__(path)
        self.table, self.params, self.calls, self.tokenizer = table, params, [], None

    def __call__(self, batch):
        self.calls.append({k: v.copy() for k, v in batch.items()})
        return self.table[batch["input_ids"][:, 0]]

    def num_params(self):
        return self.params


def test_cascade_predictor_routes_unsure_rows_to_the_large_model(tmp_path):
    for name in ("s", "l"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * (10 if name == "s" else 100))
    small_logits = np.array([[4.0, 0.0], [0.1, 0.0], [0.0, 3.0], [0.0, 0.2]], dtype=np.float32)
    large_logits = np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    small, large = Fixed(small_logits, tmp_path / "s", 10), Fixed(large_logits, tmp_path / "l", 100)
    casc = CascadePredictor(tmp_path / "c", small, large, threshold=0.8)
    ids = np.array([[0, 5, 5, 0], [1, 5, 0, 0], [2, 5, 5, 5], [3, 0, 0, 0]])
    mask = (ids != 0).astype(np.int64)
    mask[:, 0] = 1
    out = casc({"input_ids": ids, "attention_mask": mask})
    conf = top_probability(small_logits)
    routed = conf < 0.8
    assert routed.tolist() == [False, True, False, True]
    np.testing.assert_array_equal(out[~routed], small_logits[~routed])
    np.testing.assert_array_equal(out[routed], large_logits[routed])
    assert casc.routed_share == 0.5
    sent = large.calls[0]
    assert sent["input_ids"][:, 0].tolist() == [1, 3]
    assert sent["input_ids"].shape[1] == 2  # trimmed to the longest routed row
    casc.reset_counts()
    assert casc.routed_share is None
    assert casc.num_params() == 110 and casc.size_bytes() == 110


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def cascade_run(tiny_checkpoint, tiny_data, tmp_path_factory):
    from compress.runner import run_recipe

    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["stages"].append({"id": "cascade", "uses": "cascade", "from": "int8",
                             "with": {"large": "baseline", "calibration_examples": 64, "max_length": 32}})
    root = tmp_path_factory.mktemp("cascade_run")
    report = run_recipe(validate_recipe(recipe), root, log=lambda m: None, threads=1)
    return report, root / "tiny", recipe


def test_cascade_end_to_end(cascade_run):
    report, run_dir, _ = cascade_run
    spec = json.loads((run_dir / "cascade" / "cascade.json").read_text())
    assert spec["small"] == {"stage": "int8", "format": "torch_int8", "path": "int8"}
    assert spec["large"] == {"stage": "baseline", "format": "hf", "path": "baseline"}
    assert 0 < spec["threshold"] <= 1.0 + 1e-9 and spec["calibration"]["examples"] == 64
    cal = spec["calibration"]
    assert cal["large_accuracy"] - cal["cascade_accuracy"] <= cal["target_drop"] + 1e-9
    assert cal["target_drop"] == pytest.approx(5.0 / 2)  # half the budget by default

    rows = {r["id"]: r for r in report["rows"]}
    casc = rows["cascade"]
    assert casc["ok"] and casc["format"] == "cascade"
    assert isinstance(casc["routed_share"], float) and 0.0 <= casc["routed_share"] <= 1.0
    assert casc["size_mb"] == pytest.approx(rows["int8"]["size_mb"] + rows["baseline"]["size_mb"])
    assert casc["verdict"] in ("selected", "within budget", "rejected")
    assert casc["delta_ci95"] is not None and casc["usd_per_1k"] is not None
    assert "routed_share" not in rows["int8"]

    for name in ("report.html", "junit.xml", "report.md", "report.json"):
        assert (run_dir / name).is_file()
    names = {(c.get("classname"), c.get("name")) for c in ET.parse(run_dir / "junit.xml").iter("testcase")}
    assert ("compress.tiny.cascade", "accuracy budget (cpu)") in names
    assert "cascade" in (run_dir / "report.html").read_text()


def test_cascade_folder_stays_valid_when_the_run_folder_moves(cascade_run, tmp_path):
    _, run_dir, _ = cascade_run
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved, ignore=shutil.ignore_patterns("bench", ".lock", ".cache", ".tmp"))
    pred = load_predictor("cascade", moved / "cascade", "cpu", 1)
    assert pred.small.path == moved / "int8" and pred.large.path == moved / "baseline"
    assert {p.parent.name for p in pred.model_files()} == {"int8", "baseline"}
    enc = pred.tokenizer(["the movie was great", "the plot was dull"], padding=True, return_tensors="np")
    logits = pred({k: v.astype(np.int64) for k, v in enc.items()})
    assert logits.shape == (2, 2) and pred.routed_share is not None


def test_cpu_only_member_loads_on_the_cpu_when_the_cascade_is_asked_for_cuda(cascade_run, tmp_path):
    """Benchmarked on a GPU, a cascade whose small member is torch INT8 (CPU kernels only)
    runs that member on the CPU rather than failing to load it."""
    from compress.formats import cascade as cascade_fmt

    _, run_dir, _ = cascade_run
    loaded = []
    real = cascade_fmt.load_predictor

    def spy(fmt, path, device, *args):
        loaded.append((fmt, device))
        return real(fmt, path, "cpu", *args)  # this machine may have no GPU: load the rest on the CPU

    cascade_fmt.load_predictor = spy
    try:
        pred = load_predictor("cascade", run_dir / "cascade", "cuda", 1)
    finally:
        cascade_fmt.load_predictor = real
    assert loaded == [("torch_int8", "cpu"), ("hf", "cuda")]
    assert pred.small.device == "cpu"


def _context(cascade_run, out: Path, **with_):
    from compress.artifacts import ArtifactStore
    from compress.context import StageContext
    from compress.data import Data

    _, run_dir, recipe = cascade_run
    recipe = {**recipe, "stages": recipe["stages"][:2] + [
        {"id": "c2", "uses": "cascade", "from": "int8", "with": {"large": "baseline", "max_length": 32, **with_}}]}
    r = validate_recipe(recipe)
    store = ArtifactStore(run_dir)
    arts = {sid: store.load(sid) for sid in ("int8", "baseline")}
    data = Data(r.data, r.base_dir)
    out.mkdir()
    return StageContext(stage_id="c2", config=r.stage("c2").config, input=arts["int8"], out=out, recipe=r,
                        refs={"large": arts[r.stage("c2").config.large]}, _data=lambda: data,
                        log=lambda m: None, threads=1)


def test_fixed_threshold_from_the_config(cascade_run, tmp_path):
    from compress.stages.cascade import run

    result = run(_context(cascade_run, tmp_path / "out", threshold=0.999, calibration_examples=32))
    assert result.threshold == 0.999 and result.calibration["threshold_from"] == "config"
    spec = json.loads((tmp_path / "out" / "cascade.json").read_text())
    assert spec["threshold"] == 0.999


def test_same_stage_twice_is_an_error(cascade_run, tmp_path):
    from compress.stages.cascade import run

    with pytest.raises(StageError, match="same stage"):
        run(_context(cascade_run, tmp_path / "out", large="int8"))


def test_recipe_checks_the_large_ref(tiny_checkpoint, tiny_data):
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["stages"].append({"id": "c", "uses": "cascade", "from": "int8", "with": {"large": "nope"}})
    with pytest.raises(RecipeError) as exc:
        validate_recipe(recipe)
    assert exc.value.key == "stages[2].with.large"
    recipe["stages"][2]["with"]["large"] = "baseline"
    recipe["stages"].append({"id": "c3", "uses": "cascade", "from": "int8", "with": {"large": "c"}})
    with pytest.raises(RecipeError) as exc:
        validate_recipe(recipe)
    assert exc.value.key == "stages[3].with.large" and "cascade" in exc.value.message
    recipe["stages"][3] = {"id": "c3", "uses": "cascade", "from": "int8", "with": {"large": "baseline", "threshold": 1.5}}
    with pytest.raises(RecipeError) as exc:
        validate_recipe(recipe)
    assert exc.value.key == "stages[3].with.threshold"


def test_recipe_refuses_members_with_different_tokenizers(tiny_checkpoint, tiny_data):
    # trim_vocab renumbers the vocabulary: a cascade tokenises once for both members, so a
    # trimmed member next to an untrimmed one is refused before anything runs.
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["stages"] += [
        {"id": "trimmed", "uses": "trim_vocab", "from": "baseline"},
        {"id": "c", "uses": "cascade", "from": "trimmed", "with": {"large": "baseline"}},
    ]
    with pytest.raises(RecipeError) as exc:
        validate_recipe(recipe)
    assert exc.value.key == "stages[3].with.large" and "different tokenizers" in exc.value.message
    # Both members below the same trim_vocab share its tokenizer: accepted.
    recipe["stages"][3] = {"id": "t_int8", "uses": "quantize_dynamic", "from": "trimmed"}
    recipe["stages"].append({"id": "c", "uses": "cascade", "from": "t_int8", "with": {"large": "trimmed"}})
    validate_recipe(recipe)
