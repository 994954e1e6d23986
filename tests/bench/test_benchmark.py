"""compress.bench.benchmark: rounds of batch-1 timing, merged per sentence (the worker is faked)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from compress.bench import benchmark
from compress.bench.measure import Measurement, RoundTimes
from compress.recipe.schema import BenchmarkSpec


def _worker_result(ms: list[float]) -> Measurement:
    return Measurement.model_validate({
        "ok": True, "accuracy": 90.0, "size_bytes": 1e6, "sentence_ms": ms,
        "latency_ms": {"p50": ms[0], "p95": ms[0], "p99": ms[0]},
        "batches": [{"batch_size": 1, "p50_ms": ms[0], "throughput": 0.0},
                    {"batch_size": 8, "p50_ms": 99.0, "throughput": 7.0}]})


def test_merge_takes_each_sentences_median_over_rounds():
    result = _worker_result([10.0, 12.0, 14.0, 16.0])
    benchmark.merge_rounds(result, [[40.0, 42.0, 44.0, 46.0], [10.0, 12.0, 14.0, 16.0]])  # round 2 in a slow spell
    assert result.latency_ms.p50 == pytest.approx(13.0)
    assert result.latency_rounds_p50 == pytest.approx([13.0, 43.0, 13.0])
    one = next(b for b in result.batches if b.batch_size == 1)
    assert one.p50_ms == pytest.approx(13.0) and one.throughput == pytest.approx(4 / 0.052)
    assert next(b for b in result.batches if b.batch_size == 8).p50_ms == 99.0  # untouched
    assert "sentence_ms" not in result.dump()  # folded in: not cached


def test_rounds_rotate_the_order_and_outvote_a_slow_spell(tmp_path, monkeypatch):
    calls = []

    def fake_worker(job, folder, vid, device, threads, **_):
        calls.append((vid, job.latency_only))
        rnd = sum(1 for v, _ in calls if v == vid)
        ms = [50.0] * 4 if (vid == "b" and rnd == 2) else [10.0] * 4  # b is caught by a spell once
        return RoundTimes(ok=True, sentence_ms=ms) if job.latency_only else _worker_result(ms)

    monkeypatch.setattr(benchmark, "run_worker", fake_worker)
    arts = [SimpleNamespace(id=v, format="hf", path=tmp_path / v, fingerprint=v, content=v) for v in "abc"]
    data = SimpleNamespace(eval_fingerprint="f" * 16, eval=SimpleNamespace(texts=["x"], labels=[1], pairs=None))
    spec = BenchmarkSpec(devices=["cpu"], latency_rounds=3)
    results, _ = benchmark.run_benchmarks(arts, spec, data, tmp_path, {"cpu": "test"}, log=lambda s: None)

    assert calls == [("a", False), ("b", False), ("c", False),
                     ("b", True), ("c", True), ("a", True),   # round 2 starts a third along
                     ("c", True), ("a", True), ("b", True)]   # round 3 two thirds along
    b = results[("b", "cpu")]
    assert b.latency_ms.p50 == 10.0 and b.latency_rounds_p50 == [10.0, 50.0, 10.0]

    calls.clear()  # same artifacts, settings and machine: every figure comes from the cache
    again, _ = benchmark.run_benchmarks(arts, spec, data, tmp_path, {"cpu": "test"}, log=lambda s: None)
    assert calls == [] and again[("b", "cpu")].latency_ms == b.latency_ms
    assert again[("b", "cpu")].dump() == b.dump()  # the whole measurement, read back through its record


def test_a_failed_variant_sits_out_the_later_rounds(tmp_path, monkeypatch):
    calls = []

    def fake_worker(job, folder, vid, device, threads, **_):
        calls.append(vid)
        if vid == "a":
            return Measurement(ok=False, error="boom")
        return RoundTimes(ok=True, sentence_ms=[5.0]) if job.latency_only else _worker_result([5.0])

    monkeypatch.setattr(benchmark, "run_worker", fake_worker)
    arts = [SimpleNamespace(id=v, format="hf", path=tmp_path / v, fingerprint=v, content=v) for v in "ab"]
    data = SimpleNamespace(eval_fingerprint="f" * 16, eval=SimpleNamespace(texts=["x"], labels=[1], pairs=None))
    results, _ = benchmark.run_benchmarks(arts, BenchmarkSpec(devices=["cpu"], latency_rounds=2), data, tmp_path,
                                          {"cpu": "test"}, log=lambda s: None)
    assert calls == ["a", "b", "b"] and not results[("a", "cpu")].ok
    assert not (tmp_path / "a.cpu.json").exists() and (tmp_path / "b.cpu.json").exists()  # failures are not cached


def test_later_rounds_pair_every_variant_with_the_reference(tmp_path, monkeypatch):
    calls = []

    def fake_worker(job, folder, vid, device, threads, **_):
        pair = job.pair
        calls.append((vid, Path(pair.path).name if pair else None))
        rnd = sum(1 for v, _ in calls if v == vid)
        slow = 5.0 if (vid == "c" and rnd == 2) else 1.0  # a slow spell covers c's whole first pair
        own = {"a": 10.0, "b": 5.0, "c": 2.0}[vid] * slow
        if not job.latency_only:
            return _worker_result([own] * 4)
        return RoundTimes(ok=True, sentence_ms=[own] * 4, pair_sentence_ms=[10.0 * slow] * 4)

    monkeypatch.setattr(benchmark, "run_worker", fake_worker)
    arts = [SimpleNamespace(id=v, format="hf", path=tmp_path / v, fingerprint=v, content=v) for v in "abc"]
    data = SimpleNamespace(eval_fingerprint="f" * 16, eval=SimpleNamespace(texts=["x"], labels=[1], pairs=None))
    spec = BenchmarkSpec(devices=["cpu"], latency_rounds=3)
    results, _ = benchmark.run_benchmarks(arts, spec, data, tmp_path, {"cpu": "test"}, log=lambda s: None,
                                          reference="a")
    # The reference is timed alone once, then inside every pair; the others alternate with it.
    assert calls == [("a", None), ("b", None), ("c", None), ("b", "a"), ("c", "a"), ("c", "a"), ("b", "a")]
    assert results[("b", "cpu")].dump()["paired_speedup"] == {"reference": "a", "rounds": [2.0, 2.0], "speedup": 2.0}
    assert results[("c", "cpu")].paired_speedup.rounds == [5.0, 5.0]  # the spell slowed both sides
    assert len(results[("a", "cpu")].latency_rounds_p50) == 5 and results[("a", "cpu")].paired_speedup is None
    assert results[("c", "cpu")].latency_rounds_p50 == [2.0, 10.0, 2.0]

    # The reference is part of the cache key: another baseline measures everything again.
    calls.clear()
    benchmark.run_benchmarks(arts, spec, data, tmp_path, {"cpu": "test"}, log=lambda s: None, reference="b")
    assert calls[:3] == [("a", None), ("b", None), ("c", None)] and ("a", "b") in calls


def test_the_worker_does_not_import_from_the_working_folder(tmp_path, monkeypatch):
    """`python -m` puts the current folder first on the import path: a numpy.py in the folder
    the run was started from must not be what the worker imports."""
    from compress.bench.measure import BenchJob

    work = tmp_path / "work"
    work.mkdir()
    (work / "numpy.py").write_text("open('pwned_by_cwd', 'w').write('x')\nraise ImportError('shadowed numpy')\n")
    monkeypatch.chdir(work)
    bench = tmp_path / "bench"
    bench.mkdir()
    eval_file = bench / "eval.jsonl"
    eval_file.write_text('{"text": "a film", "label": 1}\n')
    job = BenchJob(format="hf", path=str(tmp_path / "no_model"), device="cpu", threads=1, batch_sizes=[1],
                   max_length=8, warmup=0, max_latency_examples=1, eval_file=str(eval_file))
    result = benchmark.run_worker(job, bench, "v", "cpu", 1)
    assert not (work / "pwned_by_cwd").exists(), "the worker imported numpy.py from the working folder"
    assert result.ok is False and "shadowed" not in result.error


def test_batch_sizes_beyond_the_eval_split_are_measured_as_the_whole_split(tmp_path, monkeypatch):
    jobs = []

    def fake_worker(job, folder, vid, device, threads, **_):
        jobs.append(job)
        return _worker_result([10.0] * 4)

    monkeypatch.setattr(benchmark, "run_worker", fake_worker)
    arts = [SimpleNamespace(id="a", format="hf", path=tmp_path / "a", fingerprint="a", content="a")]
    data = SimpleNamespace(eval_fingerprint="f" * 16, eval=SimpleNamespace(texts=["x"] * 96, labels=[1] * 96, pairs=None))
    spec = BenchmarkSpec(devices=["cpu"], latency_rounds=1, batch_sizes=[8, 100000])
    _, notes = benchmark.run_benchmarks(arts, spec, data, tmp_path, {"cpu": "test"}, log=lambda s: None)
    assert jobs[0].batch_sizes == [1, 8, 96]
    assert any("100000" in n and "measured as batch 96" in n for n in notes)


def _one_cached_variant(tmp_path, monkeypatch):
    """One variant 'a' benchmarked into tmp_path by a fake worker: (run, calls), where run()
    returns the measurements and calls lists the variants the worker measured."""
    calls = []

    def fake_worker(job, folder, vid, device, threads, **_):
        calls.append(vid)
        return _worker_result([10.0] * 4)

    monkeypatch.setattr(benchmark, "run_worker", fake_worker)
    arts = [SimpleNamespace(id="a", format="hf", path=tmp_path / "a", fingerprint="a", content="a")]
    data = SimpleNamespace(eval_fingerprint="f" * 16, eval=SimpleNamespace(texts=["x"], labels=[1], pairs=None))
    spec = BenchmarkSpec(devices=["cpu"], latency_rounds=1)
    return (lambda: benchmark.run_benchmarks(arts, spec, data, tmp_path, {"cpu": "test"}, log=lambda s: None)[0]), calls


def test_an_edited_or_malformed_cached_measurement_is_measured_again(tmp_path, monkeypatch):
    """A cached result carries a checksum of its own content: an accuracy edited to 99.9, or
    a file of another shape, is not trusted."""
    import json

    run, calls = _one_cached_variant(tmp_path, monkeypatch)
    run()
    cached = tmp_path / "a.cpu.json"
    assert "checksum" in json.loads(cached.read_text())
    run()
    assert calls == ["a"]  # intact: reused

    edited = json.loads(cached.read_text())
    edited["accuracy"] = 99.9
    cached.write_text(json.dumps(edited))
    assert run()[("a", "cpu")].quality == 90.0 and calls == ["a", "a"]

    for shape in ("[]", '"text"', '{"key": 1}', "{"):
        cached.write_text(shape)
        assert run()[("a", "cpu")].quality == 90.0
    assert len(calls) == 6


def test_a_cached_measurement_of_another_shape_is_measured_again(tmp_path, monkeypatch):
    """A cache file whose checksum and key are right but whose content is not a Measurement
    (a figure renamed, as a newer or older compress might write it) is measured again, not a
    KeyError in the decision."""
    import json

    from compress.data.artifacts import sealed

    run, calls = _one_cached_variant(tmp_path, monkeypatch)
    first = run()[("a", "cpu")]
    cached = tmp_path / "a.cpu.json"
    stored = json.loads(cached.read_text())
    assert {k: v for k, v in stored.items() if k != "checksum"} == first.dump()  # the record, as it is written
    for rename in (("accuracy", "acc"), ("latency_ms", "latency"), ("batches", "batch")):
        body = {k: v for k, v in stored.items() if k != "checksum"}
        body[rename[1]] = body.pop(rename[0])
        cached.write_text(json.dumps(sealed(body)))  # a valid checksum: only the shape is wrong
        again = run()[("a", "cpu")]
        assert again.quality == 90.0 and again.latency_ms is not None
    body = {k: v for k, v in stored.items() if k != "checksum"}
    del body["accuracy"]  # ok, yet without the figure every report reads
    cached.write_text(json.dumps(sealed(body)))
    assert run()[("a", "cpu")].quality == 90.0
    assert len(calls) == 5
    run()
    assert len(calls) == 5  # the rewritten cache is read back


def test_an_onnx_worker_runs_without_importing_torch(tiny_classifier, tiny_data, tmp_path, monkeypatch):
    """Importing torch is most of a worker's start; an ONNX variant's worker must not need it.
    A `torch` on the import path that refuses to load proves it: the ONNX worker measures,
    a torch variant's worker fails on it."""
    from compress.bench.measure import BenchJob
    from tests.stages.onnx_helpers import run_kind

    onnx_dir = tmp_path / "onnx"
    run_kind("export_onnx", {}, tiny_classifier, "hf", tiny_data, onnx_dir)
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    bench = tmp_path / "bench"
    bench.mkdir()
    eval_file = bench / "eval.jsonl"
    eval_file.write_text('{"text": "a fine film", "label": 1}\n{"text": "a dull one", "label": 0}\n')
    spec = dict(device="cpu", threads=1, batch_sizes=[1], max_length=16, warmup=0, max_latency_examples=2,
                eval_file=str(eval_file))
    onnx = benchmark.run_worker(BenchJob(format="onnx", path=str(onnx_dir), **spec), bench, "o", "cpu", 1)
    assert onnx.ok, onnx.error
    torch_job = benchmark.run_worker(BenchJob(format="hf", path=str(tiny_classifier), **spec), bench, "h", "cpu", 1)
    assert torch_job.ok is False and "torch was imported" in torch_job.error


