"""The configurations of a run served one after another on the same traffic, each measured
with LoadGen (compress/serving/load.py): the variant unbatched (max batch 1, no cache),
batched, batched with the result cache, the run's cascade (batched, cached) and the
baseline's ONNX export unbatched as the reference. Each is a copy of the recipe's
ServingSpec passed to `compress.serving.server.start`."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from compress.core.errors import CompressError
from compress.core.files import real_folder, write_file
from compress.recipe.serving import ServingSpec
from compress.serving.records import ConfigFigures, ServerFigures, ServingReport

if TYPE_CHECKING:  # pragma: no cover
    from compress.serving.stats import ServerStats
    from compress.serving.traffic import Traffic

SERVING_DIR = "serving"
SERVING_JSON = "serving.json"


@dataclass(frozen=True)
class Served:
    """Which variants of the run are served: `variant` in three configurations, the run's
    cascade and the baseline's ONNX export where it has them."""

    variant: str
    cascade: str | None = None
    reference: str | None = None


def configuration(name: str, served: Served, spec: ServingSpec) -> tuple[str, ServingSpec] | None:
    """(the variant served, the ServingSpec it is served with) for one configuration; None
    where the run has no such variant."""
    unbatched = spec.server.model_copy(update={"max_batch_size": 1})
    no_cache = spec.cache.model_copy(update={"kind": "none"})
    # The cached configurations keep the recipe's cache; a recipe without one gets the in-memory cache.
    cache = spec.cache if spec.cache.kind != "none" else spec.cache.model_copy(update={"kind": "memory"})
    if name == "reference":
        if served.reference is None or served.reference == served.variant:
            return None
        return served.reference, spec.model_copy(update={"server": unbatched, "cache": no_cache})
    if name == "unbatched":
        return served.variant, spec.model_copy(update={"server": unbatched, "cache": no_cache})
    if name == "batched":
        return served.variant, spec.model_copy(update={"cache": no_cache})
    if name == "batched_cache":
        return served.variant, spec.model_copy(update={"cache": cache})
    if name == "cascade":
        if served.cascade is None or served.cascade == served.variant:
            return None
        return served.cascade, spec.model_copy(update={"cache": cache})
    raise ValueError(name)


def server_figures(before: "ServerStats", after: "ServerStats") -> ServerFigures:
    """The server's counters over the runs: the snapshot after them minus the one before."""
    def delta(a: dict, b: dict) -> dict:
        return {k: v - a.get(k, 0) for k, v in sorted(b.items()) if v - a.get(k, 0)}

    batches = delta(before.batch_sizes, after.batch_sizes)
    calls = sum(batches.values())
    hits, misses = after.cache_hits - before.cache_hits, after.cache_misses - before.cache_misses
    cached = after.cache != "none"
    return ServerFigures(
        requests={str(k): v for k, v in delta(before.requests, after.requests).items()},
        batch_sizes=batches, mean_batch_size=sum(k * v for k, v in batches.items()) / calls if calls else None,
        cache_hits=hits if cached else None, cache_misses=misses if cached else None,
        cache_hit_rate=hits / (hits + misses) if cached and hits + misses else None,
        routed_share=after.routed_share, replicas=after.replicas,
    )


def measure(run_dir: Path, spec: ServingSpec, served: Served, traffic: "Traffic",
            log: Callable[[str], None] = print, start_server: Callable | None = None) -> ServingReport:
    """Serves and measures every configuration the recipe names that the run has, one after
    another; writes each run's LoadGen logs under run_dir/serving/<configuration>/."""
    from compress.serving.traffic import duplicate_share

    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError as exc:
        raise CompressError('the load needs MLPerf LoadGen, which is not installed: pip install -e ".[serve]"') from exc
    session: contextlib.AbstractContextManager = contextlib.nullcontext()
    if start_server is None:
        from compress.serving.server import ray_session
        from compress.serving.server import start as start_server

        session = ray_session()  # one Ray for every configuration: Ray takes seconds to start
    load = spec.load
    t_all = time.perf_counter()
    report = ServingReport(slo_ms=load.slo_ms, percentile=load.percentile, variant=served.variant,
                           traffic=traffic.info(0), machine=machine())
    first_sent: list[int] = []
    with session:
        for name in load.configurations:
            chosen = configuration(name, served, spec)
            if chosen is None:
                report.notes.append(f"{name}: not measured (the run has no such variant, or it is the variant served)")
                continue
            fig, sent = measure_one(name, *chosen, run_dir, traffic, start_server, log)
            report.configs.append(fig)
            first_sent = first_sent or sent
    if first_sent:  # every configuration gets the same stream: the first one's requests stand for all
        report.traffic = traffic.info(len(first_sent), duplicate_share(first_sent))
    report.seconds = round(time.perf_counter() - t_all, 1)
    return report


