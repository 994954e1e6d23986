"""Reports, all rendered from the one report.json: a terminal table, Markdown for a pull
request, the JSON itself for machines, junit.xml for CI (compress/junit.py) and a
self-contained report.html with plots (compress/html_report.py). `compress report RUN_DIR`
re-renders them."""

from __future__ import annotations

import json
from pathlib import Path

REPORT_JSON = "report.json"
REPORT_MD = "report.md"

VERDICT_STYLE = {"selected": "bold green", "within budget": "green", "baseline": "cyan",
                 "rejected": "red", "failed": "red", "reported": "dim"}


def _num(v, fmt: str, dash: str = "-") -> str:
    return dash if v is None else format(v, fmt)


def _delta(r: dict) -> str:
    if r.get("delta") is None:
        return "-"
    lo, hi = r["delta_ci95"]
    return f"{r['delta']:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def _cost(r: dict) -> str:
    if r.get("usd_per_1k") is None:
        return "-"
    return f"${r['usd_per_1k']:.5f} @b{r['operating_point']['batch_size']}"


def _format(r: dict) -> str:
    """The format and, where the format's name does not say it, the runtime that ran it:
    `onnx (onnxruntime)`, `hf (torch)`, `openvino`. (Reports from before rows named their
    runtime show the format alone.)"""
    runtime = r.get("runtime")
    return r["format"] if runtime in (None, r["format"]) else f"{r['format']} ({runtime})"


def table_rows(report: dict) -> list[list[str]]:
    out = []
    for r in report["rows"]:
        fmt = _format(r)
        if not r["ok"]:
            out.append([r["id"], fmt, r["device"], "-", "-", "-", "-", "-", "-", "-", r["verdict"]])
            continue
        lat = r["latency_ms"]
        tput = max(r["throughput"].values())
        out.append([
            r["id"], fmt, r["device"], f"{r['accuracy']:.2f}", _delta(r), f"{r['size_mb']:.1f}",
            f"{lat['p50']:.2f} / {lat['p95']:.2f} / {lat['p99']:.2f}",
            _num(r.get("speedup_vs_baseline"), ".2f") + "x" if r.get("speedup_vs_baseline") else "-",
            f"{tput:,.0f}", _cost(r), r["verdict"],
        ])
    return out


HEADERS = ["variant", "format", "device", "acc %", "delta pts [95% CI]", "MB", "p50/p95/p99 ms",
           "speed-up", "seq/s", "$/1K", "verdict"]


def _dur(seconds: float) -> str:
    from compress.console import duration

    return duration(seconds)


def timing_lines(report: dict, top: int = 5) -> list[str]:
    """Where the run's time went (report.json `timing`), in three short lines; none for a
    report written before the key existed."""
    t = report.get("timing")
    if not isinstance(t, dict):
        return []
    stages = sorted(((sid, s["seconds"]) for sid, s in t.get("stages", {}).items() if s.get("seconds")),
                    key=lambda kv: -kv[1])
    b = t.get("benchmark", {})
    phases = [(k, v) for k, v in b.get("phases", {}).items() if v >= 0.05][:top]
    lines = [f"time: {_dur(t['seconds'])} in all: stages {_dur(t.get('stages_seconds', 0))}, benchmark "
             f"{_dur(b.get('seconds', 0))}, other {_dur(t.get('other_seconds', 0))}"]
    if stages:
        lines.append("stages: " + ", ".join(f"{sid} {_dur(sec)}" for sid, sec in stages[:top])
                     + (f", {len(stages) - top} more" if len(stages) > top else ""))
    if phases:
        lines.append("benchmark phases: " + ", ".join(f"{k} {_dur(v)}" for k, v in phases))
    return lines


def print_report(report: dict, console=None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from compress.console import out

    console = console or out
    d = report["decision"]
    table = Table(title=f"{report['recipe']}: variants on {', '.join(report['devices'])} "
                  f"({report['manifest']['threads']} threads)", title_justify="left")
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("variant", "format", "device", "verdict") else "right")
    for row, r in zip(table_rows(report), report["rows"]):
        table.add_row(*row, style=VERDICT_STYLE.get(r["verdict"], ""))
    console.print(table)
    for r in report["rows"]:
        for reason in r.get("reasons", []) if r["verdict"] in ("rejected", "within budget", "failed") else []:
            console.print(f"  [dim]{r['id']}:[/dim] {reason}", highlight=False)
        for note in r.get("notes", []):
            console.print(f"  [dim]{r['id']} ({r['device']}): {note}[/dim]", highlight=False)
    for note in report.get("notes", []) + d["notes"]:
        console.print(f"  [yellow]note:[/yellow] {note}", highlight=False)
    for line in timing_lines(report):
        console.print(f"  [dim]{escape(line)}[/dim]", highlight=False)
    if d["selected"]:
        console.print(f"[bold green]deploy: {d['selected']}[/bold green] ({d['objective']} on {d['device']}, "
                      f"max drop {report['budget']['max_accuracy_drop']} points)", highlight=False)
    else:
        console.print("[bold red]no compressed variant is within budget[/bold red] (exit 3)", highlight=False)


