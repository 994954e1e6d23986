"""A causal LM's GGUF variant under load: llama-server (compress/serving/llama_server.py)
with one slot (a request at a time) and with `parallel` slots batched continuously, each
driven by MLPerf LoadGen's server scenario with token latencies.

Each query is one real streamed `POST /completion` of `max_tokens` tokens (greedy, eos
ignored, no prompt cache, so every request prefills its whole prompt and decodes as many
tokens): the SUT calls LoadGen's FirstTokenComplete when the first token arrives and
QuerySamplesComplete with the token count at the end, so LoadGen measures the time to first
token and the time per output token itself and judges the run on both SLOs. The highest
valid QPS is searched with the classifier load's `search_max_qps`, runs are sized by its
`queries_for`, and LoadGen's logs are read by its `read_detail_log`; each run's
mlperf_log_summary.txt and mlperf_log_detail.txt stay beside the figures.
"""

from __future__ import annotations

import json
import shutil
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from compress.core.errors import CompressError
from compress.core.files import real_folder, write_file
from compress.recipe.serving import LmServingSpec
from compress.serving.records import LmConfigFigures, LmServingReport, TokenRun

SERVING_LM_DIR = "serving_lm"
SERVING_LM_JSON = "serving_lm.json"


@dataclass
class Completion:
    """One streamed completion as the client saw it."""

    ok: bool
    status: int
    tokens: int = 0
    prompt_tokens: int | None = None
    seconds: float = 0.0
    first_token_s: float | None = None
    error: str | None = None


async def stream_completion(session, url: str, prompt: str, max_tokens: int,
                            on_first: Callable[[], None] | None = None) -> Completion:
    """`prompt` through llama-server's /completion, streamed (server-sent events): greedy,
    exactly `max_tokens` tokens (eos ignored), no prompt cache. `on_first` is called when
    the first token arrives."""
    import asyncio

    import aiohttp

    body = {"prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "cache_prompt": False}
    t0 = time.perf_counter()
    out = Completion(ok=False, status=0)
    try:
        # A connection per request: a kept-alive one that llama-server has just closed fails the next write.
        async with session.post(url.rstrip("/") + "/completion", json=body, headers={"Connection": "close"}) as resp:
            out.status = resp.status
            if resp.status != 200:
                out.error = (await resp.text())[:200]
                return out
            async for raw in resp.content:  # one server-sent event a line: `data: {json}`
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                chunk = json.loads(line[5:])
                n = len(chunk.get("tokens") or [])
                if n and out.first_token_s is None:
                    out.first_token_s = time.perf_counter() - t0
                    if on_first is not None:
                        on_first()
                out.tokens += n
                if chunk.get("stop"):
                    out.tokens = int(chunk.get("tokens_predicted") or out.tokens)
                    out.prompt_tokens = chunk.get("tokens_evaluated")
                    break
        out.ok = out.tokens == max_tokens
        if not out.ok:
            out.error = f"{out.tokens} tokens of {max_tokens}"
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    out.seconds = time.perf_counter() - t0
    return out


async def apply_template(session, url: str, text: str) -> str:
    """The user message in the model's chat template, as llama-server formats it (the
    template in the GGUF file), with the assistant's turn opened."""
    async with session.post(url.rstrip("/") + "/apply-template",
                            json={"messages": [{"role": "user", "content": text}]}) as resp:
        if resp.status != 200:
            raise CompressError(f"llama-server /apply-template answered HTTP {resp.status}; the GGUF file needs a "
                                f"chat template")
        return (await resp.json())["prompt"]


@dataclass
class _Outcomes:
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: list[Completion] = field(default_factory=list)


class _TokenSUT:
    """LoadGen's system under test: each query one streamed completion of its sample's prompt."""

    def __init__(self, client, url: str, prompts: list[str], max_tokens: int):
        self.client, self.url, self.prompts, self.max_tokens = client, url, prompts, max_tokens
        self.outcomes = _Outcomes()
        self.pending: list = []

    def issue_queries(self, samples) -> None:
        # LoadGen's issue thread: hand off and return, so the schedule holds.
        for s in samples:
            self.pending.append(self.client.submit(self._one(s.id, self.prompts[s.index])))

    async def _one(self, qid: int, prompt: str) -> None:
        import mlperf_loadgen as lg

        first = []

        def on_first() -> None:
            first.append(True)
            lg.FirstTokenComplete([lg.QuerySampleResponse(qid, 0, 0)])

        c = Completion(ok=False, status=0)
        try:
            c = await stream_completion(self.client.session, self.url, prompt, self.max_tokens, on_first)
        finally:  # LoadGen waits for every query: it is completed whatever happened
            if not first:
                lg.FirstTokenComplete([lg.QuerySampleResponse(qid, 0, 0)])
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qid, 0, 0, max(c.tokens, 2))])
        with self.outcomes.lock:
            self.outcomes.done.append(c)

    def flush_queries(self) -> None:
        pass


