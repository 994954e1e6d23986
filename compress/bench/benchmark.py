"""Benchmarks every variant on every available device, each in a fresh process
(compress/bench/worker.py), and caches the measurements: a variant whose artifact,
benchmark settings, eval data and machine are unchanged is not measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from compress.core.console import heartbeat, progress_seconds
from compress.core.files import file_sha256, real_folder, write_file
from compress.data.artifacts import digest, is_sealed, sealed
from compress.formats import CPU_ONLY
from compress.bench.measure import BenchJob, JobOptions, Measurement, PairedSpeedup, PairRef, RoundTimes
from compress.core.task import DEFAULT_TASK, get_task

# What a measurement means (bench_worker): bumped when that changes, so that measurements
# cached under the old meaning are taken again. 2: accuracy scored at batch 1. 3: batch-1
# latency is the median over rounds (BenchmarkSpec.latency_rounds). 4: later rounds time each
# variant alternately with the baseline in one process, and speed-ups against the baseline
# come from those paired rounds. 5: the warm-up runs every input shape once (OpenVINO compiles
# kernels per shape on its first call). 6: a cascade's throughput passes alternate with its
# large member's alone, in one process (Measurement.large_alone), and are the mean of two.
# 7: a causal LM's measurement carries its roofline (the machine's limits measured in the worker).
METHOD = 7

if TYPE_CHECKING:  # pragma: no cover
    from compress.data.artifacts import Artifact
    from compress.tasks.classification.data import Data
    from compress.tasks.causal_lm.records import LMSpec
    from compress.recipe.schema import BenchmarkSpec


@dataclass
class BenchTiming:
    """Where this run's benchmark time went: per variant and device, the seconds of each
    phase of its measurement (load, tokenize, warm-up, latency, accuracy, throughput per
    batch size, later latency rounds, process start). Cached measurements cost nothing."""

    variants: dict[str, dict[str, float]] = field(default_factory=dict)  # "id on device" -> {phase: s}
    cached: list[str] = field(default_factory=list)  # "id on device" reused from the cache

    def add(self, key: str, result: Measurement | RoundTimes, rounds: bool = False) -> None:
        phases = self.variants.setdefault(key, {})
        wall = float(result.wall_seconds or 0.0)
        if rounds:  # a later round's worker: one figure, loading and warm-up included
            phases["latency rounds"] = phases.get("latency rounds", 0.0) + wall
            return
        own = {k: float(v) for k, v in result.phase_seconds.items()}
        for name, sec in own.items():
            phases[name] = phases.get(name, 0.0) + sec
        phases["process start"] = phases.get("process start", 0.0) + max(wall - sum(own.values()), 0.0)

    def seconds(self, key: str) -> float:
        return sum(self.variants.get(key, {}).values())

    def phase_totals(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for phases in self.variants.values():
            for name, sec in phases.items():
                totals[name] = totals.get(name, 0.0) + sec
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def write_eval_file(data: "Data", folder: Path, task: str = DEFAULT_TASK) -> Path:
    """The eval split as the worker reads it: one JSON object per example, the task's columns."""
    return _eval_file(data, folder, task)[0]


def _eval_file(data: "Data", folder: Path, task: str) -> tuple[Path, bool]:
    """(the eval file, whether one was there with other content). A file kept from an earlier
    run is reused only while it holds exactly the eval split's rows, checked against its
    sha256: its name carries the data's fingerprint, but a file edited since (a label
    changed by hand or by another tool) would have variants scored on labels the data does
    not have. Such a file is written again."""
    path = real_folder(folder) / f"eval-{data.eval_fingerprint[:16]}.jsonl"
    lines = [json.dumps(row, ensure_ascii=False) for row in get_task(task).eval_rows(data.eval)]
    body = ("\n".join(lines) + "\n").encode("utf-8")
    kept = path.is_file() and not path.is_symlink()
    if kept and file_sha256(path) == hashlib.sha256(body).hexdigest():
        return path, False
    write_file(path, body)
    return path, kept