def markdown(report: dict) -> str:
    d = report["decision"]
    b = report["budget"]
    lines = [f"## compress: {report['recipe']}", ""]
    if d["selected"]:
        sel = next(r for r in report["rows"] if r["id"] == d["selected"] and r["device"] == d["device"])
        lines.append(
            f"**Deploy `{d['selected']}`** ({d['objective']} on {d['device']}): accuracy {sel['accuracy']:.2f} "
            f"({_delta(sel)} points vs `{b['baseline']}`), {sel['size_mb']:.1f} MB, p95 {sel['p95_ms']:.2f} ms, "
            f"{_cost(sel)}."
        )
    else:
        lines.append(f"**No compressed variant is within budget** (max drop {b['max_accuracy_drop']} points). ")
        if d.get("best_failed"):
            bf = d["best_failed"]
            lines.append(f"Closest: `{bf['id']}` at {bf['delta']:+.2f} points: {'; '.join(bf['reasons'])}.")
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in table_rows(report)]
    lines += ["", f"Budget: max accuracy drop {b['max_accuracy_drop']} points (gate on {b['gate_on']})"
              + (f", p95 <= {b['latency_p95_ms']} ms" if b.get("latency_p95_ms") else "")
              + (f", size <= {b['max_size_mb']} MB" if b.get("max_size_mb") else "") + "."]
    why = [f"- `{r['id']}` ({r['device']}): {'; '.join(r['reasons'])}" for r in report["rows"]
           if r["verdict"] in ("rejected", "within budget", "failed") and r.get("reasons")]
    if why:
        lines += ["", "<details><summary>Why the others lost</summary>", "", *why, "", "</details>"]
    notes = [f"- {n}" for n in report.get("notes", []) + d["notes"]]
    notes += [f"- `{r['id']}` ({r['device']}): {n}" for r in report["rows"] for n in r.get("notes", [])]
    if notes:
        lines += ["", "Notes:", *notes]
    timing = timing_lines(report, top=20)
    if timing:
        lines += ["", "<details><summary>Where the time went</summary>", "", *[f"- {x}" for x in timing], "",
                  "</details>"]
    m = report["manifest"]
    paired = any(r.get("paired_vs_baseline") for r in report["rows"])
    lines += ["", f"<sub>{m['hardware']['cpu']['model']}, {m['threads']} threads; latency at batch 1 over "
              f"{m['data']['eval_examples']} eval sentences; $/1K at the best batch size"
              f"{' meeting the SLO' if b.get('latency_p95_ms') else ''}"
              f"{'; speed-ups from rounds timing each variant alternately with the baseline' if paired else ''}"
              f". compress {m['versions'].get('compress', '?')}, "
              f"torch {m['versions'].get('torch', '?')}.</sub>", ""]
    return "\n".join(lines)


def write_reports(report: dict, run_dir: Path) -> None:
    """report.json, report.md, junit.xml and report.html, each written atomically (JSON
    first: the other three are rendered from it and can be re-rendered by `compress report`)."""
    from compress import html_report, junit

    renders = ((REPORT_JSON, lambda: json.dumps(report, indent=1)), (REPORT_MD, lambda: markdown(report)),
               (junit.JUNIT_XML, lambda: junit.junit_xml(report)), (html_report.REPORT_HTML, lambda: html_report.render(report)))
    for name, render in renders:
        tmp = run_dir / (name + ".part")
        tmp.write_text(render(), encoding="utf-8")
        tmp.rename(run_dir / name)


def read_report(path: Path) -> dict:
    from compress.errors import CompressError

    path = path / REPORT_JSON if path.is_dir() else path
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CompressError(f"{path}: no such report; run `compress run RECIPE` first")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CompressError(f"{path}: not a valid report.json")
    if not isinstance(report, dict) or report.get("schema_version") != 1 or "rows" not in report:
        raise CompressError(f"{path}: not a compress report (schema_version 1)")
    return report
