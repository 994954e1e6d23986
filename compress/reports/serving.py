"""report.json's `serving` block rendered: the configurations measured under load side by
side, the capacity and cost plan and its waterfall: the tables and lines that report.md,
the terminal and report.html (compress/reports/html.py, with the plots) share."""

from __future__ import annotations

from compress.serving.records import ConfigFigures, CostPlan, LoadRun, ServingReport

CONFIG_LABEL = {"reference": "baseline (ONNX), unbatched", "unbatched": "unbatched", "batched": "batched",
                "batched_cache": "batched + cache", "cascade": "cascade, batched + cache"}


def _f(v: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "-" if v is None else f"{format(v, fmt)}{suffix}"


def _at_max(c: ConfigFigures) -> LoadRun | None:
    if c.max_valid_qps is None:
        return None
    return next((r for r in c.runs if r.valid and r.target_qps == c.max_valid_qps), None)


def config_rows(s: ServingReport) -> tuple[list[str], list[list[str]]]:
    heads = ["configuration", "variant", "max valid QPS", "knee QPS", "p50/p95/p99 ms at it", "goodput/s",
             "CPU", "batches (size x count)", "cache hits (repeats sent)", "routed", "runs valid/invalid"]
    out = []
    for c in s.configs:
        at = _at_max(c)
        srv = c.server
        valid = sum(r.valid for r in c.runs)
        lat = "-" if at is None else f"{_f(at.p50_ms)} / {_f(at.p95_ms)} / {_f(at.p99_ms)}"
        hits = "-"
        if srv is not None and srv.cache_hit_rate is not None:
            hits = f"{srv.cache_hit_rate:.1%} ({_f(c.duplicate_share_sent, '.1%') if c.duplicate_share_sent is not None else '-'})"
        out.append([
            CONFIG_LABEL.get(c.name, c.name), c.variant,
            "-" if c.max_valid_qps is None else f"{c.max_valid_qps:.1f}", _f(c.knee_qps), lat,
            _f(c.goodput_qps), "-" if c.cpu_utilisation is None else f"{c.cpu_utilisation:.0%}",
            batches(srv), hits,
            "-" if srv is None or srv.routed_share is None else f"{srv.routed_share:.0%}",
            f"{valid}/{len(c.runs) - valid}" if c.runs else ("error" if c.error else "-"),
        ])
    return heads, out


def batches(srv) -> str:
    """The server's batch-size histogram, the commonest sizes first, and the mean."""
    if srv is None or not srv.batch_sizes:
        return "-"
    top = sorted(srv.batch_sizes.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{k}x{v}" for k, v in top[:4]) + (", ..." if len(top) > 4 else "")
    return f"{shown} (mean {srv.mean_batch_size:.2f})" if srv.mean_batch_size is not None else shown


def plan_rows(plan: CostPlan) -> tuple[list[str], list[list[str]]]:
    heads = ["configuration", "QPS an instance", "instances at peak (base + burst)", "$/month on demand",
             "$/month reserved + spot"]
    return heads, [[CONFIG_LABEL.get(r.config, r.config), f"{r.max_valid_qps:.1f}",
                    f"{r.instances_peak} ({r.instances_base} + {r.instances_burst})",
                    f"{r.on_demand_usd_month:,.0f}", f"{r.mixed_usd_month:,.0f}"] for r in plan.rows]


def lever_line(step) -> str:
    move = f"{step.lever}: {step.before} \u2192 {step.after}"
    if step.saved_usd_month >= 0:
        return f"{move}, saves ${step.saved_usd_month:,.0f}/month"
    return f"{move}, would cost ${-step.saved_usd_month:,.0f}/month more: not pulled"


def headline(s: ServingReport) -> str:
    return (f"Served under load: LoadGen's server scenario over HTTP, p{s.percentile * 100:g} at most {s.slo_ms:g} ms, on "
            f"{s.machine or 'this machine'} (one instance of the plan).")


def traffic_line(s: ServingReport) -> str:
    t = s.traffic
    if t.kind == "zipf":
        what = f"Zipf (exponent {t.exponent:g}) over {t.distinct_texts} distinct eval texts, seed {t.seed}"
    else:
        rates = f", its own mean {t.log_mean_qps:.1f} and peak {t.log_peak_qps:.1f} QPS" if t.log_mean_qps else ""
        what = f"the request log {t.log} ({t.log_requests} requests, {t.distinct_texts} distinct texts{rates}), line after line"
    share = ""
    if t.requests:
        parts = []
        if t.duplicate_share_theory is not None:
            parts.append(f"{t.duplicate_share_theory:.1%} expected")
        if t.duplicate_share_sent is not None:
            parts.append(f"{t.duplicate_share_sent:.1%} as sent")
        share = f"; over the {t.requests} requests each configuration received, repeats of a text asked before: {', '.join(parts)}"
    return f"Traffic: {what}{share}."


def plan_lines(plan: CostPlan) -> list[str]:
    p = plan.pricing
    lines = [f"Plan for {plan.peak_qps:g} QPS at the peak ({plan.peak_hours_per_day:g} h a day) and "
             f"{plan.offpeak_qps:.1f} QPS the rest of the day (mean {plan.mean_qps:g}), on {p.instance} at "
             f"${p.on_demand_usd_per_hour:g}/h on demand; the base reserved ({p.reserved_discount:.0%} off), the burst "
             f"on spot ({p.spot_discount:.0%} off)."]
    if plan.start_usd_month is not None and plan.end_usd_month is not None:
        first = plan.waterfall[0].before.removesuffix(" on demand")
        lines.append(f"From ${plan.start_usd_month:,.0f}/month ({CONFIG_LABEL.get(first, first)}, on demand) to "
                     f"${plan.end_usd_month:,.0f}/month.")
    return lines


def sources(plan: CostPlan) -> list[str]:
    p = plan.pricing
    return [f"on demand ${p.on_demand_usd_per_hour:g}/h: {p.on_demand_source}",
            f"reserved {p.reserved_discount:.0%} off: {p.reserved_source}",
            f"spot {p.spot_discount:.0%} off: {p.spot_source}"]


def terminal_lines(s: ServingReport) -> list[str]:
    lines = [headline(s), traffic_line(s)]
    for c in s.configs:
        at = _at_max(c)
        if c.max_valid_qps is None:
            lines.append(f"  {c.name} ({c.variant}): no valid load" + (f": {c.error}" if c.error else ""))
            continue
        lines.append(f"  {c.name} ({c.variant}): {c.max_valid_qps:.1f} QPS valid"
                     + (f", p99 {at.p99_ms:.1f} ms" if at and at.p99_ms is not None else "")
                     + (f", cache hits {c.server.cache_hit_rate:.1%}" if c.server and c.server.cache_hit_rate is not None else ""))
    if s.plan is not None:
        lines += plan_lines(s.plan)
        lines += [f"  {lever_line(w)}" for w in s.plan.waterfall]
        lines += [f"  price: {x}" for x in sources(s.plan)]
    return lines


def markdown_lines(s: ServingReport, md=lambda x: str(x)) -> list[str]:
    """The serving section of report.md; `md` escapes report text for Markdown."""
    lines = ["", "### Serving", "", md(headline(s)), "", md(traffic_line(s)), ""]
    heads, rows = config_rows(s)
    lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    if s.plan is not None:
        lines += ["", *[md(x) for x in plan_lines(s.plan)], ""]
        heads, rows = plan_rows(s.plan)
        lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
        if s.plan.waterfall:
            lines += ["", "Waterfall:", *[f"- {md(lever_line(w))}" for w in s.plan.waterfall]]
        lines += ["", "Prices:", *[f"- {md(x)}" for x in sources(s.plan)]]
        lines += [f"- {md(n)}" for n in s.plan.notes]
    notes = s.notes + [f"{c.name}: {n}" for c in s.configs for n in c.notes] + \
        [f"{c.name}: {c.error}" for c in s.configs if c.error]
    if notes:
        lines += ["", "Serving notes:", *[f"- {md(n)}" for n in notes]]
    lines += ["", "<sub>LoadGen's summary log of every run: serving/&lt;configuration&gt;/run*/mlperf_log_summary.txt "
              "in the run folder.</sub>"]
    return lines