def run_benchmarks(
    variants: list["Artifact"],
    spec: "BenchmarkSpec",
    data: "Data",
    folder: Path,
    machine: dict,
    log: Callable[[str], None],
    force: bool = False,
    reference: str | None = None,
    trust_remote_code: bool = False,
    timing: BenchTiming | None = None,
    task: str = DEFAULT_TASK,
    lm: "LMSpec | None" = None,
) -> tuple[dict[tuple[str, str], Measurement], list[str]]:
    """{(variant id, device): measurement}, and notes (such as a skipped device).
    `reference`: the variant that later rounds pair every other variant with (the budget's
    baseline); each paired measurement gets `paired_speedup` against it. `timing`, when
    given, collects where the time went."""
    timing = timing if timing is not None else BenchTiming()
    notes = []
    devices = []
    for d in dict.fromkeys(spec.devices):
        if d == "cuda" and not cuda_available():
            notes.append("cuda: no GPU present; GPU benchmark skipped")
            continue
        devices.append(d)
    eval_file, edited = _eval_file(data, folder, task)
    if edited and not force:
        # Measurements cached beside it may have been scored on the edited rows.
        log(f"  {eval_file.name}: differs from the eval split (edited since it was written); written again, "
            f"and every variant measured again")
        force = True
    results: dict[tuple[str, str], Measurement] = {}
    causal = lm is not None
    # A batch larger than the eval split is the whole split: measured (and reported) as that.
    # A causal LM's batches are of generated sequences (lm.timing.batch_sizes).
    n_eval = 0 if causal else len(data.eval.texts)
    batch_sizes = (sorted({1, *lm.timing.batch_sizes}) if causal
                   else sorted({1, *(min(b, n_eval) for b in spec.batch_sizes)}))
    over = [] if causal else sorted(b for b in spec.batch_sizes if b > n_eval)
    if causal and spec.latency_rounds > 1:
        notes.append("causal LMs are timed in one benchmark round (benchmark.latency_rounds applies to classifiers)")
    if over:
        notes.append(f"benchmark.batch_sizes {', '.join(map(str, over))} exceed the eval split's {n_eval} sentences; "
                      f"measured as batch {n_eval}")
    for device in devices:
        # Speed-ups compare variants with each other, so on one device either every variant
        # comes from the cache or every variant is measured again now: latencies taken in
        # different sessions differ with the machine's load (10-20% here between runs),
        # which a cached baseline would pass on to every ratio.
        jobs = []
        for art in variants:
            if device != "cpu" and art.format in CPU_ONLY:
                notes.append(f"{art.id}: not benchmarked on {device}: {CPU_ONLY[art.format]}")
                continue
            job = BenchJob(
                format=art.format, path=str(art.path), device=device,
                threads=spec.threads, batch_sizes=batch_sizes, max_length=spec.max_length,
                warmup=spec.warmup, max_latency_examples=spec.max_latency_examples,
                latency_repeats=spec.latency_repeats,
                eval_file=str(eval_file),
                options=JobOptions(cuda_dtype=spec.cuda_dtype, trust_remote_code=trust_remote_code),
                task=task, lm=lm,
            )
            key = digest({
                "method": METHOD, "rounds": spec.latency_rounds, "reference": reference,
                "artifact": art.fingerprint, "content": art.content,
                "job": job.cache_identity(), "eval": data.eval_fingerprint, "machine": machine,
            })
            cached = None if force else cached_measurement(folder / f"{art.id}.{device}.json", key)
            jobs.append((art, job, key, cached))
        if jobs and all(cached is not None for *_, cached in jobs):
            for art, _, _, cached in jobs:
                log(f"  {art.id} on {device}: measured before (cached)")
                results[(art.id, device)] = cached
                timing.cached.append(f"{art.id} on {device}")
            continue
        if any(cached is not None for *_, cached in jobs):
            log(f"  {device}: measuring every variant again, so that speed-ups come from one session")
        measured: dict[str, Measurement] = {}
        for k, (art, job, _, _) in enumerate(jobs, 1):
            where = f"variant {k}/{len(jobs)}, round 1/{1 if causal else spec.latency_rounds}, {device}"
            log(f"  {art.id} on {device}: measuring ({where}) ...")
            with heartbeat(f"    {art.id} ({where})", log):
                r = measured[art.id] = run_worker(job, folder, art.id, device, spec.threads,
                                                   label=f"{art.id} ({where})", log=log)
            timing.add(f"{art.id} on {device}", r)
            if r.ok and r.lm is not None and r.latency_ms is not None and r.size_bytes is not None:
                best = max(g.decode_tokens_per_s for g in r.lm.generation)
                log(f"    perplexity {r.quality:.3f}  TTFT p50 {r.lm.ttft_ms['p50']:.1f} ms  "
                    f"{r.latency_ms.p50:.2f} ms/token at batch 1  best {best:.1f} tok/s  size {r.size_bytes / 1e6:.1f} MB")
            elif r.ok and r.latency_ms is not None and r.quality is not None and r.size_bytes is not None:
                log(f"    {get_task(task).metric.name} {r.quality:.2f}  p50 {r.latency_ms.p50:.2f} ms  "
                    f"size {r.size_bytes / 1e6:.1f} MB")
            else:
                log(f"    failed: {r.error}")
        timed = [] if causal else [(art, job) for art, job, _, _ in jobs if measured[art.id].ok]
        extra, ratios = _later_rounds(timed, reference, spec, folder, device, log, timing)
        for art, _, key, _ in jobs:
            r = measured[art.id]
            if r.ok and r.lm is None:  # a causal LM's timings come from its one round
                merge_rounds(r, extra.get(art.id, []))
                if extra.get(art.id):
                    p50s = r.latency_rounds_p50 or []
                    log(f"  {art.id}: p50 " + (" / ".join(f"{p:.2f}" for p in p50s) if len(p50s) <= 5 else
                                               f"{min(p50s):.2f} to {max(p50s):.2f}")
                        + f" ms over {len(p50s)} rounds -> {r.latency_ms.p50:.2f}")
                if ratios.get(art.id) and reference is not None:
                    r.paired_speedup = PairedSpeedup(reference=reference, rounds=ratios[art.id],
                                                     speedup=float(statistics.median(ratios[art.id])))
                    log(f"  {art.id}: {r.paired_speedup.speedup:.2f}x faster than {reference} "
                        f"(paired rounds: " + ", ".join(f"{x:.2f}x" for x in ratios[art.id]) + ")")
            r.key = key
            _store(folder / f"{art.id}.{device}.json", r)
            results[(art.id, device)] = r
    return results, notes


