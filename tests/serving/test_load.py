"""compress.serving.load: the QPS search on a pure function, LoadGen's early-stopping count and
log, and LoadGen's server scenario driving the real Ray Serve server over HTTP on a tiny
model (one server for the module): VALID at a low QPS, INVALID far above capacity, the
cache's hit rate against the repeats sent, and every configuration measured end to end."""

from __future__ import annotations

import json
import math

import pytest

from compress.recipe.serving import LoadSpec, ServingSpec
from compress.serving.load import (early_stopping_minimum, knee, queries_for, read_detail_log, search_max_qps)
from compress.serving.records import LoadRun


# --- the search ----------------------------------------------------------------------------


def capacity(c):
    calls = []

    def valid_at(q):
        calls.append(q)
        return q <= c
    return valid_at, calls


@pytest.mark.parametrize("cap, start", [(37.3, 8.0), (37.3, 200.0), (8.0, 8.0), (500.0, 3.0)])
def test_the_search_brackets_then_bisects_to_the_capacity(cap, start):
    valid_at, calls = capacity(cap)
    s = search_max_qps(valid_at, start, growth=2.0, resolution=0.05, max_runs=20)
    assert s.max_valid_qps <= cap < s.lowest_invalid_qps
    assert s.lowest_invalid_qps <= s.max_valid_qps * 1.05
    assert [q for q, _ in s.tried] == calls and all(ok == (q <= cap) for q, ok in s.tried)


def test_the_search_keeps_to_its_runs_and_bounds():
    valid_at, calls = capacity(37.3)
    s = search_max_qps(valid_at, 8.0, growth=2.0, resolution=0.01, max_runs=5)
    assert len(calls) == 5 and calls[:4] == [8.0, 16.0, 32.0, 64.0]
    assert calls[4] == pytest.approx(math.sqrt(32 * 64))  # the first bisection, geometric
    assert s.max_valid_qps == 32.0 and s.lowest_invalid_qps == calls[4]

    valid_at, calls = capacity(1e9)  # capacity past max_qps: the search stops there
    s = search_max_qps(valid_at, 8.0, max_runs=20, max_qps=100.0)
    assert s.max_valid_qps == 100.0 and s.lowest_invalid_qps is None and calls == [8.0, 16.0, 32.0, 64.0, 100.0]

    valid_at, calls = capacity(0.5)  # below min_qps: nothing valid, and no endless halving
    s = search_max_qps(valid_at, 8.0, max_runs=20, min_qps=2.0)
    assert s.max_valid_qps is None and calls == [8.0, 4.0, 2.0]


def test_early_stopping_needs_loadgens_count_of_queries():
    # LoadGen's own figures: with none over the SLO a server run needs 459 queries at p99.
    assert early_stopping_minimum(0.99) == 459
    assert early_stopping_minimum(0.90) == 44
    spec = LoadSpec(min_duration_s=2.0, min_queries=10, percentile=0.9)
    assert queries_for(1.0, spec) == 44
    assert queries_for(1000.0, spec) > 2000  # the duration, with the schedule's spread to spare


def test_the_knee_is_where_p99_leaves_twice_its_low_load_value():
    def run(q, p99):
        return LoadRun(target_qps=q, valid=True, loadgen_valid=True, queries=1, seconds=1.0, log_dir="x", p99_ms=p99)
    assert knee([run(10, 20.0), run(20, 25.0), run(40, 39.0), run(80, 300.0)]) == 40
    assert knee([]) is None


def test_the_detail_log_is_read(tmp_path):
    recs = [("result_validity", "INVALID"), ("result_invalid_reason", "Reduce target QPS to improve latency. "),
            ("result_query_count", 500), ("result_overlatency_query_count", 12),
            ("result_scheduled_samples_per_sec", 99.5), ("result_99.00_percentile_latency_ns", 2.5e8),
            ("result_50.00_percentile_latency_ns", 1.0e7)]
    (tmp_path / "mlperf_log_detail.txt").write_text(
        "\n".join(":::MLLOG " + json.dumps({"key": k, "value": v, "event_type": "POINT_IN_TIME"}) for k, v in recs)
        + "\nnot a record\n")
    r = read_detail_log(tmp_path / "mlperf_log_detail.txt")
    assert r.validity == "INVALID" and r.invalid_reason == "Reduce target QPS to improve latency."
    assert (r.query_count, r.overlatency, r.scheduled_qps) == (500, 12, 99.5)
    assert r.ms(99.0) == 250.0 and r.ms(50.0) == 10.0 and r.ms(95.0) is None
    assert read_detail_log(tmp_path / "none.txt").errors


# --- LoadGen against the real server -----------------------------------------------------

pytest.importorskip("mlperf_loadgen")
pytest.importorskip("ray.serve")

TEXTS = [f"the {a} was {b} and {c}" for a in ("film", "plot", "cast", "story", "ending")
         for b in ("good", "awful", "dull", "moving", "lovely", "poor") for c in ("long", "short", "loud", "slow")]
# p90 keeps LoadGen's early-stopping count small (44 queries) so each run lasts seconds.
FAST = dict(slo_ms=1000.0, percentile=0.9, min_duration_s=2.0, min_queries=40, timeout_s=5.0, concurrency=32)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer_dir):
    from tests.serving.served_run import build_run

    return build_run(tmp_path_factory.mktemp("loaded"), tokenizer_dir)