def run_tokens(client, url: str, prompts: list[str], qps: float, spec: LmServingSpec, out_dir: Path,
               run_dir: Path, seed: int, pids: list[int]) -> TokenRun:
    """One LoadGen server-scenario run with token latencies at `qps`."""
    import mlperf_loadgen as lg

    from compress.serving.load import cpu_seconds, queries_for, read_detail_log, usable_cpus

    n = queries_for(qps, spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    sut = _TokenSUT(client, url, prompts, spec.max_tokens)
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = float(qps)
    settings.use_token_latencies = True
    settings.ttft_latency = int(spec.ttft_ms * 1e6)
    settings.tpot_latency = int(spec.tpot_ms * 1e6)
    settings.server_target_latency_ns = int(spec.ttft_ms * 1e6)  # not judged with token latencies; set for the log
    settings.server_target_latency_percentile = float(spec.percentile)
    settings.min_duration_ms = int(spec.min_duration_s * 1000)
    settings.min_query_count = n
    settings.sample_index_rng_seed = settings.schedule_rng_seed = settings.qsl_rng_seed = spec.seed + seed
    output = lg.LogOutputSettings()
    output.outdir = str(out_dir)
    output.copy_summary_to_stdout = False
    output.copy_detail_to_stdout = False
    logs = lg.LogSettings()
    logs.log_output = output
    logs.enable_trace = False

    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    qsl = lg.ConstructQSL(len(prompts), len(prompts), lambda idx: None, lambda idx: None)
    handle = lg.ConstructSUT(sut.issue_queries, sut.flush_queries)
    try:
        lg.StartTestWithLogSettings(handle, qsl, settings, logs)
        for f in sut.pending:  # every completion counted before the figures are read
            f.result(timeout=spec.timeout_s + 5)
    finally:
        lg.DestroySUT(handle)
        lg.DestroyQSL(qsl)
    seconds = time.perf_counter() - t0
    cpu = (cpu_seconds(pids) - cpu0) / max(seconds, 1e-9) / usable_cpus()

    res = read_detail_log(out_dir / "mlperf_log_detail.txt")
    done = sut.outcomes.done
    failed = [c for c in done if not c.ok]
    loadgen_valid = res.validity == "VALID"
    reason = None
    if not loadgen_valid:
        reason = res.invalid_reason or "; ".join(s for s in (res.early_stopping_ttft, res.early_stopping_tpot) if s) \
            or "; ".join(res.errors) or "LoadGen gave no result"
    elif failed:
        reason = f"{len(failed)} of {len(done)} requests failed ({failed[0].error or f'HTTP {failed[0].status}'})"
    pct = spec.percentile_point
    prompt_tokens = [c.prompt_tokens for c in done if c.prompt_tokens is not None]
    return TokenRun(
        target_qps=qps, valid=loadgen_valid and not failed, loadgen_valid=loadgen_valid, invalid_reason=reason,
        queries=res.query_count or len(done), failed=len(failed), scheduled_qps=res.scheduled_qps,
        completed_qps=res.completed_qps, output_tokens_per_s=res.tokens_per_s,
        ttft_p50_ms=res.ms(50.0, "ttft"), ttft_at_percentile_ms=res.ms(pct, "ttft"), ttft_p99_ms=res.ms(99.0, "ttft"),
        tpot_p50_ms=res.ms(50.0, "tpot"), tpot_at_percentile_ms=res.ms(pct, "tpot"), tpot_p99_ms=res.ms(99.0, "tpot"),
        latency_p50_ms=res.ms(50.0), latency_p99_ms=res.ms(99.0),
        early_stopping_ttft=res.early_stopping_ttft, early_stopping_tpot=res.early_stopping_tpot,
        mean_prompt_tokens=statistics.fmean(prompt_tokens) if prompt_tokens else None,
        mean_output_tokens=statistics.fmean(c.tokens for c in done) if done else None,
        seconds=round(seconds, 3), cpu_utilisation=cpu if pids else None,
        log_dir=str(out_dir.relative_to(run_dir)) if out_dir.is_relative_to(run_dir) else str(out_dir),
    )


def measure_lm(gguf: Path, variant: str, texts: list[str], prompt_source: str, spec: LmServingSpec, run_dir: Path,
               log: Callable[[str], None] = print, notes: list[str] | None = None) -> LmServingReport:
    """Serves `gguf` with llama-server in each configuration the spec names, one after
    another on the same prompts, and measures each; writes serving_lm/ in run_dir."""
    from compress.serving import llama_server as ls
    from compress.serving.load import usable_cpus
    from compress.serving.measure import machine

    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError as exc:
        raise CompressError('the load needs MLPerf LoadGen, which is not installed: pip install -e ".[serve]"') from exc
    binary = ls.require()
    threads = spec.threads or usable_cpus()
    report = LmServingReport(
        variant=variant, gguf=str(gguf), engine=f"llama-server {ls.version_of(binary)}", ttft_ms=spec.ttft_ms,
        tpot_ms=spec.tpot_ms, percentile=spec.percentile, max_tokens=spec.max_tokens, prompts=len(texts),
        prompt_source=prompt_source, threads=threads, ctx_per_slot=spec.ctx_per_slot, instance=spec.pricing.instance,
        usd_per_hour=spec.pricing.on_demand.usd_per_hour, price_source=spec.pricing.on_demand.source, machine=machine(),
        notes=list(notes or []))
    t_all = time.perf_counter()
    prompts: list[str] = []
    for name in spec.configurations:
        fig, prompts = _measure_config(name, binary, gguf, texts, prompts, spec, threads, run_dir, log)
        report.configs.append(fig)
    b, u = report.config("batched"), report.config("unbatched")
    if b is not None and u is not None and b.max_valid_qps and u.max_valid_qps:
        report.batching_gain = b.max_valid_qps / u.max_valid_qps
    report.seconds = round(time.perf_counter() - t_all, 1)
    report = LmServingReport.model_validate(report.model_dump(mode="json"))
    write_file(real_folder(run_dir / SERVING_LM_DIR) / SERVING_LM_JSON, report.model_dump_json(indent=1))
    return report


def _measure_config(name: str, binary: Path, gguf: Path, texts: list[str], prompts: list[str], spec: LmServingSpec,
                    threads: int, run_dir: Path, log: Callable[[str], None]) -> tuple[LmConfigFigures, list[str]]:
    from compress.serving import llama_server as ls
    from compress.serving.load import HttpClient, early_stopping_minimum, search_max_qps

    parallel = 1 if name == "unbatched" else spec.parallel
    fig = LmConfigFigures(name=name, parallel=parallel)
    out = run_dir / SERVING_LM_DIR / name
    t0 = time.perf_counter()
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out)  # a run folder of an earlier load would stand beside this one's
    log(f"load: {name}: llama-server, {parallel} slot(s), {threads} threads, {spec.max_tokens} tokens a request")
    try:
        server = ls.LlamaServer(binary, gguf, parallel, spec.ctx_per_slot, threads, out / "llama-server.log")
    except CompressError as exc:
        fig.error = f"could not be served: {exc}"
        log(f"load: {name}: {fig.error}")
        return fig, prompts
    client = HttpClient(concurrency=512, timeout_s=spec.timeout_s)
    try:
        if not prompts:  # the chat template applied once, by the server, from the GGUF file
            prompts = [client.submit(apply_template(client.session, server.url, t)).result(timeout=60) for t in texts]
        # Warm-up: the first requests (allocation, caches), then one alone for the latency that sizes the search.
        for p in prompts[:2]:
            alone = client.submit(stream_completion(client.session, server.url, p, spec.max_tokens)).result(
                timeout=spec.timeout_s + 5)
            if not alone.ok:
                raise CompressError(f"llama-server did not complete a warm-up request ({alone.error or alone.status}); "
                                    f"its log is {server.log_file}")
        fig.alone_latency_ms = alone.seconds * 1000.0
        # No run longer than max_run_s: the lowest load offered still schedules its queries within it.
        min_qps = early_stopping_minimum(spec.percentile) / spec.max_run_s
        start = spec.start_qps or max(parallel / 2.0 / alone.seconds, min_qps)

        def valid_at(qps: float) -> bool:
            k = len(fig.runs) + 1
            run = run_tokens(client, server.url, prompts, qps, spec, out / f"run{k:02d}_{qps:.2f}qps", run_dir,
                             seed=k, pids=[server.pid])
            fig.runs.append(run)
            log(f"load: {name}: {qps:.2f} QPS offered: {'VALID' if run.valid else 'INVALID'}, TTFT p{spec.percentile_point:g} "
                f"{_ms(run.ttft_at_percentile_ms)} (SLO {spec.ttft_ms:g}), TPOT {_ms(run.tpot_at_percentile_ms)} (SLO {spec.tpot_ms:g}), "
                f"{run.output_tokens_per_s or 0:.1f} tokens/s, {run.queries} queries, {run.seconds:.0f}s"
                + (f" ({run.invalid_reason})" if not run.valid and run.invalid_reason else ""))
            return run.valid

        fig.search = search_max_qps(valid_at, start, growth=spec.growth, resolution=spec.resolution,
                                    max_runs=spec.max_runs, max_qps=spec.max_qps, min_qps=min_qps)
    except CompressError as exc:
        fig.error = str(exc)
        log(f"load: {name}: {fig.error}")
    finally:
        client.close()
        server.stop()
    _headline(fig, spec)
    fig.seconds = round(time.perf_counter() - t0, 1)
    write_file(real_folder(out) / "figures.json", fig.model_dump_json(indent=1))
    return fig, prompts


