import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from compress.core.errors import RecipeError, StageError
from compress.formats import Predictor, load_predictor
from compress.formats.cascade import CascadePredictor, top_probability
from compress.recipe.schema import validate_recipe
from compress.stages.cascade import Config, choose_threshold, routing_notes, share_threshold
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


def test_share_threshold_routes_the_least_confident_share():
    conf = np.linspace(0.99, 0.5, 100)  # descending
    small = np.ones(100, bool)
    small[-5:] = False
    t, fig = share_threshold(conf, small, np.ones(100, bool), 0.2)
    assert (conf < t).sum() == 20 and fig["small_share"] == pytest.approx(0.8)
    assert fig["cascade_accuracy"] == 100.0 and fig["target_share"] == 0.2
    # ties at the cut stay with the small model whole
    t, fig = share_threshold(np.array([0.9, 0.7, 0.7, 0.6]), np.ones(4, bool), np.ones(4, bool), 0.5)
    assert t == 0.7 and fig["small_share"] == 0.75


def test_a_cascade_that_routes_nothing_or_everything_says_so():
    # max_drop met by the small member alone on calibration: nothing goes on, which a user
    # reads as a cascade that never cascades unless the run says why and what to set.
    cfg = Config(large="big", max_drop=0.2)
    (note,) = routing_notes(1.0, cfg, 0.2, "big")
    assert "no input goes on" in note and "route_share" in note
    (note,) = routing_notes(0.0, cfg, 0.2, "big")
    assert "every input goes to 'big'" in note
    assert routing_notes(0.85, cfg, 0.2, "big") == []
    # A share that was asked for, or a fixed threshold that answers everything, is the user's choice.
    assert routing_notes(1.0, Config(large="big", route_share=0.1), 0.5, "big") == []
    assert routing_notes(1.0, Config(large="big", threshold=0.5), 0.5, "big") == []


def test_one_threshold_rule_at_a_time():
    assert Config(large="x", route_share=0.15).route_share == 0.15
    for bad in ({"route_share": 0.1, "max_drop": 0.2}, {"threshold": 0.9, "route_share": 0.1},
                {"threshold": 0.9, "max_drop": 0.2}):
        with pytest.raises(ValueError, match="set one of"):
            Config(large="x", **bad)
    with pytest.raises(ValueError):
        Config(large="x", route_share=1.0)


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


def test_a_stream_queues_routed_rows_into_full_batches_for_the_large_model(tmp_path):
    """Stream mode (throughput under load): the same logits as one call per batch, but the
    large model runs on `queue_size` routed rows at a time, padded to the longest of them."""
    for name in ("s", "l"):
        (tmp_path / name).mkdir()
    rng = np.random.default_rng(0)
    small_logits = rng.normal(size=(12, 2)).astype(np.float32)
    small_logits[::2] *= 0.05  # every other row unsure
    large_logits = rng.normal(size=(12, 2)).astype(np.float32)
    small, large = Fixed(small_logits, tmp_path / "s", 1), Fixed(large_logits, tmp_path / "l", 2)
    casc = CascadePredictor(tmp_path / "c", small, large, threshold=0.8)
    lengths = rng.integers(2, 6, size=12)
    ids = np.zeros((12, 6), dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = [i] + [7] * (n - 1)
    batches = [{"input_ids": ids[i:i + 3], "attention_mask": (ids[i:i + 3] != 0).astype(np.int64)} for i in range(0, 12, 3)]
    batches = [{"input_ids": b["input_ids"], "attention_mask": np.where(np.arange(6) == 0, 1, b["attention_mask"])}
               for b in batches]  # row id 0 is a real token in column 0
    expected = [casc(b) for b in batches]
    routed = int((top_probability(small_logits) < 0.8).sum())
    large.calls.clear()
    casc.reset_counts()
    for b in batches:
        casc.submit(b, 4)
    got = casc.drain()
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)
    sizes = [len(c["input_ids"]) for c in large.calls]
    assert sum(sizes) == routed and all(n == 4 for n in sizes[:-1]) and sizes[-1] <= 4
    for call in large.calls:  # padded to the longest queued row, padding masked out
        rows = call["input_ids"][:, 0]
        assert call["input_ids"].shape[1] == lengths[rows].max()
        assert call["attention_mask"].sum(axis=1).tolist() == lengths[rows].tolist()
    assert casc.routed_share == routed / 12
    assert casc.drain() == []  # the stream starts afresh
    assert any("stream" in n for n in casc.notes)


