"""`compress compare RUN_A RUN_B`: what changed per variant between two runs (say the main
branch and a pull request): accuracy, latency, size and $/1K, with the changes that are
beyond measurement noise flagged as regressions.

Noise model:
- Accuracy: a 95% interval of accuracy(B) - accuracy(A). When both runs kept their
  per-example predictions (bench/<id>.<device>.json) and scored the same eval data, the
  paired bootstrap of decision.py; otherwise a normal approximation of the difference of
  two independent proportions (wider, as it cannot use the pairing). A regression is an
  interval entirely below zero.
- Latency: see `timing_noise`.
- Size is deterministic: growth beyond 1% (metadata, tokenizer-free files) is flagged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from compress.decision import paired_bootstrap
from compress.report import read_report

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


def _predictions(run_dir: Path, report: dict, vid: str, device: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(predictions [N], labels [N]) of a variant from the run's benchmark folder, if kept."""
    fp = report.get("manifest", {}).get("data", {}).get("eval_fingerprint")
    bench = run_dir / "bench"
    meas, evalf = bench / f"{vid}.{device}.json", bench / f"eval-{(fp or '')[:16]}.jsonl"
    if not fp or not meas.is_file() or not evalf.is_file():
        return None
    try:
        preds = np.array(json.loads(meas.read_text())["predictions"])
        labels = np.array([json.loads(line)["label"] for line in evalf.read_text().splitlines() if line])
    except (KeyError, ValueError, OSError):
        return None
    return (preds, labels) if len(preds) == len(labels) else None


def accuracy_interval(ra: dict, rb: dict, a: dict, b: dict, dir_a: Path, dir_b: Path,
                      samples: int) -> tuple[list[float], str]:
    """95% interval of accuracy(B) - accuracy(A) in points, and how it was obtained."""
    fp_a = a.get("manifest", {}).get("data", {}).get("eval_fingerprint")
    fp_b = b.get("manifest", {}).get("data", {}).get("eval_fingerprint")
    if fp_a and fp_a == fp_b:
        pa = _predictions(dir_a, a, ra["id"], ra["device"])
        pb = _predictions(dir_b, b, rb["id"], rb["device"])
        if pa is not None and pb is not None:
            lo, hi = paired_bootstrap(pa[0] == pa[1], pb[0] == pb[1], samples)
            return [lo, hi], "paired bootstrap"
    n_a = a.get("manifest", {}).get("data", {}).get("eval_examples") or 0
    n_b = b.get("manifest", {}).get("data", {}).get("eval_examples") or 0
    change = rb["accuracy"] - ra["accuracy"]
    if not n_a or not n_b:
        return [-math.inf, math.inf], "unknown eval size"
    p, q = ra["accuracy"] / 100, rb["accuracy"] / 100
    se = math.sqrt(p * (1 - p) / n_a + q * (1 - q) / n_b) * 100
    return [change - 1.96 * se, change + 1.96 * se], "unpaired normal approximation"


