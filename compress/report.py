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
    elif d.get("too_few_eval_examples"):
        console.print("[bold red]nothing deployed: too few eval sentences to decide[/bold red] (exit 3)", highlight=False)
    else:
        console.print("[bold red]no compressed variant is within budget[/bold red] (exit 3)", highlight=False)


def _md(text) -> str:
    """Report text (error messages, reasons, notes: they can quote a user's file) as
    Markdown that renders as the same text: HTML is escaped (a pull-request comment would
    render `<img onerror=...>`), control characters are shown as escapes, and a table
    cell cannot end its cell."""
    from html import escape

    return escape(printable(str(text)), quote=False).replace("|", "\\|")


def printable(text: str) -> str:
    """`text` with control characters and bidirectional overrides (which reorder what a
    reader sees) written as \\uXXXX escapes, and newlines as spaces."""
    import unicodedata

    text = text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return "".join(c if c == "\t" or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co", "Cn")
                   else f"\\u{ord(c):04x}" for c in text)


def finite_json(value):
    """`value` with NaN and infinities replaced by None: report.json is standard JSON
    (json.dumps writes them as `NaN`/`Infinity`, which strict parsers reject)."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


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
    elif d.get("too_few_eval_examples"):
        lines.append(f"**Nothing deployed: too few eval sentences to decide** (budget.min_eval_examples "
                     f"{b.get('min_eval_examples')}).")
    else:
        lines.append(f"**No compressed variant is within budget** (max drop {b['max_accuracy_drop']} points). ")
        if d.get("best_failed"):
            bf = d["best_failed"]
            lines.append(f"Closest: `{bf['id']}` at {bf['delta']:+.2f} points: {_md('; '.join(bf['reasons']))}.")
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in table_rows(report)]
    lines += ["", f"Budget: max accuracy drop {b['max_accuracy_drop']} points (gate on {b['gate_on']})"
              + (f", p95 <= {b['latency_p95_ms']} ms" if b.get("latency_p95_ms") else "")
              + (f", size <= {b['max_size_mb']} MB" if b.get("max_size_mb") else "") + "."]
    why = [f"- `{r['id']}` ({r['device']}): {_md('; '.join(r['reasons']))}" for r in report["rows"]
           if r["verdict"] in ("rejected", "within budget", "failed") and r.get("reasons")]
    if why:
        lines += ["", "<details><summary>Why the others lost</summary>", "", *why, "", "</details>"]
    notes = [f"- {_md(n)}" for n in report.get("notes", []) + d["notes"]]
    notes += [f"- `{r['id']}` ({r['device']}): {_md(n)}" for r in report["rows"] for n in r.get("notes", [])]
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

    report = finite_json(report)
    renders = ((REPORT_JSON, lambda: json.dumps(report, indent=1, allow_nan=False)), (REPORT_MD, lambda: markdown(report)),
               (junit.JUNIT_XML, lambda: junit.junit_xml(report)), (html_report.REPORT_HTML, lambda: html_report.render(report)))
    for name, render in renders:
        tmp = run_dir / (name + ".part")
        # backslashreplace: a lone surrogate (a file name that is not UTF-8, decoded with
        # surrogateescape) is written as an escape instead of failing the whole report.
        tmp.write_text(render(), encoding="utf-8", errors="backslashreplace")
        tmp.rename(run_dir / name)


def read_report(path: Path) -> dict:
    from compress.errors import CompressError

    path = path / REPORT_JSON if path.is_dir() else path
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CompressError(f"{path}: no such report; run `compress run RECIPE` first")
    except IsADirectoryError:
        raise CompressError(f"{path}: is a folder, not a report.json")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CompressError(f"{path}: not a valid report.json")
    except OSError as exc:
        raise CompressError(f"{path}: cannot read it ({exc.strerror or exc.__class__.__name__})")
    if not isinstance(report, dict) or report.get("schema_version") != 1 or "rows" not in report:
        raise CompressError(f"{path}: not a compress report (schema_version 1)")
    problem = report_shape_problem(report)
    if problem:
        raise CompressError(f"{path}: malformed report.json: {problem}; re-run `compress run` to write it again")
    return report


def report_shape_problem(report: dict) -> str | None:
    """What is wrong with the shape of a loaded report.json (the keys and types that
    `report`, `gate` and `compare` read), or None. A hand-edited or truncated file is a
    one-line error, not a crash in a renderer."""
    from typing import Optional

    from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")

    class Latency(Loose):
        p50: float
        p95: float
        p99: float

    class Row(Loose):
        id: str
        format: str
        device: str
        ok: bool
        verdict: str
        reasons: list[str] = []
        notes: list[str] = []
        accuracy: Optional[float] = None
        delta: Optional[float] = None
        delta_ci95: Optional[tuple[float, float]] = None
        size_mb: Optional[float] = None
        p95_ms: Optional[float] = None
        latency_ms: Optional[Latency] = None
        throughput: Optional[dict[str, float]] = None
        usd_per_1k: Optional[float] = None
        operating_point: Optional[dict] = None
        speedup_vs_baseline: Optional[float] = None

        @model_validator(mode="after")
        def _measured(self):
            if self.ok and (self.accuracy is None or self.size_mb is None or self.latency_ms is None
                            or not self.throughput):
                raise ValueError("a row marked ok lacks accuracy, size_mb, latency_ms or throughput")
            if self.delta is not None and self.delta_ci95 is None:
                raise ValueError("a row with a delta lacks delta_ci95")
            if self.usd_per_1k is not None and not isinstance((self.operating_point or {}).get("batch_size"), int):
                raise ValueError("a row with usd_per_1k lacks operating_point.batch_size")
            return self

    class Budget(Loose):
        baseline: str
        max_accuracy_drop: float
        gate_on: str = "point"
        latency_p95_ms: Optional[float] = None
        max_size_mb: Optional[float] = None

    class Decision(Loose):
        selected: Optional[str]
        device: str
        objective: str
        notes: list[str]
        best_failed: Optional[dict] = None

    class Manifest(Loose):
        threads: int
        hardware: dict
        data: dict
        versions: dict

    class Report(Loose):
        recipe: str
        devices: list[str]
        budget: Budget
        decision: Decision
        rows: list[Row]
        manifest: Manifest
        notes: list[str] = []

    try:
        Report.model_validate(report)
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        return f"{where}: {e['msg']}"[:300] if where else e["msg"][:300]
    except RecursionError:
        return "nested too deeply"
    return None