def test_an_edited_eval_file_is_written_again_and_every_variant_measured_again(tmp_path, monkeypatch):
    """The eval rows cached in bench/ are checked against the eval split: a label edited in
    them (by hand or another tool) is neither what the next worker scores against nor a
    reason to reuse measurements that may have been taken on it."""
    run, calls = _one_cached_variant(tmp_path, monkeypatch)
    run()
    [eval_file] = tmp_path.glob("eval-*.jsonl")
    original = eval_file.read_text()
    assert '"label": 1' in original
    run()
    assert calls == ["a"]  # intact: measured before, reused
    eval_file.write_text(original.replace('"label": 1', '"label": 0'))
    run()
    assert eval_file.read_text() == original and calls == ["a", "a"]


def test_bench_files_are_never_written_through_links(tmp_path, monkeypatch):
    """The eval file, a cached measurement's temporary and the worker's job file, each a
    link to a file outside the run folder: that file stays as it was."""
    import sys

    target = tmp_path / "precious.txt"
    target.write_text("precious")
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in ("eval-" + "f" * 16 + ".jsonl", "a.cpu.part", "v.cpu.spec.json", "v.cpu.worker.json.part"):
        (bench / name).symlink_to(target)
    run, _ = _one_cached_variant(bench, monkeypatch)
    assert run()[("a", "cpu")].ok
    assert target.read_text() == "precious" and not (bench / ("eval-" + "f" * 16 + ".jsonl")).is_symlink()

    from compress.bench.measure import BenchJob

    monkeypatch.setattr(benchmark, "run_worker", _REAL_RUN_WORKER)
    # A worker that writes a failed result where the real one would: through its own writer.
    monkeypatch.setattr(benchmark, "worker_command", lambda: [sys.executable, "-c", (
        "import sys\nfrom pathlib import Path\nfrom compress.core.files import write_file\n"
        "assert Path(sys.argv[1]).read_text().startswith('{')\n"
        "write_file(Path(sys.argv[2]), '{\"ok\": false, \"error\": \"stub\"}')\n")])
    job = BenchJob(format="hf", path=str(tmp_path / "no_model"), device="cpu", threads=1, batch_sizes=[1],
                   max_length=8, warmup=0, max_latency_examples=1, eval_file=str(bench / "x.jsonl"))
    result = benchmark.run_worker(job, bench, "v", "cpu", 1)
    assert result.error == "stub" and target.read_text() == "precious"
    with pytest.raises(ValueError):  # the worker's files are named after the variant: never a path out of bench/
        benchmark.run_worker(job, bench, "../v", "cpu", 1)


