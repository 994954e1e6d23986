import json

import numpy as np

from compress.bench import worker as bench_worker


def test_latency_is_the_median_of_repeated_passes(tiny_classifier, tmp_path, monkeypatch):
    # A burst of other load during one pass (here: the first pass is 30 ms slower per call)
    # must not move the percentiles when the selection is timed three times.
    from compress.formats import load_predictor

    class Slowed:
        def __init__(self, pred, slow_calls):
            self.pred, self.calls, self.slow_calls = pred, 0, slow_calls

        def __getattr__(self, name):
            return getattr(self.pred, name)

        def __call__(self, batch):
            import time

            self.calls += 1
            if self.calls <= self.slow_calls:
                time.sleep(0.03)
            return self.pred(batch)

    n, warmup = 10, 1
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"text": f"a fine film number {i}", "label": i % 2}) + "\n" for i in range(n)))
    spec = {"format": "hf", "path": str(tiny_classifier), "device": "cpu", "threads": 1, "batch_sizes": [1],
            "max_length": 32, "warmup": warmup, "max_latency_examples": n, "eval_file": str(eval_file)}
    for repeats, slowed in ((1, True), (3, False)):
        monkeypatch.setattr("compress.formats.load_predictor",
                            lambda *a, **k: Slowed(load_predictor(*a, **k), slow_calls=warmup + n))
        result = bench_worker.measure({**spec, "latency_repeats": repeats})
        assert result.ok and result.latency_ms.n == n
        assert (result.latency_ms.p50 > 30) is slowed


def test_every_full_pass_reports_its_own_accuracy(tiny_classifier, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"text": f"film {'good ' * (i % 5)}{i}", "label": i % 2}) + "\n"
                                 for i in range(12)))
    spec = {"format": "hf", "path": str(tiny_classifier), "device": "cpu", "threads": 1, "batch_sizes": [1, 4, 6],
            "max_length": 32, "warmup": 1, "max_latency_examples": 5, "eval_file": str(eval_file)}
    result = bench_worker.measure(spec)
    by_size = {b.batch_size: b for b in result.batches}
    # The headline is batch 1 over every sentence (5 timed, 7 more untimed), scored one by one.
    assert result.latency_ms.n == 5 and len(result.predictions) == 12
    assert by_size[1].quality == result.quality
    labels = [i % 2 for i in range(12)]
    assert result.quality == 100 * sum(p == y for p, y in zip(result.predictions, labels)) / 12
    from compress.formats import load_predictor

    pred = load_predictor("hf", tiny_classifier, "cpu", 1, {})
    texts = [json.loads(line)["text"] for line in eval_file.read_text().splitlines()]
    alone = [int(pred({k: np.asarray([v]) for k, v in pred.tokenizer(t, truncation=True, max_length=32).items()
                       if k in ("input_ids", "attention_mask", "token_type_ids")}).argmax(-1)[0]) for t in texts]
    assert result.predictions == alone
    assert all(0 <= by_size[b].quality <= 100 for b in (4, 6))
    # Peak device memory is a GPU figure (torch's allocator); on the CPU there is none.
    assert result.peak_memory_bytes is None and result.memory_bytes > 0
    # What the worker writes is what the parent reads: the same record through its JSON.
    from compress.bench.measure import Measurement

    again = Measurement.model_validate_json(result.dump_json())
    assert again == result and again.dump() == result.dump()
    assert set(result.dump()) >= {"accuracy", "macro_f1", "predictions", "latency_ms", "batches", "phase_seconds"}
    assert "quality" not in result.dump() and "accuracy" in result.dump()["batches"][0]


