"""Measures one variant on one device, in a fresh process (`python -m compress.bench.worker
SPEC.json OUT.json`), so every variant starts from the same state: nothing cached from
another model, the thread count fixed before the framework starts, and the artifact
reloaded from disk exactly as a deployment would.

What is timed is the task's workload (compress/tasks: for sequence classification, the
model call on a pre-tokenised, padded batch; tokenisation is the same for every variant and
left out), with device synchronisation where it applies. The job comes as a BenchJob
(compress/bench/measure.py) in SPEC.json; the result goes back as a Measurement, or as RoundTimes
for a later round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from compress.bench.measure import BatchFigures, BenchJob, Measurement, Percentiles, RoundTimes
from compress.core.task import Task, get_task

# Lines the worker writes to stderr with this prefix are progress for the parent's log
# (compress.bench.benchmark relays them); everything else on stderr is library chatter, kept
# only for the error message of a worker that dies.
PROGRESS_PREFIX = "@compress-progress "


class Phases:
    """Seconds per phase of one measurement (load, tokenize, warm-up, passes), and a plain
    progress line to stderr at least every `every` seconds while a phase runs. `step` is
    called between timed calls, never inside one."""

    def __init__(self, label: str, every: float):
        self.label, self.every = label, every
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()
        self._name, self._total, self._done, self._start = "", 0, 0, self._last

    def begin(self, name: str, total: int = 0) -> None:
        self.end()
        self._name, self._total, self._done, self._start = name, total, 0, time.perf_counter()

    def end(self) -> None:
        if self._name:
            self.seconds[self._name] = self.seconds.get(self._name, 0.0) + time.perf_counter() - self._start
            self._name = ""

    def step(self, n: int = 1) -> None:
        self._done += n
        now = time.perf_counter()
        if self.label and now - self._last >= self.every and self._done < self._total:
            from compress.core.console import progress_line

            self._last = now
            line = progress_line(f"{self.label}: {self._name}", self._done, self._total, now - self._start)
            sys.stderr.write(PROGRESS_PREFIX + line + "\n")
            sys.stderr.flush()


def _phases(job: BenchJob) -> Phases:
    return Phases(job.label, job.progress_seconds)


def _pass_figures(batch_size: int, n: int, ms: list[float], **extra) -> BatchFigures:
    """A timed pass's figures: `n` rows in batches that took `ms` each."""
    p = percentiles(ms)
    return BatchFigures(batch_size=batch_size, throughput=n / (sum(ms) / 1000.0), p50_ms=p.p50, p95_ms=p.p95,
                        p99_ms=p.p99, **extra)


def _mean_of_passes(first: list[float], second: list[float]) -> list[float]:
    """Per batch, the mean of its times in two passes over the same batches."""
    return [(a + b) / 2.0 for a, b in zip(first, second)]


def percentiles(ms: list[float]) -> Percentiles:
    """p50, p95, p99 and mean of latencies in ms, and their count."""
    a = np.asarray(ms)
    return Percentiles(p50=float(np.percentile(a, 50)), p95=float(np.percentile(a, 95)),
                       p99=float(np.percentile(a, 99)), mean=float(a.mean()), n=int(a.size))


def _load(job: BenchJob):
    from compress.formats import load_predictor

    if job.format not in ("onnx", "openvino"):  # those set their own thread count
        import torch

        torch.set_num_threads(job.threads)
    # max_length: a predictor that tokenizes inside its call (a cascade's large member) cuts
    # its inputs where the benchmark cuts everyone's.
    options = {**job.options.model_dump(exclude_unset=True), "max_length": job.max_length}
    return load_predictor(job.format, Path(job.path), job.device, job.threads, options, causal=job.lm is not None)


def _read_eval(job: BenchJob, task: Task) -> tuple[Any, np.ndarray]:
    """(the task's inputs, targets [N]) from the eval file (one JSON object per line)."""
    return task.read_eval(_eval_rows(job))


def _eval_rows(job: BenchJob) -> list[dict]:
    """The eval file's rows (one JSON object per line)."""
    return [json.loads(line) for line in Path(job.eval_file).read_text().splitlines() if line]