def _later_rounds(
    timed: list, reference: str | None, spec: "BenchmarkSpec", folder: Path, device: str, log: Callable[[str], None],
    timing: BenchTiming | None = None,
) -> tuple[dict[str, list[list[float]]], dict[str, list[float]]]:
    """Rounds 2.. of batch-1 timing. Every variant's selection is timed again in a fresh
    process, each round starting further along the list, so that no variant is always timed
    next to the same neighbour or at the same point of the session. When the reference was
    measured, each variant is timed alternately with it in one process (bench_worker.
    measure_paired): the reference's timings of every pair count as its own rounds, and
    each pair gives one speed-up, the ratio of the two p50s taken under the same load.
    Returns {id: [per-sentence ms of each later round]}, {id: [paired speed-ups]}."""
    extra: dict[str, list[list[float]]] = {art.id: [] for art, _ in timed}
    ratios: dict[str, list[float]] = {}
    ref_job: BenchJob | None = next((job for art, job in timed if art.id == reference), None)
    others = [(art, job) for art, job in timed if ref_job is None or art.id != reference]
    for rnd in range(1, spec.latency_rounds if others else 1):
        start = rnd * len(others) // spec.latency_rounds
        log(f"  {device}: latency round {rnd + 1}/{spec.latency_rounds}"
            + (f" (each variant timed alternately with {reference})" if ref_job else ""))
        last_line = time.monotonic()
        for n, (art, job) in enumerate(others[start:] + others[:start], 1):
            # A variant's later round takes seconds, not the heartbeat's 30: without this
            # line a non-terminal log would say nothing for the whole round.
            if n > 1 and time.monotonic() - last_line >= progress_seconds() / 2:
                log(f"  {device}: latency round {rnd + 1}/{spec.latency_rounds}: {n - 1}/{len(others)} variants timed")
                last_line = time.monotonic()
            job = job.model_copy(update={"latency_only": True})
            if ref_job is not None:
                job.pair = PairRef(format=ref_job.format, path=ref_job.path, options=ref_job.options)
            where = f"variant {n}/{len(others)}, round {rnd + 1}/{spec.latency_rounds}, {device}"
            with heartbeat(f"    {art.id} ({where})", log):
                r = run_worker(job, folder, art.id, device, spec.threads, label=f"{art.id} ({where})", log=log)
            if timing is not None:
                timing.add(f"{art.id} on {device}", r, rounds=True)
            if not r.ok:
                log(f"    {art.id}: round {rnd + 1} failed ({r.error}); its other rounds count")
                continue
            extra[art.id].append(r.sentence_ms)
            if ref_job is not None and reference is not None and r.pair_sentence_ms is not None:
                extra[reference].append(r.pair_sentence_ms)
                ratios.setdefault(art.id, []).append(
                    float(statistics.median(r.pair_sentence_ms) / statistics.median(r.sentence_ms)))
    return extra, ratios