def test_a_later_round_times_the_selection_only(tiny_classifier, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"text": f"film {i}", "label": i % 2}) + "\n" for i in range(9)))
    spec = {"format": "hf", "path": str(tiny_classifier), "device": "cpu", "threads": 1, "batch_sizes": [1, 4],
            "max_length": 32, "warmup": 1, "max_latency_examples": 6, "eval_file": str(eval_file)}
    full = bench_worker.measure(spec)
    later = bench_worker.measure({**spec, "latency_only": True})
    assert len(full.sentence_ms) == 6 and set(later.dump()) == {"ok", "sentence_ms", "phase_seconds"}
    assert len(later.sentence_ms) == 6 and all(t > 0 for t in later.sentence_ms)


def test_a_paired_round_times_both_models_alternately_each_with_its_own_tokenizer(tiny_classifier, tmp_path,
                                                                                    monkeypatch):
    from compress.formats import load_predictor

    n = 2 * bench_worker.PAIR_BLOCK + 5  # three turns, the last one short
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"text": f"film {i}", "label": i % 2}) + "\n" for i in range(n)))
    order, seen_ids = [], {}

    class Recording:
        def __init__(self, pred, name):
            self.pred, self.name = pred, name

        def __getattr__(self, attr):
            return getattr(self.pred, attr)

        def __call__(self, batch):
            order.append(self.name)
            seen_ids.setdefault(self.name, []).append(batch["input_ids"])
            return self.pred(batch)

    def load(fmt, path, *a, **k):
        pred = load_predictor(fmt, path, *a, **k)
        if str(path).endswith("ref"):  # the reference speaks another vocabulary: its ids are shifted
            tok = pred.tokenizer
            shifted = lambda *x, **kw: {key: ([[i + 1 if i > 103 else i for i in ids] for ids in v]
                                             if key == "input_ids" else v) for key, v in tok(*x, **kw).items()}
            pred.tokenizer = type("Tok", (), {"__call__": staticmethod(shifted), "pad_token_id": tok.pad_token_id})()
        return Recording(pred, "ref" if str(path).endswith("ref") else "var")

    monkeypatch.setattr("compress.formats.load_predictor", load)
    import shutil

    ref = shutil.copytree(tiny_classifier, tmp_path / "ref")
    spec = {"format": "hf", "path": str(tiny_classifier), "device": "cpu", "threads": 1, "batch_sizes": [1],
            "max_length": 32, "warmup": 2, "max_latency_examples": n, "eval_file": str(eval_file),
            "latency_only": True, "pair": {"format": "hf", "path": str(ref), "options": {}}}
    result = bench_worker.measure_paired(spec)
    assert set(result.dump()) == {"ok", "sentence_ms", "pair_sentence_ms", "phase_seconds"}
    assert len(result.sentence_ms) == len(result.pair_sentence_ms) == n
    timed = order[4:]  # after two warm-up calls each
    b = bench_worker.PAIR_BLOCK
    assert timed == ["var"] * b + ["ref"] * b + ["ref"] * b + ["var"] * b + ["var"] * 5 + ["ref"] * 5  # ABBA
    var_ids, ref_ids = seen_ids["var"][2:], seen_ids["ref"][2:]
    assert any((r != v).any() for r, v in zip(ref_ids, var_ids))  # each model got its own tokenizer's ids


def test_warm_up_runs_every_shape_once():
    """Besides the first batches, the warm-up runs one batch of every other shape, so that a
    runtime that prepares kernels per shape (OpenVINO, a GPU) does it before the timed calls."""
    class Pred:
        def __init__(self):
            self.seen = []

        def __call__(self, b):
            self.seen.append(b["input_ids"].shape)

        def sync(self):
            pass

    from compress.core.task import get_task

    task = get_task("sequence-classification")
    batches = [{"input_ids": np.zeros((1, n), dtype=np.int64)} for n in (5, 3, 9, 4, 3, 9, 5)]
    pred = Pred()
    bench_worker._warm_up(task, pred, batches, 2)
    assert pred.seen == [(1, 5), (1, 3), (1, 9), (1, 4)]
    pred = Pred()
    bench_worker._warm_up(task, pred, batches[2:], 0)  # at least one call, then each new shape once
    assert pred.seen == [(1, 9), (1, 4), (1, 3), (1, 5)]
    pred = Pred()
    bench_worker._warm_up(task, pred, batches[:3], 10)  # n beyond the list: each batch once
    assert pred.seen == [(1, 5), (1, 3), (1, 9)]