def _start(job: BenchJob) -> tuple[Task, Phases, Any, float]:
    """The task, the phase clock, the loaded predictor and its load time in seconds."""
    task = get_task(job.task)
    ph = _phases(job)
    ph.begin("load")
    t0 = time.perf_counter()
    pred = _load(job)
    return task, ph, pred, time.perf_counter() - t0


def _latency_selection(n_rows: int, job: BenchJob) -> list[int]:
    """The eval sentences timed one by one: an evenly spaced selection, the same for every variant."""
    n_lat = min(n_rows, int(job.max_latency_examples or n_rows))
    return np.linspace(0, n_rows - 1, n_lat).round().astype(int).tolist()


def _warm_up(task: Task, pred, batches: list[dict], n: int) -> None:
    """Untimed calls on the first `n` batches (at least one), then on one batch of every
    input shape among the rest: allocators, kernels, caches. A runtime can prepare its
    kernels for each shape on the first call of that shape: OpenVINO's CPU plugin compiles
    them (several times the call itself for a small encoder), a GPU picks kernels and grows
    its memory pool (p95/p99). A service that runs for hours pays that once per shape, so no
    timed call does."""
    calls = list(batches[: max(n, 1)])
    seen = {_shape(b) for b in calls}
    for b in batches[len(calls):]:
        if _shape(b) not in seen:
            seen.add(_shape(b))
            calls.append(b)
    for b in calls:
        task.run(pred, b)
    pred.sync()


def _shape(batch: dict) -> tuple:
    return tuple(v.shape for _, v in sorted(batch.items()))


def _timed(task: Task, pred, batch: dict) -> tuple[float, np.ndarray]:
    """One timed call of the task's workload, device work included: (ms, outputs [B, ...])."""
    start = time.perf_counter()
    outputs = task.run(pred, batch)
    pred.sync()
    return (time.perf_counter() - start) * 1000.0, outputs


# Sentences per turn when two models are timed alternately (measure_paired): long enough
# for a model's weights to be back in cache after the first call of its turn, short
# enough (0.2 s for the fp32 MiniLM baseline on 2 CPU threads) that a slow spell of the
# machine covers both. Turns of one sentence would have every call start with the other
# model's weights in the caches, which a model deployed alone never does.
PAIR_BLOCK = 20


def measure_paired(job: BenchJob | dict) -> RoundTimes:
    """A later benchmark round that times the variant and a reference (the baseline) in one
    process, alternately, PAIR_BLOCK sentences each turn, the order swapped every turn
    (ABBA). Whatever else the machine is doing then slows both about equally, so the ratio
    of their latencies is steadier than that of two separate measurements."""
    job = BenchJob.model_validate(job)
    assert job.pair is not None, "a paired round needs its reference"
    task = get_task(job.task)
    ref_job = job.model_copy(update={"format": job.pair.format, "path": job.pair.path, "options": job.pair.options})
    ph = _phases(job)
    ph.begin("load")
    preds = [_load(job), _load(ref_job)]
    inputs, targets = _read_eval(job, task)
    idx = _latency_selection(len(targets), job)
    selection = task.select(inputs, idx)  # only the selection is timed; nothing is scored here
    batches = []  # per model: the selection as batches of one, with its own tokenizer
    for pred in preds:
        ph.begin("tokenize")
        enc = task.encode(pred, selection, job.max_length)
        batches.append([task.batch(enc, [i]) for i in range(len(idx))])
        ph.begin("warm-up")
        _warm_up(task, pred, batches[-1], job.warmup)
    repeats = job.latency_repeats
    ms = np.zeros((repeats, 2, len(idx)))  # [pass, model, sentence]
    ph.begin("latency round", repeats * 2 * len(idx))
    for rep in range(repeats):
        for turn, start in enumerate(range(0, len(idx), PAIR_BLOCK)):
            for m in ((0, 1) if turn % 2 == 0 else (1, 0)):
                for i in range(start, min(start + PAIR_BLOCK, len(idx))):
                    ms[rep, m, i] = _timed(task, preds[m], batches[m][i])[0]
                    ph.step()
    ph.end()
    merged = np.median(ms, axis=0)  # [model, sentence]: per sentence, the median pass
    return RoundTimes(ok=True, sentence_ms=merged[0].tolist(), pair_sentence_ms=merged[1].tolist(),
                      phase_seconds=ph.seconds)