@pytest.fixture(scope="module")
def served(run_dir):
    from compress.serving.server import ray_session, start

    spec = ServingSpec.model_validate({"server": {"max_batch_size": 8, "batch_wait_timeout_s": 0.01},
                                       "cache": {"kind": "memory"}})
    with ray_session():
        server = start(run_dir, spec, variant="small")
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def client():
    from compress.serving.load import HttpClient

    c = HttpClient(concurrency=32, timeout_s=5.0)
    yield c
    c.close()


def traffic():
    from compress.serving.traffic import zipf_traffic

    return zipf_traffic(TEXTS, pool=len(TEXTS), exponent=1.0, seed=0)


def test_loadgen_gets_a_valid_result_at_a_low_qps_and_the_cache_hits_the_repeats(served, client, run_dir):
    from compress.serving.load import run_once, warm_up
    from compress.serving.measure import server_figures
    from compress.serving.traffic import duplicate_share

    warm_up(client, served.url)
    before = served.snapshot()
    spec = LoadSpec(**FAST)
    run, ids = run_once(client, served.url, traffic(), 0, 20.0, spec, run_dir / "serving" / "t" / "low", run_dir, seed=1)
    after = served.snapshot()
    assert run.valid and run.loadgen_valid and run.failed == 0, run.invalid_reason
    assert run.queries == len(ids) == queries_for(20.0, spec)
    assert run.p99_ms is not None and run.p50_ms <= run.p95_ms <= run.p99_ms
    assert run.goodput_qps > 0 and run.scheduled_qps == pytest.approx(20.0, rel=0.4)
    summary = (run_dir / run.log_dir / "mlperf_log_summary.txt").read_text()
    assert "Scenario : Server" in summary and "Result is : VALID" in summary
    figures = server_figures(before, after)
    assert figures.requests == {"200": len(ids)}  # every query reached the server, once
    # One request at a time, mostly: a text asked before is a hit, so the hit rate is the
    # share of repeats sent (a repeat still in flight when asked again is a miss).
    share = duplicate_share(ids)
    assert 0.2 < share < 0.95
    assert figures.cache_hit_rate <= share + 1e-9 and figures.cache_hit_rate == pytest.approx(share, abs=0.1)


def test_loadgen_gets_an_invalid_result_far_above_capacity(served, client, run_dir):
    from compress.serving.load import run_once

    spec = LoadSpec(**{**FAST, "slo_ms": 100.0, "min_duration_s": 1.0, "timeout_s": 2.0})
    run, _ = run_once(client, served.url, traffic(), 0, 3000.0, spec, run_dir / "serving" / "t" / "high", run_dir,
                      seed=2)
    assert not run.valid and not run.loadgen_valid
    assert run.p99_ms > 100.0 and run.overlatency > 0
    assert "Result is : INVALID" in (run_dir / run.log_dir / "mlperf_log_summary.txt").read_text()


def test_every_configuration_is_served_and_measured_end_to_end(served, run_dir):
    """The path `compress load` takes: each configuration a ServingSpec copy passed to
    start(), one after another, searched with LoadGen; then the plan."""
    from compress.serving.measure import Served, measure
    from compress.serving.plan import cost_plan
    from compress.serving.records import ServingReport
    from compress.serving.server import start

    served.stop()  # one server at a time: Serve has one HTTP proxy
    spec = ServingSpec.model_validate({
        "server": {"max_batch_size": 8, "batch_wait_timeout_s": 0.01},
        "load": {**FAST, "start_qps": 16.0, "growth": 4.0, "max_runs": 2,
                 "configurations": ["unbatched", "cascade"]},
        "traffic": {"peak_qps": 50, "mean_qps": 20, "peak_hours_per_day": 4},
    })
    lines = []
    report = measure(run_dir, spec, Served(variant="small", cascade="cascade"), traffic(), log=lines.append,
                     start_server=start)
    assert [c.name for c in report.configs] == ["unbatched", "cascade"]
    for c in report.configs:
        assert c.error is None and 1 <= len(c.runs) <= 2 and c.search is not None
        assert c.runs[0].target_qps == 16.0
        for r in c.runs:
            assert (run_dir / r.log_dir / "mlperf_log_summary.txt").is_file()
        assert (run_dir / "serving" / c.name / "figures.json").is_file()
    unbatched, cascade = report.configs
    assert unbatched.max_batch_size == 1 and not unbatched.cache and unbatched.server.cache_hit_rate is None
    assert set(unbatched.server.batch_sizes) == {1}  # the unbatched copy of the spec was served
    assert cascade.variant == "cascade" and cascade.cache and cascade.max_batch_size == 8
    assert cascade.server.routed_share is not None and cascade.server.cache_hit_rate is not None
    assert report.traffic.duplicate_share_sent == pytest.approx(unbatched.duplicate_share_sent)
    assert report.traffic.duplicate_share_theory is not None
    plan = cost_plan(report.configs, spec.traffic, spec.pricing)
    assert {r.config for r in plan.rows} == {c.name for c in report.configs if c.max_valid_qps}
    again = ServingReport.model_validate_json(report.model_dump_json())
    assert again == report
    assert any("unbatched: 16.0 QPS offered" in line for line in lines)