def _headline(fig: LmConfigFigures, spec: LmServingSpec) -> None:
    """The figures at the highest valid load, and its $ per 1M output tokens."""
    s = fig.search
    if s is None:
        return
    fig.max_valid_qps = s.max_valid_qps
    at = next((r for r in fig.runs if r.valid and r.target_qps == s.max_valid_qps), None)
    if at is not None:
        fig.output_tokens_per_s = at.output_tokens_per_s
        fig.ttft_p50_ms, fig.ttft_p99_ms, fig.tpot_p50_ms, fig.tpot_p99_ms = (
            at.ttft_p50_ms, at.ttft_p99_ms, at.tpot_p50_ms, at.tpot_p99_ms)
        if at.output_tokens_per_s:
            fig.usd_per_1m_output_tokens = usd_per_1m_tokens(spec.pricing.on_demand.usd_per_hour, at.output_tokens_per_s)
    if s.max_valid_qps is None:
        fig.notes.append(f"no load tried was valid (the lowest, {min(q for q, _ in s.tried):.2f} QPS, was not): the "
                         f"SLOs are out of reach here, or the capacity is below the lowest load a run of max_run_s "
                         f"offers; raise serving_lm.ttft_ms, tpot_ms or max_run_s")
    elif s.lowest_invalid_qps is None:
        fig.notes.append(f"every load tried was valid, up to {s.max_valid_qps:.2f} QPS: capacity is higher; raise "
                         f"serving_lm.max_runs or start_qps")