def measure(job: BenchJob | dict) -> Measurement | RoundTimes:
    """The first round: batch-1 latency over the selection, the task's quality at batch 1 over
    the whole eval split, throughput per batch size. A later round (`latency_only`): the
    selection's batch-1 timings alone (RoundTimes)."""
    from compress.techniques.predict import length_sorted_batches

    job = BenchJob.model_validate(job)
    task, ph, pred, load_s = _start(job)

    ph.begin("tokenize")
    inputs, targets = _read_eval(job, task)
    n_rows = len(targets)
    enc = task.encode(pred, inputs, job.max_length)
    lengths = np.array([task.size(enc, i) for i in range(n_rows)])
    warmup = job.warmup

    def timed_pass(batches: list[list[int]], phase: str, model=pred, encoded=enc,
                   warm: bool = True) -> tuple[list[float], list[np.ndarray]]:
        padded = [task.batch(encoded, b) for b in batches]
        if warm:  # warm=False: the same batches ran just before, in this process
            ph.begin("warm-up")
            _warm_up(task, model, padded, warmup)
        # A predictor that routes inputs (a cascade) counts what it routed: start the
        # count after the warm-up so that it covers exactly the timed inputs.
        if hasattr(model, "reset_counts"):
            model.reset_counts()
        ph.begin(phase, sum(len(b) for b in batches))
        times, outs = [], []
        # A cascade under load (batches above 1) is a stream: its routed rows queue into full
        # batches for the large member (formats/cascade.py). Each batch's time then holds the
        # large calls its rows set off; the last one also the queue's remainder.
        stream = hasattr(model, "submit") and max(len(b) for b in batches) > 1
        for b, batch in zip(batches, padded):
            if stream:
                start = time.perf_counter()
                model.submit(batch, len(batches[0]))
                model.sync()
                times.append((time.perf_counter() - start) * 1000.0)
            else:
                ms, out = _timed(task, model, batch)
                times.append(ms)
                outs.append(out)
            ph.step(len(b))
        if stream:
            start = time.perf_counter()
            outs = model.drain()
            model.sync()
            times[-1] += (time.perf_counter() - start) * 1000.0
        ph.end()
        return times, outs

    # A cascade's cost is judged against its large member's ($/1K, compress/decision/decide.py), so
    # that member is timed alone here as well, its throughput passes alternating with the
    # cascade's (cascade, member, member, cascade): both figures then come from the same
    # minutes of the machine. Taken from their own rows, measured in processes minutes apart,
    # the ratio moved by 10% and more between runs on a shared CPU.
    alone_pred = None
    if getattr(pred, "large_source", None) is not None and any(bs > 1 for bs in job.batch_sizes):
        fmt, folder = pred.large_source
        ph.begin("load")
        # On the device the cascade runs it on (a CPU-only member stays on the CPU).
        alone_pred = _load(job.model_copy(update={"format": fmt, "path": str(folder), "device": pred.large.device}))
        ph.begin("tokenize")
        alone_enc = task.encode(alone_pred, inputs, job.max_length)
        alone_lengths = np.array([task.size(alone_enc, i) for i in range(n_rows)])

    # Batch 1: latency percentiles over real eval sentences (an evenly spaced selection).
    lat_idx = _latency_selection(n_rows, job)
    n_lat = len(lat_idx)
    passes = [timed_pass([[i] for i in lat_idx], "latency (batch 1)") for _ in range(job.latency_repeats)]
    lat_ms = np.median(np.array([t for t, _ in passes]), axis=0).tolist()  # [n_lat]: per sentence, the median pass
    if job.latency_only:  # a later benchmark round (compress.bench.benchmark): the timings alone
        return RoundTimes(ok=True, sentence_ms=lat_ms, phase_seconds=ph.seconds)
    latency = percentiles(lat_ms)

    # Quality is scored at batch 1, one request at a time as a latency-bound service runs:
    # a sentence's label then never depends on its neighbours (dynamic quantization scales
    # activations over the whole padded batch). The latency passes scored the selection;
    # the other sentences run once more, untimed. Outputs [N, ...] (classification: logits [N, C]).
    first = passes[0][1][0]
    outputs = np.zeros((n_rows, *first.shape[1:]), dtype=np.float32)
    outputs[lat_idx] = np.concatenate(passes[0][1])
    rest = sorted(set(range(n_rows)) - set(lat_idx))
    routed_share = getattr(pred, "routed_share", None)  # a cascade: share sent to its large model
    if rest:
        outputs[rest] = np.concatenate(timed_pass([[i] for i in rest], f"{task.metric.name} (batch 1)")[1])
        if routed_share is not None:  # over the selection, then over the rest: weigh by rows
            routed_share = (routed_share * len(lat_idx) + pred.routed_share * len(rest)) / n_rows
    task.check(outputs)
    predictions = task.predictions(outputs)
    quality = task.quality(predictions, targets)

    batches_out, large_alone = [], []
    for bs in sorted(set(job.batch_sizes) | {1}):
        if bs == 1:
            times, n, waste, q = lat_ms, n_lat, 0.0, quality
        else:
            batches = length_sorted_batches(lengths, bs)
            times, outs = timed_pass(batches, f"throughput (batch {bs})")
            if alone_pred is not None:
                alone_batches = length_sorted_batches(alone_lengths, bs)
                phase = f"large member alone (batch {bs})"
                member = [timed_pass(alone_batches, phase, alone_pred, alone_enc, warm=w)[0] for w in (True, False)]
                again = timed_pass(batches, f"throughput (batch {bs})", warm=False)[0]
                times = _mean_of_passes(times, again)
                large_alone.append(_pass_figures(bs, n_rows, _mean_of_passes(*member)))
            n = n_rows
            real = sum(int(lengths[b].sum()) for b in batches)
            waste = 1.0 - real / sum(int(lengths[b].max()) * len(b) for b in batches)
            batch_outputs = np.zeros_like(outputs)
            for b, o in zip(batches, outs):
                batch_outputs[b] = o
            task.check(batch_outputs)
            q = task.quality(task.predictions(batch_outputs), targets)
        entry = _pass_figures(bs, n, times, padding_waste=waste, quality=q)  # q: over the whole eval split
        if routed_share is not None:
            entry.routed_share = routed_share if bs == 1 else pred.routed_share
        batches_out.append(entry)

    m = Measurement(
        ok=True,
        device=job.device,
        threads=job.threads,
        load_seconds=load_s,
        size_bytes=pred.size_bytes(),
        params=pred.num_params(),
        memory_bytes=pred.memory_bytes(),
        peak_memory_bytes=pred.peak_memory_bytes(),
        quality=quality,
        **task.secondary_scores(predictions, targets),
        predictions=predictions.astype(int).tolist(),
        latency_ms=latency,
        sentence_ms=lat_ms,  # [n_lat] batch-1 latency per timed sentence, for merging rounds
        batches=batches_out,
        notes=pred.notes,
        effective_device=getattr(pred, "effective_device", job.device),
    )
    if routed_share is not None:
        m.routed_share = routed_share
    if large_alone:
        m.large_alone = large_alone
    m.phase_seconds = ph.seconds  # where the measurement's time went (report.json `timing`)
    return m