_REAL_RUN_WORKER = benchmark.run_worker


def test_an_interrupted_benchmark_stops_and_reaps_its_worker(tmp_path, monkeypatch):
    """Ctrl-C, or SIGTERM (which the CLI turns into KeyboardInterrupt), while a worker runs:
    the worker is stopped and waited for before the run goes on to exit, not left running
    (Popen's own exit on KeyboardInterrupt waits a quarter second and returns), and its job
    file is removed."""
    import os
    import sys

    from compress.bench.measure import BenchJob
    from compress.bench.worker import PROGRESS_PREFIX

    pid_file = tmp_path / "worker.pid"
    monkeypatch.setattr(benchmark, "worker_command", lambda: [sys.executable, "-c", (
        "import os, sys, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"sys.stderr.write({PROGRESS_PREFIX!r} + 'started\\n'); sys.stderr.flush()\n"
        "time.sleep(120)\n")])

    def interrupt(line):
        raise KeyboardInterrupt  # as the CLI's SIGTERM handler does, mid-benchmark

    job = BenchJob(format="hf", path=str(tmp_path / "m"), device="cpu", threads=1, batch_sizes=[1],
                   max_length=8, warmup=0, max_latency_examples=1, eval_file=str(tmp_path / "x.jsonl"))
    with pytest.raises(KeyboardInterrupt):
        benchmark.run_worker(job, tmp_path, "v", "cpu", 1, log=interrupt)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # gone and reaped (a zombie would still answer)
        os.kill(pid, 0)
    assert not (tmp_path / "v.cpu.spec.json").exists()