def merge_rounds(result: Measurement, rounds: list[list[float]]) -> None:
    """Folds later rounds' batch-1 timings into a worker's result, in place: a sentence's
    latency becomes its median over all rounds (the first round's `sentence_ms` included),
    and the batch-1 percentiles and throughput are taken from those medians."""
    import numpy as np

    from compress.bench.worker import percentiles

    first = result.sentence_ms or []
    result.unset("sentence_ms")  # folded into the figures below; not cached
    per_round = np.array([first, *rounds])  # [rounds, sentences] ms
    merged = np.median(per_round, axis=0)
    p = result.latency_ms = percentiles(merged.tolist())
    result.latency_rounds_p50 = [float(np.percentile(r, 50)) for r in per_round]
    for entry in result.batches or []:
        if entry.batch_size == 1:
            entry.p50_ms, entry.p95_ms, entry.p99_ms = p.p50, p.p95, p.p99
            entry.throughput = merged.size / (merged.sum() / 1000.0)


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def cached_measurement(path: Path, key: str | None) -> Measurement | None:
    """The measurement cached at `path` under `key` (None: whatever key it was measured under,
    for a finished run's own measurements), or None: missing, unreadable, edited (an
    accuracy changed by hand breaks its checksum), measured under another key, failed, or of
    another shape (a renamed or missing figure): each of those is measured again."""
    from pydantic import ValidationError

    cached = _read_json(path) if path.is_file() else None
    if cached is None or not is_sealed(cached) or key not in (None, cached.get("key")) or cached.get("ok") is not True:
        return None
    try:
        m = Measurement.model_validate({k: v for k, v in cached.items() if k != "checksum"})
    except ValidationError:
        return None
    if m.quality is None or m.latency_ms is None or not m.batches or m.size_bytes is None:
        return None  # ok, yet lacking what every report reads
    return m