def measure_lm(job: BenchJob) -> Measurement:
    """A causal LM: the task scores every eval (perplexity, multiple choice, summarisation)
    and times generation (compress/tasks/causal_lm/task.py); the generic figures are then read
    from those: quality is perplexity, batch-1 latency the time per output token, and each
    batch size's throughput its decode tokens/s."""
    assert job.lm is not None
    task, ph, pred, load_s = _start(job)
    figures = task.measure_lm(pred, _eval_rows(job), job.lm, ph)
    ph.end()
    ppl = next(e for e in figures.evals if e.name == "perplexity")
    batches = [BatchFigures(batch_size=g.batch_size, throughput=g.decode_tokens_per_s, p50_ms=g.tpot_ms,
                            p95_ms=g.tpot_ms if g.batch_size > 1 else figures.tpot_ms["p95"])
               for g in figures.generation]
    return Measurement(
        ok=True, device=job.device, threads=job.threads, load_seconds=load_s,
        size_bytes=pred.size_bytes(), params=pred.num_params(), memory_bytes=pred.memory_bytes(),
        peak_memory_bytes=pred.peak_memory_bytes(), quality=ppl.value,
        latency_ms=Percentiles(**figures.tpot_ms), batches=batches, notes=pred.notes,
        effective_device=getattr(pred, "effective_device", job.device), phase_seconds=ph.seconds, lm=figures,
    )


