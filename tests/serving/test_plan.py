"""compress.serving.plan: instances at the SLO, $/month on demand and reserved + spot, and
the waterfall of what each lever saved."""

import pytest
from pydantic import ValidationError

from compress.recipe.serving import Discount, Price, PricingSpec, TrafficSpec
from compress.serving.plan import cost_plan, describe, instances, plan_row, waterfall
from compress.serving.records import ConfigFigures

PRICING = PricingSpec(instance="test.large", on_demand=Price(usd_per_hour=0.1, source="a price list"),
                      reserved=Discount(discount=0.4, source="a reservation"),
                      spot=Discount(discount=0.7, source="a spot market"), hours_per_month=720.0)
TRAFFIC = TrafficSpec(peak_qps=100.0, mean_qps=40.0, peak_hours_per_day=6.0)


def fig(name, qps, variant="v"):
    return ConfigFigures(name=name, variant=variant, max_valid_qps=qps)


def test_instances_round_up_and_a_rate_at_capacity_fits():
    assert [instances(q, 30.0) for q in (0.0, 1.0, 30.0, 30.0001, 90.0, 91.0)] == [0, 1, 1, 2, 3, 4]


def test_the_off_peak_rate_makes_the_daily_mean():
    # 6 h at 100 and 18 h at r: (600 + 18 r) / 24 = 40 -> r = 20.
    assert TRAFFIC.offpeak_qps == pytest.approx(20.0)
    assert TrafficSpec(peak_qps=50, mean_qps=50, peak_hours_per_day=24).offpeak_qps == 50


def test_a_plan_row_by_hand():
    r = plan_row(fig("batched", 30.0), TRAFFIC, PRICING)
    assert (r.instances_peak, r.instances_base, r.instances_burst) == (4, 1, 3)
    burst_hours = 6 * 720 / 24  # the burst runs the peak hours only
    assert r.on_demand_usd_month == pytest.approx(0.1 * (1 * 720 + 3 * burst_hours))
    assert r.mixed_usd_month == pytest.approx(0.1 * 0.6 * 720 + 0.1 * 0.3 * 3 * burst_hours)
    assert plan_row(fig("batched", None), TRAFFIC, PRICING) is None


def test_the_waterfall_walks_the_levers_from_the_unbatched_baseline():
    configs = [fig("reference", 10.0, "base_onnx"), fig("unbatched", 20.0), fig("batched", 50.0),
               fig("batched_cache", 100.0), fig("cascade", 60.0, "cascade")]
    plan = cost_plan(configs, TRAFFIC, PRICING)
    steps = plan.waterfall
    assert [s.lever for s in steps] == ["variant", "batching", "cache", "cascade", "pricing"]
    by = {r.config: r for r in plan.rows}
    assert steps[0].usd_month_before == by["reference"].on_demand_usd_month == plan.start_usd_month
    for s in steps[:3]:
        assert s.pulled and s.saved_usd_month == pytest.approx(s.usd_month_before - s.usd_month_after) and \
            s.saved_usd_month > 0
    # The cascade serves fewer QPS than batched + cache here: it would cost more, so it is not
    # pulled, and the prices apply to batched + cache.
    assert not steps[3].pulled and steps[3].saved_usd_month < 0
    assert steps[4].before == "batched_cache on demand" and steps[4].usd_month_after == by["batched_cache"].mixed_usd_month
    assert plan.end_usd_month == by["batched_cache"].mixed_usd_month
    pulled = sum(s.saved_usd_month for s in steps if s.pulled)
    assert plan.start_usd_month - pulled == pytest.approx(plan.end_usd_month)
    text = "\n".join(describe(plan))
    assert "a price list" in text and "a reservation" in text and "a spot market" in text and "not pulled" in text


def test_without_a_reference_or_a_measured_configuration_the_waterfall_says_so():
    plan = cost_plan([fig("unbatched", 20.0), fig("batched", None), fig("batched_cache", 40.0)], TRAFFIC, PRICING)
    # batched has no valid load: the step from unbatched to batched + cache spans both levers.
    assert [s.lever for s in plan.waterfall] == ["batching + cache", "pricing"]
    assert plan.waterfall[0].before == "unbatched" and plan.waterfall[0].after == "batched_cache"
    assert any("batched: no valid load" in n for n in plan.notes)
    assert any("the waterfall starts at unbatched" in n for n in plan.notes)
    assert waterfall([]) == []
    # Nothing before batched has a valid load: the chain starts there.
    plan = cost_plan([fig("reference", None), fig("unbatched", None), fig("batched", 50.0), fig("batched_cache", 80.0)],
                     TRAFFIC, PRICING)
    assert [s.lever for s in plan.waterfall] == ["cache", "pricing"] and plan.waterfall[0].before == "batched"
    assert any("starts at batched" in n for n in plan.notes)
    # Batching that costs more is not pulled: the cache is then weighed against unbatched.
    plan = cost_plan([fig("unbatched", 40.0), fig("batched", 20.0), fig("batched_cache", 100.0)], TRAFFIC, PRICING)
    assert [(s.lever, s.before, s.pulled) for s in plan.waterfall] == [
        ("batching", "unbatched", False), ("batching + cache", "unbatched", True), ("pricing", "batched_cache on demand", True)]
    only = cost_plan([fig("batched", 50.0)], TRAFFIC, PRICING)
    assert [s.lever for s in only.waterfall] == ["pricing"]


@pytest.mark.parametrize("kw, problem", [
    ({"peak_qps": 10, "mean_qps": 20}, "exceeds peak_qps"),
    ({"peak_qps": 100, "mean_qps": 10, "peak_hours_per_day": 6}, "raise mean_qps"),
    ({"log": "a.jsonl", "zipf": {"pool": 10}}, "not both"),
    ({"peak_hours_per_day": 0}, "greater than 0"),
])
def test_traffic_that_cannot_be_is_refused(kw, problem):
    with pytest.raises(ValidationError, match=problem):
        TrafficSpec(**kw)


def test_every_price_carries_its_source():
    with pytest.raises(ValidationError):
        Price(usd_per_hour=0.1, source="")
    with pytest.raises(ValidationError):
        Discount(discount=1.0, source="free")
    d = PricingSpec()
    assert d.on_demand.source and d.reserved.source and d.spot.source