def run_worker(job: BenchJob, folder: Path, vid: str, device: str, threads: int,
                label: str = "", log: Callable[[str], None] | None = None) -> Measurement | RoundTimes:
    """Runs compress.bench.worker on `job` in a fresh process; its result (RoundTimes for a
    later round, `latency_only`), or one with ok False and the error.
    The worker's progress lines (prefixed, at least every progress_seconds() of a long
    phase) go to `log`, headed by `label`; the rest of its stderr is library chatter, kept
    only for the error of a worker that dies. The result gets `wall_seconds`, process start
    included."""
    import collections
    import time

    from compress.bench.worker import PROGRESS_PREFIX
    from compress.core.console import progress_seconds

    for part in (vid, device):  # the files below are named after them: never a path out of `folder`
        if not part or part in (".", "..") or any(c in part for c in "/\\\0"):
            raise ValueError(f"run_worker: {part!r} cannot name a file in {folder}")
    spec_path = folder / f"{vid}.{device}.spec.json"
    out_path = folder / f"{vid}.{device}.worker.json"
    # label and progress_seconds only steer the progress lines: not part of the cache key.
    write_file(spec_path, job.model_copy(update={"label": label if log else "",
                                                 "progress_seconds": progress_seconds()}).dump_json())
    env = dict(os.environ)
    # Fix the thread pools of every runtime before it starts (torch, OpenMP, MKL, ORT).
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"})
    env["COMPRESS_BENCH_PARENT"] = str(os.getpid())  # the worker dies with this process (bench_worker)
    out_path.unlink(missing_ok=True)
    start = time.perf_counter()
    tail: collections.deque[str] = collections.deque(maxlen=20)
    proc = subprocess.Popen(
        [*worker_command(), str(spec_path), str(out_path)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # until the worker exits
            if line.startswith(PROGRESS_PREFIX):
                if log is not None:
                    log("    " + line[len(PROGRESS_PREFIX):].rstrip())
            elif line.strip():
                tail.append(line.strip())
        returncode = proc.wait()
    except BaseException:
        # Ctrl-C or SIGTERM (the CLI turns it into KeyboardInterrupt) while the worker runs:
        # stop it and wait for it before the run goes on to exit. Popen's own exit on
        # KeyboardInterrupt waits a quarter second and leaves the worker running, so the run
        # would tear down its interpreter while its child still held the pipe and wrote into
        # bench/.
        stop_worker(proc)
        out_path.unlink(missing_ok=True)
        spec_path.unlink(missing_ok=True)
        raise
    finally:
        proc.stderr.close()
    kind = RoundTimes if job.latency_only else Measurement
    result = None
    if out_path.is_file():
        from pydantic import ValidationError

        try:
            result = kind.model_validate_json(out_path.read_text())
        except ValidationError as exc:
            result = kind(ok=False, error=f"the benchmark process wrote a result of another shape "
                                          f"({str(exc).splitlines()[0][:150]})")
    if result is None:
        last = tail[-1] if tail else f"exit code {returncode}"
        result = kind(ok=False, error=f"benchmark process died: {last[:200]}")
    result.wall_seconds = round(time.perf_counter() - start, 2)
    out_path.unlink(missing_ok=True)
    spec_path.unlink(missing_ok=True)
    return result


# Seconds a stopped worker gets to exit on SIGTERM before it is killed.
STOP_SECONDS = 5.0


def stop_worker(proc: subprocess.Popen) -> None:
    """Ends a benchmark worker and reaps it: SIGTERM (on which it exits at once, see
    compress/bench/worker.py), then SIGKILL if it is still there after STOP_SECONDS. A
    second Ctrl-C meanwhile kills it instead of leaving it behind."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        raise


def worker_command() -> list[str]:
    """The worker's command line. `python -m` puts the current folder first on the import
    path, so a `torch.py` or `numpy.py` in the folder the run was started from would be
    imported in place of the library: -P (Python 3.11+) leaves it off; older Pythons drop
    it before importing anything."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "compress.bench.worker"]
    return [sys.executable, "-c", "import sys; del sys.path[0]; from compress.bench.worker import main; main()"]


def _store(path: Path, result: Measurement) -> None:
    """Caches a successful measurement atomically (a run killed here leaves no half file);
    failures are not cached: the next run tries again."""
    if result.ok:
        write_file(path, json.dumps(sealed(result.dump())), tmp=path.with_suffix(".part"))
    else:
        path.unlink(missing_ok=True)