def test_a_stream_tokenizes_queued_texts_with_the_large_members_tokenizer(tmp_path):
    for name in ("s", "l"):
        (tmp_path / name).mkdir()
    small_logits = np.array([[4.0, 0.0], [0.1, 0.0], [0.0, 3.0], [0.0, 0.1]], dtype=np.float32)  # rows 1, 3 unsure
    large_logits = np.zeros((40, 2), dtype=np.float32)
    large_logits[21] = [0.0, 5.0]
    large_logits[22] = [5.0, 0.0]
    small, large = Fixed(small_logits, tmp_path / "s", 1), Fixed(large_logits, tmp_path / "l", 2)
    small.tokenizer = Tok({"good": 1, "so": 2, "bad": 3, "film": 4})
    large.tokenizer = Tok({"good": 20, "so": 21, "bad": 22, "film": 23})
    casc = CascadePredictor(tmp_path / "c", small, large, threshold=0.8, max_length=2)
    texts = np.array(["good film", "so film", "bad film", "bad so"], dtype=object)
    for rows in ([0, 1], [2, 3]):
        casc.submit({"input_ids": np.array([[r, 4] for r in rows]), "attention_mask": np.ones((2, 2), np.int64),
                     "text": texts[rows]}, 2)
    first, second = casc.drain()
    np.testing.assert_array_equal(first[1], [0.0, 5.0])
    np.testing.assert_array_equal(second[1], [5.0, 0.0])
    assert large.tokenizer.calls == [(["so film", "bad so"], 2)]  # one call, both routed rows


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def cascade_run(tiny_checkpoint, tiny_data, tmp_path_factory):
    from compress.run.runner import run_recipe

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
    assert casc["cost_vs_large_paired"] is True and casc["cost_vs_large"] > 0  # torch members too

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


def test_a_cpu_only_large_member_is_timed_alone_on_the_cpu(cascade_run, tmp_path, monkeypatch):
    """On a GPU a cascade runs a CPU-only large member (torch INT8) on the CPU, and the
    benchmark times that member alone beside it where the cascade runs it."""
    from compress.bench import worker as bench_worker
    from compress.formats import cascade as cascade_fmt
    from compress.bench.measure import BenchJob

    _, run_dir, _ = cascade_run
    spec = json.loads((run_dir / "cascade" / "cascade.json").read_text())
    spec["small"], spec["large"] = spec["large"], spec["small"]  # hf in front of torch INT8
    for m in (spec["small"], spec["large"]):
        m["path"] = str(run_dir / m["path"])  # absolute: the folder lives outside the run
    folder = tmp_path / "swapped"
    folder.mkdir()
    (folder / "cascade.json").write_text(json.dumps(spec))
    real_member, real_load, asked = cascade_fmt.load_predictor, bench_worker._load, []
    # This machine may have no GPU: record where each part is asked for, load it on the CPU.
    monkeypatch.setattr(cascade_fmt, "load_predictor", lambda fmt, path, device, *a: real_member(fmt, path, "cpu", *a))

    def spy(job):
        asked.append((job.format, job.device))
        return real_load(job.model_copy(update={"device": "cpu"}))

    monkeypatch.setattr(bench_worker, "_load", spy)
    eval_file = next((run_dir / "bench").glob("eval-*.jsonl"))
    m = bench_worker.measure(BenchJob(format="cascade", path=str(folder), device="cuda", threads=1, batch_sizes=[1, 8],
                                      max_length=32, warmup=1, eval_file=str(eval_file)))
    assert asked == [("cascade", "cuda"), ("torch_int8", "cpu")]
    assert m.ok and [b.batch_size for b in m.large_alone] == [8] and m.large_alone[0].throughput > 0