def _die_with_parent() -> None:
    """On Linux the kernel kills this worker when the run that started it dies, whatever
    killed that (SIGTERM, SIGKILL, an OOM kill), so no worker keeps writing into bench/
    after its run is gone. Set here rather than in a preexec_fn (Python code between fork
    and exec, which a Ctrl-C to the process group can interrupt); a parent that died before
    this line is caught by comparing the parent pid with the one the run passed."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl: the run's SIGTERM handler still stops it
        return
    parent = os.environ.get("COMPRESS_BENCH_PARENT", "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


# Formats whose predictor runs without torch: their worker tells transformers (which it
# still needs for the tokenizer) not to import torch, which takes about as long as the rest
# of the worker's start (seconds per variant, a quarter of a CPU benchmark of small models).
TORCH_FREE_FORMATS = ("onnx", "openvino")


def torch_free(job: BenchJob) -> bool:
    """Whether the job's worker can run without importing torch (a cascade: both members)."""
    if job.pair is not None or job.lm is not None:
        return False
    if job.format == "cascade":
        from compress.formats.cascade import read_spec

        try:
            spec = read_spec(Path(job.path))
            return all(spec[role]["format"] in TORCH_FREE_FORMATS for role in ("small", "large"))
        except (OSError, ValueError, KeyError, TypeError):  # the loader reports a broken folder
            return False
    return job.format in TORCH_FREE_FORMATS


def _default_signals() -> None:
    """SIGTERM and SIGINT end the worker at once, by the kernel's default action. Python's
    own SIGINT handling would raise KeyboardInterrupt in the middle of a runtime's call
    (onnxruntime, OpenVINO, torch, with their thread pools running) and then tear the
    interpreter down around them, which can crash instead of exiting; and a worker that
    inherited either signal ignored (a shell's background job ignores SIGINT) would not stop
    when its run stops it.
    Nothing is lost: the result is written atomically (an interrupted worker leaves none)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def main() -> None:
    _default_signals()
    _die_with_parent()
    job_path, out_path = sys.argv[1], sys.argv[2]
    job: BenchJob | None = None
    failure: Exception | None = None
    try:
        job = BenchJob.model_validate_json(Path(job_path).read_text())
    except Exception as exc:  # reported below as a failed variant
        failure = exc
    if job is not None and torch_free(job):
        os.environ["USE_TORCH"] = "0"  # read by transformers when it is first imported
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"  # its "no PyTorch found" notice
    from compress.core.console import quiet_libraries

    quiet_libraries()  # before any library loads: its warnings would end up as a dead worker's error
    from compress.data.sources import never_prompt

    never_prompt()  # a folder with custom code is an error here, never a question on stdin
    result: Measurement | RoundTimes
    try:
        if failure is not None:
            raise failure
        assert job is not None
        result = measure_paired(job) if job.pair else measure_lm(job) if job.lm is not None else measure(job)
    except Exception as exc:  # reported as a failed variant, not a failed run
        if os.environ.get("COMPRESS_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result = Measurement(ok=False, error=f"{exc.__class__.__name__}: {first}"[:300])
    from compress.core.files import write_file

    write_file(Path(out_path), result.dump_json())


if __name__ == "__main__":
    main()
