"""report.json's `serving` block (schema 7): written, read back, rendered in report.md and
report.html (latency against load and the waterfall); older reports read as before; the
decision on min_monthly_cost."""

import json

import numpy as np
import pytest

from compress.decision.decide import decide
from compress.recipe.serving import PricingSpec, TrafficSpec
from compress.reports.render import markdown, write_reports
from compress.reports.report_json import SCHEMA_VERSION, Report, read_report
from compress.serving.plan import cost_plan
from compress.serving.records import (ConfigFigures, LoadRun, Search, ServerFigures, ServingReport, TrafficInfo)
from tests.synthetic_report import flip, make_report, measurement, recipe_dict

LABELS = np.array([0, 1] * 100)


def run(q, valid, p99):
    return LoadRun(target_qps=q, valid=valid, loadgen_valid=valid, queries=500, seconds=5.0, p50_ms=p99 / 3,
                   p95_ms=p99 / 1.5, p99_ms=p99, goodput_qps=q if valid else q / 2, cpu_utilisation=0.5,
                   log_dir=f"serving/x/run_{q:g}", invalid_reason=None if valid else "Reduce target QPS")


def config(name, variant, cap, hit=None):
    runs = [run(cap / 2, True, 20.0), run(cap, True, 60.0), run(cap * 2, False, 900.0)]
    return ConfigFigures(name=name, variant=variant, max_batch_size=1 if name in ("reference", "unbatched") else 8,
                         cache=hit is not None, runs=runs,
                         search=Search(tried=[(r.target_qps, r.valid) for r in runs], max_valid_qps=cap,
                                       lowest_invalid_qps=cap * 2),
                         max_valid_qps=cap, knee_qps=cap, goodput_qps=cap, cpu_utilisation=0.5,
                         server=ServerFigures(requests={"200": 1500}, batch_sizes={1: 10, 8: 100}, mean_batch_size=7.4,
                                              cache_hits=None if hit is None else 600,
                                              cache_misses=None if hit is None else 900, cache_hit_rate=hit,
                                              routed_share=0.3 if name == "cascade" else None, replicas=1),
                         duplicate_share_sent=0.45)


def serving_block() -> ServingReport:
    configs = [config("reference", "baseline", 20.0), config("unbatched", "int8", 40.0), config("batched", "int8", 90.0),
               config("batched_cache", "int8", 160.0, hit=0.4), config("cascade", "casc", 90.0, hit=0.4)]
    traffic = TrafficSpec(peak_qps=200, mean_qps=60, peak_hours_per_day=4)
    pricing = PricingSpec()
    s = ServingReport(slo_ms=250.0, percentile=0.99, variant="int8",
                      traffic=TrafficInfo(kind="zipf", distinct_texts=500, exponent=1.0, seed=0, requests=1500,
                                          duplicate_share_theory=0.46, duplicate_share_sent=0.45),
                      configs=configs, plan=cost_plan(configs, traffic, pricing), machine="2 CPUs (test)")
    return ServingReport.model_validate(s.model_dump(mode="json"))


def report_with_serving() -> dict:
    res = {"baseline": measurement(LABELS, LABELS, p50=10, p95=12, throughput=100, size_mb=400),
           "int8": measurement(flip(LABELS, 1), LABELS, p50=6, p95=8, throughput=180, size_mb=110),
           "casc": measurement(LABELS, LABELS, p50=7, p95=14, throughput=150, size_mb=510, routed_share=0.2)}
    rep = make_report(res, LABELS, recipe_dict())
    rep["schema_version"] = SCHEMA_VERSION
    rep["serving"] = serving_block().model_dump(mode="json")
    return rep


def test_the_serving_block_goes_through_report_json(tmp_path):
    assert SCHEMA_VERSION == 8
    write_reports(report_with_serving(), tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["schema_version"] == 8 and data["serving"]["plan"]["waterfall"][0]["lever"] == "variant"
    back = read_report(tmp_path)
    assert back.serving == serving_block()
    assert back.serving.monthly_cost("int8") == min(r.mixed_usd_month for r in back.serving.plan.rows
                                                    if r.variant == "int8")


def test_older_reports_read_and_render_without_a_serving_section(tmp_path):
    old = make_report({"baseline": measurement(LABELS, LABELS), "int8": measurement(flip(LABELS, 1), LABELS)},
                      LABELS, recipe_dict())
    for version in (1, 6):
        write_reports({**old, "schema_version": version}, tmp_path)
        rep = read_report(tmp_path)
        assert rep.schema_version == version and rep.serving is None
        assert "### Serving" not in (tmp_path / "report.md").read_text()
        assert "<h2>Serving</h2>" not in (tmp_path / "report.html").read_text()


def test_report_md_shows_the_configurations_the_plan_the_waterfall_and_every_price_source():
    md = markdown(Report.model_validate(report_with_serving()))
    assert "### Serving" in md and "p99 at most 250 ms" in md
    assert "| batched + cache | int8 | 160.0 |" in md
    assert "40.0% (45.0%)" in md  # the cache's hit rate beside the repeats sent
    assert "8x100, 1x10 (mean 7.40)" in md  # the batch-size histogram
    assert "46.0% expected, 45.0% as sent" in md
    for lever in ("variant", "batching", "cache", "pricing"):
        assert f"- {lever}: " in md
    assert "cascade: batched_cache \u2192 cascade, would cost $10/month more: not pulled" in md  # 90 QPS: it costs more
    pricing = PricingSpec()
    for src in (pricing.on_demand.source, pricing.reserved.source, pricing.spot.source):
        assert src in md
    assert "mlperf_log_summary.txt" in md


def test_report_html_draws_latency_against_load_and_the_waterfall(tmp_path):
    write_reports(report_with_serving(), tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert "<h2>Serving</h2>" in html
    assert html.count("<svg") == 4 + 2  # the variant plots, then latency against load and the waterfall
    assert "latency against load" in html and "what each lever saved" in html
    assert "plot unavailable" not in html
    assert PricingSpec().spot.source in html


def test_min_monthly_cost_deploys_the_cheapest_served_variant():
    rep = Report.model_validate(report_with_serving())
    policy = recipe_dict(objective="min_monthly_cost")
    rows = [r.model_copy() for r in rep.rows]
    by = {r.id: r for r in rows}
    assert by["int8"].usd_per_1k < by["casc"].usd_per_1k  # $/1K would deploy int8
    by["int8"].usd_per_month, by["casc"].usd_per_month = 900.0, 400.0
    d = decide(rows, policy, ["cpu"])
    assert d.selected == "casc" and d.objective == "min_monthly_cost"
    by["casc"].usd_per_month = None  # not served: no figure, so not deployable on this objective
    d = decide(rows, policy, ["cpu"])
    assert d.selected == "int8"
    assert any("not served under load" in reason for reason in by["casc"].reasons)


def test_the_min_monthly_cost_fallback_picks_on_cost_until_the_load_is_measured():
    from compress.run.load import stand_in_policy

    policy = recipe_dict(objective="min_monthly_cost")
    assert stand_in_policy(policy).budget.objective == "min_cost"
    assert stand_in_policy(recipe_dict()).budget.objective == "min_cost"
    assert policy.budget.objective == "min_monthly_cost"  # the original is left as it is