def usd_per_1m_tokens(usd_per_hour: float, tokens_per_s: float) -> float:
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6


def describe(report: LmServingReport) -> list[str]:
    """The figures as lines: one per configuration, then the batching gain."""
    lines = [f"serving_lm: {report.variant} on {report.engine}, SLO TTFT {report.ttft_ms:g} ms and TPOT "
             f"{report.tpot_ms:g} ms at p{report.percentile * 100:g}, {report.max_tokens} tokens a request, "
             f"{report.machine}"]
    for c in report.configs:
        if c.error:
            lines.append(f"  {c.name} ({c.parallel} slot(s)): {c.error}")
            continue
        q = "-" if c.max_valid_qps is None else f"{c.max_valid_qps:.2f}"
        tok = "-" if c.output_tokens_per_s is None else f"{c.output_tokens_per_s:.1f}"
        usd = "-" if c.usd_per_1m_output_tokens is None else f"${c.usd_per_1m_output_tokens:.2f}"
        lines.append(f"  {c.name} ({c.parallel} slot(s)): max valid {q} QPS, {tok} output tokens/s, TTFT p50/p99 "
                     f"{_ms(c.ttft_p50_ms)}/{_ms(c.ttft_p99_ms)}, TPOT p50/p99 {_ms(c.tpot_p50_ms)}/{_ms(c.tpot_p99_ms)}, "
                     f"{usd} per 1M output tokens ({report.instance})")
        lines.extend(f"  {c.name}: {n}" for n in c.notes)
    if report.batching_gain is not None:
        lines.append(f"  continuous batching: {report.batching_gain:.2f}x the QPS of a request at a time at the SLO")
    return lines


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms"