def measure_one(name: str, vid: str, cspec: ServingSpec, run_dir: Path, traffic: "Traffic",
                start_server: Callable, log: Callable[[str], None]) -> tuple[ConfigFigures, list[int]]:
    """One configuration served, warmed up and searched; (its figures, the text ids it was sent)."""
    from compress.serving.load import HttpClient, early_stopping_minimum, knee, run_once, search_max_qps, warm_up
    from compress.serving.traffic import duplicate_share

    load = cspec.load
    fig = ConfigFigures(name=name, variant=vid, max_batch_size=cspec.server.max_batch_size,
                        cache=cspec.cache.kind != "none")
    out = run_dir / SERVING_DIR / name
    t0 = time.perf_counter()
    sent: list[int] = []
    log(f"load: {name}: serving '{vid}' (max batch {fig.max_batch_size}, cache {cspec.cache.kind})")
    try:
        server = start_server(run_dir, cspec, variant=vid, port=0)
    except CompressError as exc:
        fig.error = f"could not be served: {exc}"
        log(f"load: {name}: {fig.error}")
        return fig, sent
    try:
        fig.fingerprint = server.fingerprint
        client = HttpClient(load.concurrency, load.timeout_s)
        try:
            warm_up(client, server.url)
            before = server.snapshot()

            def valid_at(qps: float) -> bool:
                k = len(fig.runs) + 1
                run, ids = run_once(client, server.url, traffic, len(sent), qps, load,
                                    out / f"run{k:02d}_{qps:.1f}qps", run_dir, seed=k)
                sent.extend(ids)
                fig.runs.append(run)
                log(f"load: {name}: {qps:.1f} QPS offered: {'VALID' if run.valid else 'INVALID'}, "
                    f"p99 {_ms(run.p99_ms)} (SLO {load.slo_ms:g} ms), {run.queries} queries, {run.seconds:.1f}s"
                    + (f" ({run.invalid_reason})" if not run.valid and run.invalid_reason else ""))
                return run.valid

            fig.search = search_max_qps(valid_at, load.start_qps, growth=load.growth, resolution=load.resolution,
                                        max_runs=load.max_runs, max_qps=load.max_qps,
                                        min_qps=early_stopping_minimum(load.percentile) / load.max_run_s)
            fig.server = server_figures(before, server.snapshot())
        finally:
            client.close()
    except CompressError as exc:
        fig.error = str(exc)
        log(f"load: {name}: {fig.error}")
    finally:
        server.stop()
    _figures(fig, knee)
    fig.duplicate_share_sent = duplicate_share(sent) if sent else None
    fig.seconds = round(time.perf_counter() - t0, 1)
    write_file(real_folder(out) / "figures.json", fig.model_dump_json(indent=1))
    return fig, sent


def _figures(fig: ConfigFigures, knee) -> None:
    """The configuration's headline figures from its search and runs."""
    s = fig.search
    fig.knee_qps = knee(fig.runs)
    if s is None:
        return
    fig.max_valid_qps = s.max_valid_qps
    at = next((r for r in fig.runs if s.max_valid_qps is not None and r.target_qps == s.max_valid_qps and r.valid), None)
    if at is not None:
        fig.goodput_qps, fig.cpu_utilisation = at.goodput_qps, at.cpu_utilisation
    if s.max_valid_qps is None:
        lowest = min(q for q, _ in s.tried)
        fig.notes.append(f"no load tried was valid (the lowest, {lowest:.1f} QPS, was not): the SLO is out of "
                         f"reach here, or a run needs more queries; raise serving.load.slo_ms")
    elif s.lowest_invalid_qps is None:
        fig.notes.append(f"every load tried was valid, up to {s.max_valid_qps:.1f} QPS: capacity is higher; raise "
                         f"serving.load.max_runs or start_qps")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def machine() -> str:
    """The machine the load ran on, in words (one instance of the plan)."""
    from compress.core.manifest import hardware
    from compress.serving.load import usable_cpus

    cpu = hardware(with_gpu=False)["cpu"]
    return f"{usable_cpus()} CPUs ({cpu['arch']}, {cpu['model'] or 'unknown CPU'})"