def _rel(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else (b - a) / a


def compare(path_a: Path, path_b: Path) -> dict:
    a, b = read_report(path_a), read_report(path_b)
    dir_a, dir_b = _run_dir(path_a), _run_dir(path_b)
    notes = []
    cpu_a = a.get("manifest", {}).get("hardware", {}).get("cpu", {}).get("model")
    cpu_b = b.get("manifest", {}).get("hardware", {}).get("cpu", {}).get("model")
    same_machine = cpu_a == cpu_b and a.get("manifest", {}).get("threads") == b.get("manifest", {}).get("threads")
    if not same_machine:
        notes.append(f"the runs were timed on different machines or thread counts ({cpu_a} vs {cpu_b}); "
                     f"latency and $/1K changes are shown but not flagged")
    fp_a = a.get("manifest", {}).get("data", {}).get("eval_fingerprint")
    if fp_a != b.get("manifest", {}).get("data", {}).get("eval_fingerprint"):
        notes.append("the runs scored different eval data: accuracy changes mix model and data changes")
    # A report without the field is method 1: accuracy scored on the largest batch's pass.
    method_a, method_b = (r.get("manifest", {}).get("benchmark_method", 1) for r in (a, b))
    if method_a != method_b:
        notes.append(f"the runs were measured by different benchmark methods ({method_a} vs {method_b}: "
                     f"accuracy is scored at batch 1 from method 2 on, batch-1 latency is a median over "
                     f"rounds from method 3 on, speed-ups come from paired rounds from method 4 on); accuracy and latency changes mix model and method")
    samples = int(b.get("manifest", {}).get("recipe", {}).get("benchmark", {}).get("bootstrap_samples", 1000))

    rows_a = {(r["id"], r["device"]): r for r in a["rows"]}
    rows_b = {(r["id"], r["device"]): r for r in b["rows"]}
    out = []
    for key in [k for k in rows_b if k in rows_a]:
        ra, rb = rows_a[key], rows_b[key]
        row: dict = {"id": key[0], "device": key[1], "regressions": []}
        if not (ra["ok"] and rb["ok"]):
            row["status"] = f"A {'ok' if ra['ok'] else 'failed'}, B {'ok' if rb['ok'] else 'failed'}"
            if ra["ok"] and not rb["ok"]:
                row["regressions"].append(f"benchmark now fails: {rb.get('error')}")
            out.append(row)
            continue
        ci, how = accuracy_interval(ra, rb, a, b, dir_a, dir_b, samples)
        row["accuracy"] = {"a": ra["accuracy"], "b": rb["accuracy"], "change": rb["accuracy"] - ra["accuracy"],
                           "ci95": ci, "method": how}
        if ci[1] < 0:
            row["regressions"].append(f"accuracy {row['accuracy']['change']:+.2f} points "
                                      f"(95% interval {ci[0]:+.2f}..{ci[1]:+.2f}, {how})")
        la, lb = ra["latency_ms"], rb["latency_ms"]
        noise = timing_noise(_spread(la["p50"], la["p95"]), _spread(lb["p50"], lb["p95"]))
        row["p50_ms"] = {"a": la["p50"], "b": lb["p50"], "rel": _rel(la["p50"], lb["p50"]), "noise": noise}
        row["p95_ms"] = {"a": la["p95"], "b": lb["p95"], "rel": _rel(la["p95"], lb["p95"])}
        if same_machine and row["p50_ms"]["rel"] is not None and row["p50_ms"]["rel"] > noise:
            row["regressions"].append(f"p50 latency {row['p50_ms']['rel']:+.0%} (noise {noise:.0%})")
        row["size_mb"] = {"a": ra["size_mb"], "b": rb["size_mb"], "rel": _rel(ra["size_mb"], rb["size_mb"])}
        if row["size_mb"]["rel"] is not None and row["size_mb"]["rel"] > SIZE_TOLERANCE:
            row["regressions"].append(f"size {row['size_mb']['rel']:+.1%}")
        ca, cb = ra.get("usd_per_1k"), rb.get("usd_per_1k")
        # $/1K is price / throughput at the operating point: as noisy as that batch's timings.
        op_a, op_b = ra.get("operating_point") or {}, rb.get("operating_point") or {}
        cost_noise = timing_noise(*[_spread(op["p50_ms"], op["p95_ms"]) for op in (op_a, op_b) if op])
        row["usd_per_1k"] = {"a": ca, "b": cb, "rel": _rel(ca, cb), "noise": cost_noise}
        if same_machine and row["usd_per_1k"]["rel"] is not None and row["usd_per_1k"]["rel"] > cost_noise:
            row["regressions"].append(f"$/1K {row['usd_per_1k']['rel']:+.0%} (noise {cost_noise:.0%})")
        out.append(row)

    da, db = a["decision"], b["decision"]
    if da.get("selected") != db.get("selected"):
        notes.append(f"the pick changed: {da.get('selected') or 'none within budget'} -> "
                     f"{db.get('selected') or 'none within budget'}")
    return {
        "a": str(path_a), "b": str(path_b), "rows": out, "notes": notes,
        "added": [f"{i} ({d})" for (i, d) in rows_b if (i, d) not in rows_a],
        "removed": [f"{i} ({d})" for (i, d) in rows_a if (i, d) not in rows_b],
        "decision": {"a": da.get("selected"), "b": db.get("selected")},
        "regressions": sum(len(r["regressions"]) for r in out),
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


HEADERS = ["variant", "device", "acc A", "acc B", "change [95% CI]", "p50 ms A -> B", "size", "$/1K", "flag"]


def table_rows(cmp: dict) -> list[list[str]]:
    rows = []
    for r in cmp["rows"]:
        if "accuracy" not in r:
            rows.append([r["id"], r["device"], "-", "-", r.get("status", "-"), "-", "-", "-",
                         "REGRESSION" if r["regressions"] else ""])
            continue
        acc = r["accuracy"]
        rows.append([
            r["id"], r["device"], f"{acc['a']:.2f}", f"{acc['b']:.2f}",
            f"{acc['change']:+.2f} [{acc['ci95'][0]:+.2f}, {acc['ci95'][1]:+.2f}]",
            f"{r['p50_ms']['a']:.2f} -> {r['p50_ms']['b']:.2f} ({_pct(r['p50_ms']['rel'])})",
            _pct(r["size_mb"]["rel"]), _pct(r["usd_per_1k"]["rel"]),
            "REGRESSION" if r["regressions"] else "",
        ])
    return rows


def markdown(cmp: dict) -> str:
    lines = ["## compress compare", "", f"A: `{cmp['a']}`  B: `{cmp['b']}`", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in table_rows(cmp)]
    regs = [f"- `{r['id']}` ({r['device']}): {x}" for r in cmp["rows"] for x in r["regressions"]]
    lines += ["", "**Regressions beyond noise:**" if regs else "No regression beyond noise.", *regs]
    extra = cmp["notes"] + [f"new in B: {x}" for x in cmp["added"]] + [f"gone in B: {x}" for x in cmp["removed"]]
    if extra:
        lines += ["", "Notes:", *[f"- {n}" for n in extra]]
    return "\n".join(lines) + "\n"


def print_comparison(cmp: dict, console=None) -> None:
    from rich.table import Table

    from compress.console import out

    console = console or out
    table = Table(title=f"{cmp['a']} (A) -> {cmp['b']} (B)", title_justify="left")
    for h in HEADERS:
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
