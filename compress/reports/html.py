"""report.html: one self-contained page (inline SVG plots and CSS, nothing fetched) with
the variant table, the Pareto plots (quality, the task's metric, against p95 latency, $/1K
and size, with the selected variant and the budget lines marked), the latency/throughput
curve per variant,
why the others lost, and the run manifest. Rendered from report.json like the other
reports; matplotlib is imported only here, and only its object API is used (no pyplot, so
no global backend state).
"""

from __future__ import annotations

import io
import json
import math
from html import escape

from compress.decision.decide import Row
from compress.reports.report_json import Report, as_report, headers, table_rows
from compress.reports.serving import (CONFIG_LABEL, config_rows, headline, lever_line, plan_lines, plan_rows, sources,
                                      traffic_line)
from compress.serving.records import CostPlan, ServingReport

REPORT_HTML = "report.html"

VERDICT_COLOUR = {"selected": "#1a9850", "within budget": "#66bd63", "baseline": "#2166ac",
                  "rejected": "#d73027", "failed": "#7f0000", "reported": "#999999"}

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px} th,td{padding:4px 8px;border:1px solid #ddd;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.selected{background:#e3f4e1;font-weight:600} .rejected,.failed{background:#fbe9e7} .reported{color:#888}
.plots{display:flex;flex-wrap:wrap;gap:12px} .plots figure{margin:0}
.banner{padding:10px 14px;border-radius:4px;font-size:16px}
.ok{background:#e3f4e1;border:1px solid #1a9850} .bad{background:#fbe9e7;border:1px solid #d73027}
pre{background:#f7f7f7;padding:10px;overflow:auto;font-size:12px}
"""


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    # A fixed hash salt and no date keep the SVG identical for identical reports.
    with matplotlib.rc_context({"svg.hashsalt": "compress", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: inline SVG


def _figure(width: float = 4.6, height: float = 3.6):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.add_subplot()


def _deciding_rows(report: Report) -> list[Row]:
    d = report.decision
    return [r for r in report.rows if r.device == d.device and r.ok]


def _pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not beaten on both axes (lower x and higher y), sorted by x."""
    front, best_y = [], float("-inf")
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best_y:
            front.append((x, y))
            best_y = y
    return front


def pareto_plot(report: Report, key: str, label: str) -> str:
    """Quality against one cost axis on the deciding device: selected variant starred,
    the quality budget as a horizontal line, an SLO / size limit as a vertical line."""
    m = report.metric
    rows = [r for r in _deciding_rows(report) if r.figure(key) is not None]
    fig, ax = _figure()
    if not rows:
        ax.text(0.5, 0.5, f"no {label} figures", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return _svg(fig)
    b = report.budget
    base = next((r for r in rows if r.id == b.baseline), None)
    # The front keeps the points not beaten on both axes: quality made "higher is better".
    sign = 1.0 if m.higher_is_better else -1.0
    front = [(x, sign * y) for x, y in _pareto_front([(r.figure(key), sign * r.quality) for r in rows])]
    ax.plot([p[0] for p in front], [p[1] for p in front], color="#bbbbbb", lw=1, zorder=1, label="Pareto front")
    for r in rows:
        x, y = r.figure(key), r.quality
        colour = VERDICT_COLOUR.get(r.verdict or "", "#555555")
        marker = {"selected": "*", "baseline": "s"}.get(r.verdict or "", "o")
        size = 220 if r.verdict == "selected" else 60
        ax.scatter([x], [y], s=size, marker=marker, color=colour, zorder=3, edgecolors="black", linewidths=0.5)
        if r.delta_ci95 and r.delta is not None and m.delta_unit != "%":  # the delta's 95% interval, on the quality axis
            lo, hi = r.delta_ci95
            ax.vlines(x, y + lo - r.delta, y + hi - r.delta, color=colour, lw=1, zorder=2)
        ax.annotate(r.id, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    if base is not None:
        drop = b.quality_limit(m.name)
        if m.delta_unit == "%":  # a relative budget (perplexity)
            floor = base.quality * (1.0 + drop / 100.0)
        else:
            floor = base.quality - drop if m.higher_is_better else base.quality + drop
        unit = "pts" if m.delta_unit == "points" else m.delta_unit
        ax.axhline(floor, color="#d73027", ls="--", lw=1,
                   label=f"{m.name} budget ({'-' if m.higher_is_better else '+'}{drop:g} {unit})")
    limit = {"p95_ms": b.latency_p95_ms, "size_mb": b.max_size_mb}.get(key)
    if limit is not None:
        ax.axvline(limit, color="#f46d43", ls=":", lw=1.2, label="SLO" if key == "p95_ms" else "size limit")
    if key == "usd_per_1k":  # values like 0.00002: plain ticks overlap; show them in micro-dollars
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 1e6:g}"))
        label = "micro-$ per 1K inferences"
    ax.set_xlabel(label)
    ax.set_ylabel(f"{m.name} ({m.unit})" if m.unit else m.name)
    ax.set_title(f"{m.name} vs {label} ({report.decision.device})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _svg(fig)


def curve_plot(report: Report, device: str) -> str:
    """p95 batch latency against throughput as the batch size grows, per variant; the
    operating point used for $/1K circled, the SLO as a horizontal line."""
    rows = [r for r in report.rows if r.device == device and r.ok and r.batches]
    fig, ax = _figure(6.4, 4.2)
    for r in rows:
        bs = sorted(r.batches or [], key=lambda x: x.batch_size)
        line = ax.plot([x.throughput for x in bs], [x.p95_ms for x in bs], marker="o", ms=4, label=r.id)[0]
        for x in bs:
            ax.annotate(f"b{x.batch_size}", (x.throughput, x.p95_ms), textcoords="offset points",
                        xytext=(4, -9), fontsize=7, color=line.get_color())
        op = r.operating_point
        if op:
            ax.scatter([op.throughput], [op.p95_ms], s=140, facecolors="none", edgecolors=line.get_color(),
                       linewidths=1.5, zorder=3)
    slo = report.budget.latency_p95_ms
    if slo is not None:
        ax.axhline(slo, color="#f46d43", ls=":", lw=1.2, label="SLO (p95)")
    ax.set_xlabel(f"throughput ({report.task_info.throughput_unit.replace('seq/s', 'sequences/s')})")
    ax.set_ylabel("p95 batch latency (ms)")
    ax.set_title(f"latency / throughput by batch size ({device}; circled: $/1K operating point)", fontsize=10)
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=7)
    return _svg(fig)


def _safe(plot, *args) -> str:
    """A plot that cannot be drawn must not cost the report: say why in its place."""
    try:
        return plot(*args)
    except Exception as exc:  # matplotlib missing, or figures it cannot draw
        return f"<p><em>plot unavailable: {escape(exc.__class__.__name__)}: {escape(str(exc)[:200])}</em></p>"


def _table(report: Report) -> str:
    routed = any(r.routed_share is not None for r in report.rows)
    base = headers(report)
    heads = base + (["to large"] if routed else [])
    out = ["<table><tr>" + "".join(f"<th class='{'l' if i in (0, 1, 2, len(base) - 1) else ''}'>{escape(h)}</th>"
                                   for i, h in enumerate(heads)) + "</tr>"]
    for cells, r in zip(table_rows(report), report.rows):
        if routed:
            cells = cells + ["-" if r.routed_share is None else f"{r.routed_share:.0%}"]
        tds = "".join(f"<td class='{'l' if i in (0, 1, 2, len(base) - 1) else ''}'>{escape(c)}</td>"
                      for i, c in enumerate(cells))
        out.append(f"<tr class='{escape((r.verdict or '').replace(' ', '-'))}'>{tds}</tr>")
    return "\n".join(out + ["</table>"])


def _batches_table(report: Report) -> str:
    unit = escape(report.task_info.throughput_unit)
    out = ["<table><tr><th class='l'>variant</th><th class='l'>device</th><th>batch</th>"
           f"<th>{unit}</th><th>p50 ms</th><th>p95 ms</th><th>padding</th><th>$/1K</th></tr>"]
    for r in report.rows:
        if not r.ok:
            continue
        price = r.price.usd_per_hour if r.price is not None else None
        for b in sorted(r.batches or [], key=lambda x: x.batch_size):
            cost = f"${price / 3600 / b.throughput * 1000:.5f}" if price and b.throughput > 0 else "-"
            mark = " *" if r.operating_point and r.operating_point.batch_size == b.batch_size else ""
            out.append(f"<tr><td class='l'>{escape(r.id)}</td><td class='l'>{escape(r.device)}</td>"
                       f"<td>{b.batch_size}{mark}</td><td>{b.throughput:,.0f}</td><td>{b.p50_ms:.2f}</td>"
                       f"<td>{b.p95_ms:.2f}</td><td>{b.padding_waste or 0:.0%}</td><td>{cost}</td></tr>")
    return "\n".join(out + ["</table><p><small>* the operating point used for $/1K (best throughput whose p95 "
                            "batch latency meets the SLO).</small></p>"])


def render(report: "Report | dict") -> str:
    report = as_report(report)
    d, b, metric = report.decision, report.budget, report.metric
    if d.selected:
        banner = (f"<div class='banner ok'>Deploy <b>{escape(d.selected)}</b> ({escape(d.objective)} on "
                  f"{escape(d.device)})</div>")
    else:
        banner = (f"<div class='banner bad'><b>No compressed variant is within budget</b> (exit code "
                  f"{d.exit_code})</div>")
    limits = [f"max {escape(metric.name)} drop {b.quality_limit(metric.name):g} {escape(metric.delta_unit)} (gate on {b.gate_on})"]
    if b.latency_p95_ms:
        limits.append(f"p95 &le; {b.latency_p95_ms:g} ms")
    if b.max_size_mb:
        limits.append(f"size &le; {b.max_size_mb:g} MB")
    why = [f"<li><code>{escape(r.id)}</code> ({escape(r.device)}): {escape('; '.join(r.reasons))}</li>"
           for r in report.rows if r.verdict in ("rejected", "within budget", "failed") and r.reasons]
    notes = [escape(n) for n in report.notes + d.notes]
    notes += [f"<code>{escape(r.id)}</code> ({escape(r.device)}): {escape(n)}" for r in report.rows for n in r.notes]
    pareto = "".join(f"<figure>{_safe(pareto_plot, report, key, label)}</figure>"
                     for key, label in (("p95_ms", "p95 latency at batch 1 (ms)"), ("usd_per_1k", "$ per 1K inferences"),
                                        ("size_mb", "size on disk (MB)")))
    curves = "".join(f"<figure>{_safe(curve_plot, report, dev)}</figure>" for dev in report.devices)
    m = report.manifest.model_dump(exclude_unset=True)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>compress: {escape(report.recipe)}</title><style>{CSS}</style></head><body>",
        f"<h1>compress: {escape(report.recipe)}</h1>", banner,
        f"<p>Budget: {', '.join(limits)}; baseline <code>{escape(b.baseline)}</code>.</p>",
        "<h2>Variants</h2>", _table(report),
        "<h2>Trade-offs</h2><div class='plots'>", pareto, "</div>",
        f"<p><small>Star: selected; square: baseline; bars: 95% bootstrap interval of the {escape(metric.name)} "
        f"delta; dashed: the {escape(metric.name)} budget; dotted: the SLO or size limit.</small></p>",
        "<h2>Latency and throughput</h2><div class='plots'>", curves, "</div>", _batches_table(report),
        "<h2>Why the others lost</h2>", f"<ul>{''.join(why)}</ul>" if why else "<p>-</p>",
    ]
    if report.serving is not None:
        parts.append(serving_section(report.serving))
    if notes:
        parts += ["<h2>Notes</h2><ul>", "".join(f"<li>{n}</li>" for n in notes), "</ul>"]
    parts += ["<h2>Manifest</h2><details><summary>versions, hardware, threads, seeds, data, recipe</summary>",
              f"<pre>{escape(json.dumps(m, indent=1, default=str))}</pre></details>", "</body></html>"]
    return "\n".join(parts)


# --- the serving block (report.json `serving`, schema 7) ------------------------------------


def latency_plot(s: "ServingReport") -> str:
    """p99 (solid) and p50 (dotted) latency against the offered load, per configuration;
    valid runs filled, invalid hollow; the SLO as a line, each knee marked."""
    fig, ax = _figure(6.4, 4.2)
    for c in s.configs:
        runs = sorted((r for r in c.runs if r.p99_ms is not None), key=lambda r: r.target_qps)
        if not runs:
            continue
        x = [r.target_qps for r in runs]
        line = ax.plot(x, [r.p99_ms for r in runs], marker=None, lw=1.4, label=CONFIG_LABEL.get(c.name, c.name))[0]
        colour = line.get_color()
        ax.plot(x, [float("nan") if r.p50_ms is None else r.p50_ms for r in runs], ls=":", lw=1.0, color=colour)
        for r in runs:
            ax.scatter([r.target_qps], [r.p99_ms], s=30, zorder=3, edgecolors=colour,
                       facecolors=colour if r.valid else "none", linewidths=1.2)
        if c.knee_qps is not None:
            ax.axvline(c.knee_qps, color=colour, ls="--", lw=0.6, alpha=0.6)
    ax.axhline(s.slo_ms, color="#f46d43", ls="-.", lw=1.2, label=f"SLO (p{s.percentile * 100:g})")
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    def plain(v, _):  # 20, 50, 100: not 2x10^1; minor ticks labelled at 2 and 5 only
        lead = v / 10 ** math.floor(math.log10(v)) if v > 0 else 0
        return f"{v:g}" if round(lead) in (1, 2, 5) else ""

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(plain))
        axis.set_minor_formatter(FuncFormatter(plain))
    ax.set_xlabel("offered load (QPS, Poisson)")
    ax.set_ylabel("latency (ms): p99 solid, p50 dotted")
    ax.set_title("latency against load (filled: VALID; dashed: knee)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _svg(fig)


def waterfall_plot(plan: "CostPlan") -> str:
    """$/month from the unbatched baseline on demand down to the plan, one bar per lever pulled."""
    steps = [w for w in plan.waterfall if w.pulled]
    fig, ax = _figure(6.4, 4.0)
    if not steps:
        ax.text(0.5, 0.5, "no plan", ha="center", va="center", transform=ax.transAxes)
        return _svg(fig)
    labels = ["start"] + [w.lever for w in steps] + ["plan"]
    start, end = steps[0].usd_month_before, steps[-1].usd_month_after
    ax.bar([0], [start], color="#4575b4")
    for i, w in enumerate(steps, 1):
        lo, hi = sorted((w.usd_month_before, w.usd_month_after))
        ax.bar([i], [hi - lo], bottom=[lo], color="#1a9850" if w.saved_usd_month >= 0 else "#d73027")
        ax.annotate(f"-${w.saved_usd_month:,.0f}", (i, hi), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=7)
    ax.bar([len(labels) - 1], [end], color="#4575b4")
    ax.set_xticks(range(len(labels)), [x.replace(" + ", "\n+ ") for x in labels], fontsize=8)
    ax.set_ylabel("$ per month")
    ax.set_title("what each lever saved", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    return _svg(fig)


def _plain_table(heads: list[str], rows: list[list[str]]) -> str:
    out = ["<table><tr>" + "".join(f"<th class='{'l' if i < 2 else ''}'>{escape(h)}</th>" for i, h in enumerate(heads))
           + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td class='{'l' if i < 2 else ''}'>{escape(c)}</td>" for i, c in enumerate(row))
                   + "</tr>")
    return "\n".join(out + ["</table>"])


def serving_section(s: "ServingReport") -> str:
    parts = ["<h2>Serving</h2>", f"<p>{escape(headline(s))}</p>", f"<p>{escape(traffic_line(s))}</p>",
             _plain_table(*config_rows(s)), "<div class='plots'>", f"<figure>{_safe(latency_plot, s)}</figure>"]
    if s.plan is not None:
        parts.append(f"<figure>{_safe(waterfall_plot, s.plan)}</figure>")
    parts.append("</div>")
    if s.plan is not None:
        parts += [f"<p>{escape(' '.join(plan_lines(s.plan)))}</p>", _plain_table(*plan_rows(s.plan))]
        if s.plan.waterfall:
            parts.append("<ul>" + "".join(f"<li>{escape(lever_line(w))}</li>" for w in s.plan.waterfall) + "</ul>")
        parts.append("<p><small>Prices: " + "; ".join(escape(x) for x in sources(s.plan) + s.plan.notes)
                     + "</small></p>")
    notes = s.notes + [f"{c.name}: {n}" for c in s.configs for n in c.notes] + \
        [f"{c.name}: {c.error}" for c in s.configs if c.error]
    if notes:
        parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
    return "\n".join(parts)
