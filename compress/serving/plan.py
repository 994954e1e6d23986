"""The capacity and cost plan from a measured load: for the recipe's traffic, the instances
each configuration needs at the SLO and what they cost a month, on demand and with
reserved capacity for the base and spot for the burst, and a waterfall of what each lever
saved from the unbatched baseline.

The day is the traffic's two rates: `peak_qps` for `peak_hours_per_day`, and the rate that
makes `mean_qps` the rest of the day. The base (the off-peak rate) runs all day; the burst
(the instances the peak needs beyond the base) runs the peak hours. An instance is the
machine the load ran on, so its capacity is the configuration's highest valid QPS.
"""

from __future__ import annotations

import math

from compress.recipe.serving import PricingSpec, TrafficSpec
from compress.serving.records import ConfigFigures, CostPlan, PlanRow, PricingInfo, WaterfallStep

# The waterfall's chain: each lever swaps one configuration for the next (or, last, the prices).
CHAIN = (("variant", "reference", "unbatched"), ("batching", "unbatched", "batched"),
         ("cache", "batched", "batched_cache"), ("cascade", "batched_cache", "cascade"))
ORDER = ("reference", "unbatched", "batched", "batched_cache", "cascade")


def instances(qps: float, capacity: float) -> int:
    """Instances that serve `qps` within the SLO, each good for `capacity` QPS."""
    if qps <= 0:
        return 0
    return int(math.ceil(qps / capacity - 1e-9))  # 1e-9: a rate exactly at capacity needs no extra instance


def plan_row(fig: ConfigFigures, traffic: TrafficSpec, pricing: PricingSpec) -> PlanRow | None:
    cap = fig.max_valid_qps
    if cap is None or cap <= 0:
        return None
    peak = instances(traffic.peak_qps, cap)
    base = instances(traffic.offpeak_qps, cap)
    burst = max(peak - base, 0)
    hours = pricing.hours_per_month
    burst_hours = traffic.peak_hours_per_day * hours / 24.0
    price = pricing.on_demand.usd_per_hour
    on_demand = price * (base * hours + burst * burst_hours)
    mixed = (price * (1.0 - pricing.reserved.discount) * base * hours
             + price * (1.0 - pricing.spot.discount) * burst * burst_hours)
    return PlanRow(config=fig.name, variant=fig.variant, max_valid_qps=cap, instances_peak=peak,
                   instances_base=base, instances_burst=burst, on_demand_usd_month=on_demand,
                   mixed_usd_month=mixed)


def waterfall(rows: list[PlanRow]) -> list[WaterfallStep]:
    """What each lever saved, in order: variant, batching, cache, cascade on demand, then
    the prices (reserved base, spot burst) on what the chain ends at. A lever that would
    cost more is shown and not pulled: the chain goes on from the configuration before it.
    Where a configuration has no plan (not measured, or no valid load), the step over it
    names every lever it spans ("variant + batching")."""
    by = {r.config: r for r in rows}
    present = [c for c in ORDER if c in by]
    if not present:
        return []
    current = by[present[0]]
    steps: list[WaterfallStep] = []
    for target in present[1:]:
        nxt = by[target]
        lo, hi = ORDER.index(current.config), ORDER.index(target)
        lever = " + ".join(name for name, _, after in CHAIN if lo < ORDER.index(after) <= hi)
        before = current.on_demand_usd_month
        pulled = nxt.on_demand_usd_month <= before
        steps.append(WaterfallStep(lever=lever, before=current.config, after=target, usd_month_before=before,
                                   usd_month_after=nxt.on_demand_usd_month,
                                   saved_usd_month=before - nxt.on_demand_usd_month, pulled=pulled))
        if pulled:
            current = nxt
    steps.append(WaterfallStep(lever="pricing", before=f"{current.config} on demand",
                               after=f"{current.config} reserved + spot", usd_month_before=current.on_demand_usd_month,
                               usd_month_after=current.mixed_usd_month,
                               saved_usd_month=current.on_demand_usd_month - current.mixed_usd_month,
                               pulled=True))
    return steps


def cost_plan(configs: list[ConfigFigures], traffic: TrafficSpec, pricing: PricingSpec) -> CostPlan:
    info = PricingInfo(
        instance=pricing.instance, on_demand_usd_per_hour=pricing.on_demand.usd_per_hour,
        on_demand_source=pricing.on_demand.source, reserved_discount=pricing.reserved.discount,
        reserved_source=pricing.reserved.source, spot_discount=pricing.spot.discount, spot_source=pricing.spot.source,
        hours_per_month=pricing.hours_per_month,
    )
    plan = CostPlan(peak_qps=traffic.peak_qps, mean_qps=traffic.mean_qps, offpeak_qps=traffic.offpeak_qps,
                    peak_hours_per_day=traffic.peak_hours_per_day, pricing=info)
    for fig in configs:
        row = plan_row(fig, traffic, pricing)
        if row is None:
            plan.notes.append(f"{fig.name}: no valid load measured, so no plan: "
                              + (fig.error or "even the lowest load tried missed the SLO"))
        else:
            plan.rows.append(row)
    plan.waterfall = waterfall(plan.rows)
    if plan.waterfall:
        plan.start_usd_month = plan.waterfall[0].usd_month_before
        plan.end_usd_month = plan.waterfall[-1].usd_month_after
        first = plan.waterfall[0].before.removesuffix(" on demand")
        if first != "reference":
            plan.notes.append(f"the waterfall starts at {first}, the first configuration with a valid load (the "
                              f"reference is the baseline's ONNX export unbatched, where the run has one): the levers "
                              f"before it are not shown")
    return plan


def describe(plan: CostPlan) -> list[str]:
    """The plan in lines: the traffic, each configuration's instances and cost, the
    waterfall, and where every price comes from."""
    p = plan.pricing
    lines = [f"plan: {plan.peak_qps:g} QPS for {plan.peak_hours_per_day:g} h a day, {plan.offpeak_qps:.1f} QPS the "
             f"rest (mean {plan.mean_qps:g}), on {p.instance} at ${p.on_demand_usd_per_hour:g}/h"]
    for r in plan.rows:
        lines.append(f"  {r.config} ({r.variant}): {r.max_valid_qps:.1f} QPS an instance at the SLO; {r.instances_peak} "
                     f"at the peak ({r.instances_base} base + {r.instances_burst} burst): ${r.on_demand_usd_month:,.0f}"
                     f"/month on demand, ${r.mixed_usd_month:,.0f} with the base reserved and the burst on spot")
    for s in plan.waterfall:
        lines.append(f"  {s.lever}: {s.before} -> {s.after}: " + (f"saves ${s.saved_usd_month:,.0f}/month" if s.pulled
                     else f"would cost ${-s.saved_usd_month:,.0f}/month more: not pulled"))
    lines += [f"  prices: on demand: {p.on_demand_source}", f"  reserved ({p.reserved_discount:.0%} off): "
              f"{p.reserved_source}", f"  spot ({p.spot_discount:.0%} off): {p.spot_source}"]
    lines += [f"  note: {n}" for n in plan.notes]
    return lines
