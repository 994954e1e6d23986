"""`compress compare RUN_A RUN_B`: what changed per variant between two runs (say the main
branch and a pull request): quality (the task's metric: accuracy for classification),
latency, size and $/1K, with the changes that are beyond measurement noise flagged as
regressions.

Noise model:
- Quality: a 95% interval of quality(B) - quality(A). When both runs kept their
  per-example predictions (bench/<id>.<device>.json) and scored the same eval data, the
  paired bootstrap of decision.py over the task's per-example scores; otherwise a normal
  approximation of the difference of two independent proportions (wider, as it cannot use
  the pairing). A regression is an interval entirely on the worse side of zero.
- Latency: see `timing_noise`.
- Size is deterministic: growth beyond 1% (metadata, tokenizer-free files) is flagged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from compress.decision.decide import Row, paired_bootstrap
from compress.reports.report_json import Report, read_report
from compress.core.stats import Z95
from compress.core.task import get_task

SIZE_TOLERANCE = 0.01
TIMING_FLOOR = 0.05


def timing_noise(*spreads: float) -> float:
    """Relative change below which a timing change is not called a regression:
    max(5%, the larger relative p95-p50 spread of the two runs).

    Why: the two runs' medians are taken at different times, and the shift between them
    comes from the same sources (scheduling, frequency, cache state, neighbours on a
    shared host) that widen each run's distribution; a run whose p95 lies 30% above its
    p50 cannot resolve a 10% shift of the median. The 5% floor covers what the spread does
    not show on a quiet machine: slow drift between runs (thermal state, clock boost)."""
    return max([TIMING_FLOOR, *[s for s in spreads if s is not None and math.isfinite(s)]])


def _spread(p50: float, p95: float) -> float:
    return (p95 - p50) / p50 if p50 > 0 else float("inf")


def _run_dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def _predictions(run_dir: Path, report: Report, vid: str, device: str) -> np.ndarray | None:
    """The task's per-example scores [N] of a variant (classification: correct or not), from
    the run's benchmark folder (its measurement's predictions and the eval file), if kept."""
    from compress.bench.benchmark import cached_measurement

    fp = report.manifest.data.get("eval_fingerprint")
    bench = run_dir / "bench"
    meas, evalf = bench / f"{vid}.{device}.json", bench / f"eval-{(fp or '')[:16]}.jsonl"
    if not fp or not meas.is_file() or not evalf.is_file():
        return None
    task = get_task(report.task_info.name)
    # A measurement edited or forged since the run (its checksum no longer matches) is not used.
    m = cached_measurement(meas, None)
    if m is None:
        return None
    try:
        _, targets = task.read_eval([json.loads(line) for line in evalf.read_text().splitlines() if line])
    except (KeyError, ValueError, OSError, AttributeError, TypeError):
        return None
    if m.predictions is None or len(m.predictions) != len(targets):
        return None
    return task.example_scores(np.array(m.predictions), targets)


def quality_interval(ra: Row, rb: Row, a: Report, b: Report, dir_a: Path, dir_b: Path,
                      samples: int) -> tuple[list[float], str]:
    """95% interval of quality(B) - quality(A) in the metric's unit, and how it was obtained."""
    fp_a = a.manifest.data.get("eval_fingerprint")
    fp_b = b.manifest.data.get("eval_fingerprint")
    if fp_a and fp_a == fp_b:
        pa = _predictions(dir_a, a, ra.id, ra.device)
        pb = _predictions(dir_b, b, rb.id, rb.device)
        if pa is not None and pb is not None:
            lo, hi = paired_bootstrap(pa, pb, samples, scale=get_task(b.task_info.name).scale)
            return [lo, hi], "paired bootstrap"
    n_a = a.manifest.data.get("eval_examples") or 0
    n_b = b.manifest.data.get("eval_examples") or 0
    change = rb.quality - ra.quality
    if not n_a or not n_b:
        return [-math.inf, math.inf], "unknown eval size"
    # A normal approximation of two independent proportions: accuracy-like metrics only.
    p, q = ra.quality / 100, rb.quality / 100
    se = math.sqrt(p * (1 - p) / n_a + q * (1 - q) / n_b) * 100
    return [change - Z95 * se, change + Z95 * se], "unpaired normal approximation"


