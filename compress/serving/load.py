"""A measured load: MLPerf LoadGen's server scenario driven over HTTP at a served variant.

LoadGen schedules Poisson arrivals at a target QPS and calls the SUT's issue_queries; the
SUT here sends each query (one text) as a real `POST /predict` through a pool of open
connections (aiohttp on an event loop of its own, so issue_queries returns at once), and
completes it with QuerySamplesComplete when the answer comes back. The QSL is the run's
segment of the traffic stream, and LoadGen issues each of its samples once
(`performance_issue_unique`), so what the server receives is exactly that segment and its
share of repeated texts is counted, not estimated.

A run's validity is LoadGen's own (its summary log, mlperf_log_summary.txt, is kept in the
run folder beside the figures): the `percentile` latency within the SLO, over enough
queries for its early-stopping rule, and a run with a failed request is not valid either
(LoadGen only sees that the query was answered). The highest valid QPS is found by
`search_max_qps`: the load doubled until a run fails (or halved until one passes), then
bisected, with a bounded number of runs.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from compress.core.errors import CompressError
from compress.recipe.serving import LmServingSpec, LoadSpec
from compress.serving.records import LoadRun, Search

if TYPE_CHECKING:  # pragma: no cover
    from compress.serving.traffic import Traffic

SUMMARY_LOG = "mlperf_log_summary.txt"
DETAIL_LOG = "mlperf_log_detail.txt"
CONFIDENCE = 0.99  # LoadGen's early-stopping confidence (early_stopping.cc)


# --- the search, on any measure of validity ----------------------------------------------


def search_max_qps(valid_at: Callable[[float], bool], start: float, *, growth: float = 2.0,
                   resolution: float = 0.15, max_runs: int = 6, max_qps: float = math.inf,
                   min_qps: float = 0.0) -> Search:
    """The highest offered load at which `valid_at` holds: bracketed by multiplying `start`
    by `growth` while runs pass (dividing while they fail), then bisected (geometric
    midpoints) until the failing bound is within `resolution` of the passing one. At most
    `max_runs` calls; loads stay within [min_qps, max_qps]."""
    tried: list[tuple[float, bool]] = []

    def run(q: float) -> bool:
        ok = bool(valid_at(q))
        tried.append((q, ok))
        return ok

    lo: float | None = None
    hi: float | None = None
    q = min(start, max_qps)
    while len(tried) < max_runs:
        if run(q):
            lo = q
            if hi is not None or q >= max_qps:
                break
            q = min(q * growth, max_qps)
        else:
            hi = q
            if lo is not None or q / growth < min_qps:
                break
            q = q / growth
    while lo is not None and hi is not None and len(tried) < max_runs and hi > lo * (1.0 + resolution):
        mid = math.sqrt(lo * hi)
        if run(mid):
            lo = mid
        else:
            hi = mid
    return Search(tried=tried, max_valid_qps=lo, lowest_invalid_qps=hi)


def early_stopping_minimum(percentile: float, confidence: float = CONFIDENCE) -> int:
    """The fewest queries with none over the SLO that LoadGen's early-stopping rule accepts
    at `percentile` (early_stopping.cc: percentile**h <= 1 - confidence)."""
    return int(math.ceil(math.log(1.0 - confidence) / math.log(percentile)))


def queries_for(qps: float, spec: "LoadSpec | LmServingSpec") -> int:
    """Queries in a run at `qps`: enough for min_duration (with three standard deviations of
    the Poisson schedule to spare, since LoadGen checks the last query's scheduled time),
    min_queries and the early-stopping minimum."""
    expected = qps * spec.min_duration_s
    for_duration = int(math.ceil(expected * (1.0 + 3.0 / math.sqrt(max(expected, 1.0))))) + 1
    return max(spec.min_queries, early_stopping_minimum(spec.percentile), for_duration)


def knee(runs: list[LoadRun]) -> float | None:
    """The highest offered load whose p99 stays within twice the p99 at the lowest load
    measured: past it a queue forms and latency climbs with load."""
    pts = sorted((r.target_qps, r.p99_ms) for r in runs if r.p99_ms is not None)
    if not pts:
        return None
    base = pts[0][1]
    return max(q for q, p in pts if p <= 2.0 * base)


# --- LoadGen's logs ----------------------------------------------------------------------

_PCT = re.compile(r"^result_(\d+(?:\.\d+)?)_percentile_latency_ns$")
# With use_token_latencies: the time to first token and the time per output token.
_TTFT = re.compile(r"^result_first_token_(\d+(?:\.\d+)?)_percentile_latency_ns$")
_TPOT = re.compile(r"^result_time_per_output_token_(\d+(?:\.\d+)?)_percentile_ns$")


@dataclass
class LoadGenResult:
    """What a run's mlperf_log_detail.txt says (its MLLOG records)."""

    validity: str | None = None
    invalid_reason: str | None = None
    early_stopping: str | None = None
    query_count: int | None = None
    overlatency: int | None = None
    scheduled_qps: float | None = None
    completed_qps: float | None = None
    percentiles_ns: dict[float, float] = field(default_factory=dict)
    ttft_ns: dict[float, float] = field(default_factory=dict)  # token latencies only
    tpot_ns: dict[float, float] = field(default_factory=dict)
    tokens_per_s: float | None = None
    early_stopping_ttft: str | None = None
    early_stopping_tpot: str | None = None
    errors: list[str] = field(default_factory=list)

    def ms(self, pct: float, of: str = "latency") -> float | None:
        """A percentile in ms: of the whole query (`latency`), or `ttft` or `tpot`."""
        table = {"latency": self.percentiles_ns, "ttft": self.ttft_ns, "tpot": self.tpot_ns}[of]
        v = table.get(pct)
        return None if v is None else v / 1e6


def read_detail_log(path: Path) -> LoadGenResult:
    out = LoadGenResult()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        out.errors.append(f"no LoadGen detail log at {path}")
        return out
    for line in lines:
        if not line.startswith(":::MLLOG"):
            continue
        try:
            rec = json.loads(line[len(":::MLLOG"):].strip())
        except json.JSONDecodeError:
            continue
        key, value = rec.get("key"), rec.get("value")
        if rec.get("event_type") == "ERROR" or str(key).startswith("error"):
            out.errors.append(f"{key}: {value}")
        if key == "result_validity":
            out.validity = str(value)
        elif key == "result_invalid_reason":
            out.invalid_reason = str(value).strip()
        elif key == "early_stopping_result":
            out.early_stopping = str(value).strip()
        elif key == "result_query_count":
            out.query_count = int(value)
        elif key == "result_overlatency_query_count":
            out.overlatency = int(value)
        elif key == "result_scheduled_samples_per_sec":
            out.scheduled_qps = float(value)
        elif key == "result_completed_samples_per_sec":
            out.completed_qps = float(value)
        elif key == "result_completed_tokens_per_second":
            out.tokens_per_s = float(value)
        elif key == "early_stopping_ttft_result":
            out.early_stopping_ttft = str(value).strip()
        elif key == "early_stopping_tpot_result":
            out.early_stopping_tpot = str(value).strip()
        elif isinstance(key, str):
            for pattern, table in ((_PCT, out.percentiles_ns), (_TTFT, out.ttft_ns), (_TPOT, out.tpot_ns)):
                if m := pattern.match(key):
                    table[round(float(m.group(1)), 2)] = float(value)
    return out


# --- the SUT: HTTP requests from an event loop of their own ------------------------------


class HttpClient:
    """An aiohttp session on its own event loop thread, `concurrency` open connections."""

    def __init__(self, concurrency: int, timeout_s: float):
        import asyncio

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="compress-load-http", daemon=True)
        self.thread.start()
        self.session = asyncio.run_coroutine_threadsafe(self._session(concurrency, timeout_s), self.loop).result()

    async def _session(self, concurrency: int, timeout_s: float):
        import aiohttp

        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency, force_close=False),
                                     timeout=aiohttp.ClientTimeout(total=timeout_s))

    def submit(self, coro):
        return self._asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def post(self, url: str, text: str) -> tuple[bool, float, int]:
        """(answered with one prediction, seconds, HTTP status or 0)."""
        import aiohttp

        t0 = time.perf_counter()
        status = 0
        ok = False
        try:
            async with self.session.post(url, json={"texts": [text]}) as resp:
                status = resp.status
                body = await resp.read()
            if status == 200:
                preds = json.loads(body).get("predictions")
                ok = isinstance(preds, list) and len(preds) == 1
        except (aiohttp.ClientError, self._asyncio.TimeoutError, OSError, ValueError, AttributeError):
            ok = False
        return ok, time.perf_counter() - t0, status

    def request(self, url: str, text: str) -> tuple[bool, float, int]:
        return self.submit(self.post(url, text)).result()

    def close(self) -> None:
        try:
            self.submit(self.session.close()).result(timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()


@dataclass
class _Outcomes:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ok: int = 0
    failed: int = 0
    within_slo: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


class _SUT:
    """LoadGen's system under test: each query one POST of its sample's text."""

    def __init__(self, client: HttpClient, url: str, texts: list[str], slo_s: float):
        self.client, self.url, self.texts, self.slo_s = client, url, texts, slo_s
        self.outcomes = _Outcomes()
        self.pending: list = []

    def issue_queries(self, samples) -> None:
        # Called on LoadGen's issue thread: hand off and return, so the schedule holds.
        now = time.perf_counter()
        for s in samples:
            self.pending.append(self.client.submit(self._one(s.id, self.texts[s.index], now)))

    async def _one(self, qid: int, text: str, issued: float) -> None:
        import mlperf_loadgen as lg

        try:
            ok, _, status = await self.client.post(self.url, text)
        finally:  # LoadGen waits for every query: it is completed whatever happened
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0)])
        seconds = time.perf_counter() - issued  # from the hand-off, as LoadGen counts it, not from the send
        o = self.outcomes
        with o.lock:
            o.statuses[status] = o.statuses.get(status, 0) + 1
            if ok:
                o.ok += 1
                o.within_slo += seconds <= self.slo_s
            else:
                o.failed += 1

    def flush_queries(self) -> None:
        pass