def test_non_finite_logits_fail_the_variant_instead_of_scoring_it(tiny_classifier, tmp_path):
    """NaN in a classifier head makes every argmax one class, which still scores about the
    majority rate: the worker fails such a variant rather than report that accuracy."""
    import shutil

    import pytest
    from safetensors.torch import load_file, save_file

    model = tmp_path / "nan_head"
    shutil.copytree(tiny_classifier, model)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["classifier.bias"][0] = float("nan")
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"text": f"a film {i}", "label": i % 2}) + "\n" for i in range(6)))
    spec = {"format": "hf", "path": str(model), "device": "cpu", "threads": 1, "batch_sizes": [1, 4],
            "max_length": 16, "warmup": 0, "max_latency_examples": 3, "eval_file": str(eval_file)}
    with pytest.raises(ValueError, match="NaN or infinite logits for 6 of 6"):
        bench_worker.measure(spec)


def test_torch_free_workers_are_onnx_openvino_and_cascades_of_them(tmp_path):
    from compress.bench.measure import BenchJob

    def job(fmt, path=tmp_path, **kw):
        return BenchJob(format=fmt, path=str(path), device="cpu", threads=1, batch_sizes=[1], max_length=8,
                        warmup=0, eval_file=str(tmp_path / "e.jsonl"), **kw)

    assert bench_worker.torch_free(job("onnx")) and bench_worker.torch_free(job("openvino"))
    assert not bench_worker.torch_free(job("hf")) and not bench_worker.torch_free(job("torch_int8"))
    for small, large, free in (("openvino", "onnx", True), ("onnx", "hf", False)):
        folder = tmp_path / f"{small}_{large}"
        folder.mkdir()
        (folder / "cascade.json").write_text(json.dumps({"small": {"format": small, "path": "a"},
                                                         "large": {"format": large, "path": "b"}, "threshold": 0.9}))
        assert bench_worker.torch_free(job("cascade", folder)) is free
    assert not bench_worker.torch_free(job("cascade", tmp_path / "missing"))


def test_the_worker_ends_at_once_on_sigterm_or_ctrl_c_even_when_it_inherited_them_ignored(tmp_path):
    """SIGTERM or SIGINT ends a worker by the signal's default action: no KeyboardInterrupt
    raised into a runtime's call and no interpreter teardown around its running threads
    (which can crash instead of exiting), and a worker started with the signal ignored (a
    shell's background job ignores SIGINT) still stops when its run stops it. The job file
    is a FIFO here, so the worker is known to be in its main, blocked reading it."""
    import os
    import signal
    import subprocess
    import sys

    from compress.bench.benchmark import worker_command

    for sig in (signal.SIGTERM, signal.SIGINT):
        fifo = tmp_path / f"job-{sig.name}.json"
        os.mkfifo(fifo)
        proc = subprocess.Popen(
            [*worker_command(), str(fifo), str(tmp_path / "out.json")], stderr=subprocess.PIPE, text=True,
            env={**os.environ, "COMPRESS_BENCH_PARENT": str(os.getpid())},
            preexec_fn=lambda: (signal.signal(signal.SIGTERM, signal.SIG_IGN), signal.signal(signal.SIGINT, signal.SIG_IGN)))
        with open(fifo, "w") as writer:  # returns once the worker has opened the job file
            proc.send_signal(sig)
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
                writer.write("{")  # let a worker that ignored the signal go on, and end
        if code is None:
            proc.kill()
            proc.wait()
        err = proc.stderr.read()
        proc.stderr.close()
        assert code == -sig, f"{sig.name}: exit {code}: {err[-500:]}"
        assert "Traceback" not in err and not (tmp_path / "out.json").exists()