def _rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else (b - a) / a


def compare(path_a: Path, path_b: Path) -> dict:
    a, b = read_report(path_a), read_report(path_b)
    dir_a, dir_b = _run_dir(path_a), _run_dir(path_b)
    metric = b.metric
    notes = []
    if a.task_info.name != b.task_info.name:
        notes.append(f"the runs are of different tasks ({a.task_info.name} vs {b.task_info.name})")
    cpu_a = a.manifest.hardware.get("cpu", {}).get("model")
    cpu_b = b.manifest.hardware.get("cpu", {}).get("model")
    same_machine = cpu_a == cpu_b and a.manifest.threads == b.manifest.threads
    if not same_machine:
        notes.append(f"the runs were timed on different machines or thread counts ({cpu_a} vs {cpu_b}); "
                     f"latency and $/1K changes are shown but not flagged")
    if a.manifest.data.get("eval_fingerprint") != b.manifest.data.get("eval_fingerprint"):
        notes.append(f"the runs scored different eval data: {metric.name} changes mix model and data changes")
    # A report without the field is method 1: accuracy scored on the largest batch's pass.
    method_a, method_b = (r.manifest.benchmark_method or 1 for r in (a, b))
    if method_a != method_b:
        notes.append(f"the runs were measured by different benchmark methods ({method_a} vs {method_b}: "
                     f"accuracy is scored at batch 1 from method 2 on, batch-1 latency is a median over "
                     f"rounds from method 3 on, speed-ups come from paired rounds from method 4 on); accuracy and latency changes mix model and method")
    samples = int(b.manifest.recipe.get("benchmark", {}).get("bootstrap_samples", 1000))

    rows_a = {(r.id, r.device): r for r in a.rows}
    rows_b = {(r.id, r.device): r for r in b.rows}
    out = []
    for key in [k for k in rows_b if k in rows_a]:
        ra, rb = rows_a[key], rows_b[key]
        row: dict = {"id": key[0], "device": key[1], "regressions": []}
        if not (ra.ok and rb.ok):
            row["status"] = f"A {'ok' if ra.ok else 'failed'}, B {'ok' if rb.ok else 'failed'}"
            if ra.ok and not rb.ok:
                row["regressions"].append(f"benchmark now fails: {rb.error}")
            out.append(row)
            continue
        ci, how = quality_interval(ra, rb, a, b, dir_a, dir_b, samples)
        row["quality"] = {"a": ra.quality, "b": rb.quality, "change": rb.quality - ra.quality, "ci95": ci, "method": how}
        kindest = ci[1] if metric.higher_is_better else ci[0]  # the end nearest "no worse"
        if metric.drop(kindest) > 0:  # the whole interval on the worse side of zero
            row["regressions"].append(f"{metric.name} {row['quality']['change']:+.2f} {metric.delta_unit} "
                                      f"(95% interval {ci[0]:+.2f}..{ci[1]:+.2f}, {how})")
        la, lb = ra.latency_ms, rb.latency_ms
        noise = timing_noise(_spread(la.p50, la.p95), _spread(lb.p50, lb.p95))
        row["p50_ms"] = {"a": la.p50, "b": lb.p50, "rel": _rel(la.p50, lb.p50), "noise": noise}
        row["p95_ms"] = {"a": la.p95, "b": lb.p95, "rel": _rel(la.p95, lb.p95)}
        if same_machine and row["p50_ms"]["rel"] is not None and row["p50_ms"]["rel"] > noise:
            row["regressions"].append(f"p50 latency {row['p50_ms']['rel']:+.0%} (noise {noise:.0%})")
        row["size_mb"] = {"a": ra.size_mb, "b": rb.size_mb, "rel": _rel(ra.size_mb, rb.size_mb)}
        if row["size_mb"]["rel"] is not None and row["size_mb"]["rel"] > SIZE_TOLERANCE:
            row["regressions"].append(f"size {row['size_mb']['rel']:+.1%}")
        ca, cb = ra.usd_per_1k, rb.usd_per_1k
        # $/1K is price / throughput at the operating point: as noisy as that batch's timings.
        cost_noise = timing_noise(*[_spread(op.p50_ms, op.p95_ms) for op in (ra.operating_point, rb.operating_point)
                                    if op is not None])
        row["usd_per_1k"] = {"a": ca, "b": cb, "rel": _rel(ca, cb), "noise": cost_noise}
        if same_machine and row["usd_per_1k"]["rel"] is not None and row["usd_per_1k"]["rel"] > cost_noise:
            row["regressions"].append(f"$/1K {row['usd_per_1k']['rel']:+.0%} (noise {cost_noise:.0%})")
        out.append(row)

    da, db = a.decision, b.decision
    if da.selected != db.selected:
        notes.append(f"the pick changed: {da.selected or 'none within budget'} -> "
                     f"{db.selected or 'none within budget'}")
    return {
        "a": str(path_a), "b": str(path_b), "metric": metric.model_dump(), "rows": out, "notes": notes,
        "added": [f"{i} ({d})" for (i, d) in rows_b if (i, d) not in rows_a],
        "removed": [f"{i} ({d})" for (i, d) in rows_a if (i, d) not in rows_b],
        "decision": {"a": da.selected, "b": db.selected},
        "regressions": sum(len(r["regressions"]) for r in out),
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def headers(cmp: dict) -> list[str]:
    """Column headings; the quality columns are named after the metric's short label ("acc")."""
    label = cmp.get("metric", {}).get("label") or cmp.get("metric", {}).get("name") or "quality"
    short = label.split()[0]
    return ["variant", "device", f"{short} A", f"{short} B", "change [95% CI]", "p50 ms A -> B", "size", "$/1K", "flag"]


def table_rows(cmp: dict) -> list[list[str]]:
    rows = []
    for r in cmp["rows"]:
        if "quality" not in r:
            rows.append([r["id"], r["device"], "-", "-", r.get("status", "-"), "-", "-", "-",
                         "REGRESSION" if r["regressions"] else ""])
            continue
        acc = r["quality"]
        rows.append([
            r["id"], r["device"], f"{acc['a']:.2f}", f"{acc['b']:.2f}",
            f"{acc['change']:+.2f} [{acc['ci95'][0]:+.2f}, {acc['ci95'][1]:+.2f}]",
            f"{r['p50_ms']['a']:.2f} -> {r['p50_ms']['b']:.2f} ({_pct(r['p50_ms']['rel'])})",
            _pct(r["size_mb"]["rel"]), _pct(r["usd_per_1k"]["rel"]),
            "REGRESSION" if r["regressions"] else "",
        ])
    return rows


def markdown(cmp: dict) -> str:
    heads = headers(cmp)
    lines = ["## compress compare", "", f"A: `{cmp['a']}`  B: `{cmp['b']}`", "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in table_rows(cmp)]
    regs = [f"- `{r['id']}` ({r['device']}): {x}" for r in cmp["rows"] for x in r["regressions"]]
    lines += ["", "**Regressions beyond noise:**" if regs else "No regression beyond noise.", *regs]
    extra = cmp["notes"] + [f"new in B: {x}" for x in cmp["added"]] + [f"gone in B: {x}" for x in cmp["removed"]]
    if extra:
        lines += ["", "Notes:", *[f"- {n}" for n in extra]]
    return "\n".join(lines) + "\n"


def print_comparison(cmp: dict, console=None) -> None:
    from rich.table import Table

    from compress.core.console import out

    console = console or out
    table = Table(title=f"{cmp['a']} (A) -> {cmp['b']} (B)", title_justify="left")
    for h in headers(cmp):
        table.add_column(h, justify="left" if h in ("variant", "device", "flag") else "right")
    for row, r in zip(table_rows(cmp), cmp["rows"]):
        table.add_row(*row, style="red" if r["regressions"] else "")
    console.print(table)
    for r in cmp["rows"]:
        for x in r["regressions"]:
            console.print(f"  [red]{r['id']} ({r['device']}):[/red] {x}", highlight=False)
    for n in cmp["notes"] + [f"new in B: {x}" for x in cmp["added"]] + [f"gone in B: {x}" for x in cmp["removed"]]:
        console.print(f"  [yellow]note:[/yellow] {n}", highlight=False)
    console.print(f"{cmp['regressions']} regression(s) beyond noise", highlight=False)