def _context(cascade_run, out: Path, **with_):
    from compress.data.artifacts import ArtifactStore
    from compress.data.context import StageContext
    from compress.tasks.classification.data import Data

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


def test_recipe_accepts_members_with_different_tokenizers(tiny_checkpoint, tiny_data):
    # trim_vocab renumbers the vocabulary: each member of a cascade tokenizes for itself,
    # so a trimmed member in front of an untrimmed one is a valid cascade.
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["stages"] += [
        {"id": "trimmed", "uses": "trim_vocab", "from": "baseline"},
        {"id": "c", "uses": "cascade", "from": "trimmed", "with": {"large": "baseline"}},
    ]
    validate_recipe(recipe)


class Tok:
    """A tokenizer double: one id per word from its own vocabulary, padded with 0."""

    def __init__(self, vocab: dict[str, int]):
        self.vocab, self.calls = vocab, []

    def get_vocab(self):
        return dict(self.vocab)

    def __call__(self, texts, pairs=None, padding=False, return_tensors=None, truncation=False, max_length=None):
        self.calls.append((list(texts), max_length))
        ids = [[self.vocab[w] for w in t.split()][: max_length or None] for t in texts]
        width = max(len(x) for x in ids)
        arr = np.array([x + [0] * (width - len(x)) for x in ids])
        return {"input_ids": arr, "attention_mask": (arr != 0).astype(np.int64)}


def test_members_with_different_tokenizers_each_read_the_text_with_their_own(tmp_path):
    """The batch is tokenized for the small member; the routed rows are tokenized again,
    from their texts, with the large member's tokenizer inside the cascade's call."""
    for name in ("s", "l"):
        (tmp_path / name).mkdir()
    small_logits = np.array([[4.0, 0.0], [0.1, 0.0], [0.0, 3.0]], dtype=np.float32)  # row 1 is unsure
    large_logits = np.zeros((40, 2), dtype=np.float32)
    large_logits[21] = [0.0, 5.0]  # the large model's id for "so" (its own numbering)
    small, large = Fixed(small_logits, tmp_path / "s", 1), Fixed(large_logits, tmp_path / "l", 2)
    small.tokenizer = Tok({"good": 1, "so": 2, "bad": 3, "film": 4})
    large.tokenizer = Tok({"good": 20, "so": 21, "bad": 22, "film": 23, "very": 24})
    casc = CascadePredictor(tmp_path / "c", small, large, threshold=0.8, max_length=2)
    assert casc.takes_text and casc.tokenizer is small.tokenizer
    assert any("different tokenizers" in n for n in casc.notes)
    batch = {"input_ids": np.array([[0, 4], [1, 4], [2, 4]]), "attention_mask": np.ones((3, 2), np.int64),
             "text": np.array(["good film", "so film", "bad film"], dtype=object)}
    out = casc(batch)
    np.testing.assert_array_equal(out[[0, 2]], small_logits[[0, 2]])
    np.testing.assert_array_equal(out[1], [0.0, 5.0])  # looked up by the large tokenizer's id 21
    assert large.tokenizer.calls == [(["so film"], 2)]  # only the routed row, cut at max_length
    assert large.calls[0]["input_ids"].tolist() == [[21, 23]]
    assert "text" not in small.calls[0]  # token arrays only reach the members
    with pytest.raises(ValueError, match="raw"):
        casc({k: v for k, v in batch.items() if k != "text"})
    large.tokenizer = Tok(dict(small.tokenizer.vocab))
    assert not CascadePredictor(tmp_path / "c", small, large, threshold=0.8).takes_text


def test_bench_worker_gives_a_text_taking_predictor_the_texts():
    from compress.tasks.classification.task import encode as _encode
    from compress.tasks.classification.task import pad as _pad

    class P:
        tokenizer = Tok({"a": 1, "b": 2})
        tokenizer.pad_token_id = 0
        input_names = None
        takes_text = True

    enc, pad = _encode(P(), ["a b", "b"], None, 8)
    batch = _pad(enc, [1, 0], pad)
    assert batch["text"].tolist() == ["b", "a b"] and batch["input_ids"].tolist() == [[2, 0], [1, 2]]