# --- one run ------------------------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of these processes so far (those gone count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), as Ray counts them."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def server_pids(own: int | None = None) -> list[int]:
    """The server's replica processes (Ray Serve's, titled `ray::ServeReplica...`) among this
    process's descendants, where a local Ray runs them; without any, every descendant (the
    process tree: Ray, the proxy, the replicas), never this process, where the load runs."""
    import os

    import psutil

    try:
        tree = psutil.Process(own or os.getpid()).children(recursive=True)
    except psutil.Error:
        return []
    replicas = []
    for p in tree:
        try:
            if " ".join(p.cmdline()).startswith("ray::ServeReplica"):
                replicas.append(p.pid)
        except psutil.Error:
            continue
    return replicas or [p.pid for p in tree]


def run_once(client: HttpClient, url: str, traffic: "Traffic", start: int, qps: float, spec: LoadSpec,
             out_dir: Path, run_dir: Path, seed: int, pids: Callable[[], list[int]] = server_pids
             ) -> tuple[LoadRun, list[int]]:
    """One LoadGen server-scenario run at `qps` over the traffic's requests start.. (as
    many as `queries_for` gives). Returns the run and the text ids it sent."""
    import mlperf_loadgen as lg

    n = queries_for(qps, spec)
    ids = traffic.ids(start, n)
    texts = [traffic.texts[i] for i in ids]
    out_dir.mkdir(parents=True, exist_ok=True)
    sut = _SUT(client, url.rstrip("/") + "/predict", texts, spec.slo_ms / 1000.0)

    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = float(qps)
    settings.server_target_latency_ns = int(spec.slo_ms * 1e6)
    settings.server_target_latency_percentile = float(spec.percentile)
    settings.min_duration_ms = int(spec.min_duration_s * 1000)
    settings.min_query_count = n
    settings.performance_issue_unique = True  # each request of the segment once: the traffic as drawn
    settings.sample_index_rng_seed = spec.seed + seed
    settings.schedule_rng_seed = spec.seed + seed
    settings.qsl_rng_seed = spec.seed + seed
    output = lg.LogOutputSettings()
    output.outdir = str(out_dir)
    output.copy_summary_to_stdout = False
    output.copy_detail_to_stdout = False
    logs = lg.LogSettings()
    logs.log_output = output
    logs.enable_trace = False

    procs = pids()
    cpu0, t0 = cpu_seconds(procs), time.perf_counter()
    qsl = lg.ConstructQSL(n, n, lambda idx: None, lambda idx: None)
    handle = lg.ConstructSUT(sut.issue_queries, sut.flush_queries)
    try:
        lg.StartTestWithLogSettings(handle, qsl, settings, logs)
        for f in sut.pending:  # every completion has been counted before the figures are read
            f.result(timeout=spec.timeout_s + 5)
    finally:
        lg.DestroySUT(handle)
        lg.DestroyQSL(qsl)
    seconds = time.perf_counter() - t0
    cpu = (cpu_seconds(procs) - cpu0) / max(seconds, 1e-9) / usable_cpus()

    res = read_detail_log(out_dir / DETAIL_LOG)
    o = sut.outcomes
    loadgen_valid = res.validity == "VALID"
    reason = None
    if not loadgen_valid:
        reason = res.invalid_reason or res.early_stopping or "; ".join(res.errors) or "LoadGen gave no result"
    elif o.failed:
        bad = ", ".join(f"{k or 'no answer'}: {v}" for k, v in sorted(o.statuses.items()) if k != 200)
        reason = f"{o.failed} of {n} requests failed ({bad})"
    run = LoadRun(
        target_qps=qps, valid=loadgen_valid and o.failed == 0, loadgen_valid=loadgen_valid, invalid_reason=reason,
        queries=res.query_count or n, failed=o.failed, overlatency=res.overlatency or 0,
        scheduled_qps=res.scheduled_qps, completed_qps=res.completed_qps,
        p50_ms=res.ms(50.0), p95_ms=res.ms(95.0), p99_ms=res.ms(99.0),
        goodput_qps=o.within_slo / seconds if seconds > 0 else None, seconds=round(seconds, 3),
        cpu_utilisation=cpu if procs else None, log_dir=_relative(out_dir, run_dir),
    )
    return run, ids


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def warm_up(client: HttpClient, url: str, requests: int = 16) -> None:
    """A few requests before the first run (model load, first batches), with a text the
    traffic does not hold, so the cache starts the runs empty of traffic texts."""
    predict = url.rstrip("/") + "/predict"
    futures = [client.submit(client.post(predict, "warm-up request, not part of the traffic"))
               for _ in range(requests)]
    answered = [f.result() for f in futures]
    if not any(ok for ok, _, _ in answered):
        statuses = sorted({s for _, _, s in answered})
        raise CompressError(f"{predict}: the server answered none of {requests} warm-up requests (HTTP "
                            f"{', '.join(str(s) for s in statuses)}); check `compress serve` on it")