def test_trimmed_onnx_int8_chain_in_front_of_the_baselines_onnx_int8(tiny_checkpoint, tiny_data, tmp_path):
    """The default recipe's shape: the small member has a trimmed vocabulary (its own token
    ids) and both members are ONNX INT8; the report compares the cascade with both."""
    from compress.run.runner import run_recipe

    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["stages"] = recipe["stages"][:1] + [
        {"id": "onnx", "uses": "export_onnx", "from": "baseline"},
        {"id": "onnx_int8", "uses": "quantize_onnx", "from": "onnx"},
        {"id": "trimmed", "uses": "trim_vocab", "from": "baseline"},
        {"id": "small_onnx", "uses": "export_onnx", "from": "trimmed"},
        {"id": "small_int8", "uses": "quantize_onnx", "from": "small_onnx"},
        {"id": "cascade", "uses": "cascade", "from": "small_int8",
         # threshold 1: every input goes on to the large member, re-tokenized with its own tokenizer
         "with": {"large": "onnx_int8", "calibration_examples": 64, "max_length": 32, "threshold": 1.0}},
    ]
    report = run_recipe(validate_recipe(recipe), tmp_path, log=lambda m: None, threads=1)
    spec = json.loads((tmp_path / "tiny" / "cascade" / "cascade.json").read_text())
    assert spec["small"]["format"] == spec["large"]["format"] == "onnx"
    rows = {r["id"]: r for r in report["rows"]}
    casc = rows["cascade"]
    assert casc["ok"], casc.get("error")
    assert casc["members"]["small"]["id"] == "small_int8" and casc["members"]["large"]["id"] == "onnx_int8"
    assert casc["members"]["large"]["accuracy"] == rows["onnx_int8"]["accuracy"]
    # Every row answered by the large member from its own token ids: its very predictions.
    assert casc["routed_share"] == 1.0 and casc["accuracy"] == rows["onnx_int8"]["accuracy"]
    bench = {v: json.loads((tmp_path / "tiny" / "bench" / f"{v}.cpu.json").read_text()) for v in ("cascade", "onnx_int8")}
    assert bench["cascade"]["predictions"] == bench["onnx_int8"]["predictions"]
    # The large member was also timed alone in the cascade's process, its passes alternating
    # with the cascade's, at each batch size above 1: the cost ratio reads that figure.
    alone = bench["cascade"]["large_alone"]
    assert [b["batch_size"] for b in alone] == [8] and alone[0]["throughput"] > 0
    assert "large_alone" not in bench["onnx_int8"]
    assert casc["cost_vs_large_paired"] is True
    assert casc["cost_vs_large"] == pytest.approx(casc["usd_per_1k"] / casc["large_alone_usd_per_1k"])
    assert any("timed alone in the cascade's process" in n for n in casc["notes"])
    assert any("different tokenizers" in n for n in casc["notes"])
    assert any("of the eval inputs went on to 'onnx_int8'" in n for n in casc["notes"])
    md = (tmp_path / "tiny" / "report.md").read_text()
    assert "went on to 'onnx_int8'" in md
    # The members take turns on the same cores: their ONNX sessions must not spin between
    # calls (a spinning member's threads compete with the other's), while a variant loaded
    # on its own keeps ONNX Runtime's default.
    from compress.formats import load_predictor

    casc_pred = load_predictor("cascade", tmp_path / "tiny" / "cascade", "cpu", 1, {})
    key = "session.intra_op.allow_spinning"
    for member in (casc_pred.small, casc_pred.large):
        assert member.session.get_session_options().get_session_config_entry(key) == "0"
    alone = load_predictor("onnx", tmp_path / "tiny" / "onnx_int8", "cpu", 1, {})
    with pytest.raises(RuntimeError, match="does not have configuration"):  # never set: the default
        alone.session.get_session_options().get_session_config_entry(key)
