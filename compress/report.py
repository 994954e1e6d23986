"""Reports, all rendered from the one report.json: a terminal table, Markdown for a pull
request, the JSON itself for machines, junit.xml for CI (compress/junit.py) and a
self-contained report.html with plots (compress/html_report.py). `compress report RUN_DIR`
re-renders them.

report.json is the `Report` record below (rows and the decision are compress/decision.py's
records), written by alias and without the fields never set, so its keys are the public
format's (README.md, "Outputs"); reading one back goes through the same records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from compress.decision import Decision, Row
from compress.recipe import BudgetSpec
from compress.tasks import DEFAULT_TASK, Metric, TaskInfo, get_task

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
# 1: the first format. 2: adds the top-level `task` block (the task and its metric); a
# report without it is a sequence-classification report.
SCHEMA_VERSION = 2
SCHEMA_VERSIONS = (1, 2)


class Manifest(BaseModel):
    """What a run was made of (manifest.json holds the same)."""

    model_config = ConfigDict(extra="forbid")

    recipe_file: str | None = None
    recipe: dict[str, Any] = {}
    versions: dict[str, Any]
    hardware: dict[str, Any]
    threads: int
    benchmark_method: int | None = None
    seeds: dict[str, Any] = {}
    data: dict[str, Any]
    model: dict[str, Any] | None = None
    started: str | None = None
    seconds: float | None = None


class Report(BaseModel):
    """report.json."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_version: int
    task: TaskInfo | None = None  # schema 2 on; absent: sequence classification
    recipe: str
    run_dir: str = ""
    devices: list[str]
    budget: BudgetSpec
    decision: Decision
    rows: list[Row]
    stages: dict[str, Any] = {}
    notes: list[str] = []
    manifest: Manifest
    timing: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _measured(self):
        for i, r in enumerate(self.rows):
            if r.ok and (r.quality is None or r.size_mb is None or r.latency_ms is None or not r.throughput):
                raise ValueError(f"rows[{i}]: a row marked ok lacks {self.metric.name}, size_mb, latency_ms or throughput")
            if r.delta is not None and r.delta_ci95 is None:
                raise ValueError(f"rows[{i}]: a row with a delta lacks delta_ci95")
            if r.usd_per_1k is not None and r.operating_point is None:
                raise ValueError(f"rows[{i}]: a row with usd_per_1k lacks operating_point.batch_size")
        return self

    @property
    def task_info(self) -> TaskInfo:
        return self.task if self.task is not None else get_task(DEFAULT_TASK).info()

    @property
    def metric(self) -> Metric:
        return self.task_info.metric

    def dump(self) -> dict[str, Any]:
        """The report as report.json's object (python values, NaN and infinities still in)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def as_report(report: "Report | dict") -> Report:
    """A report record from a report.json-shaped object (or the record itself)."""
    return report if isinstance(report, Report) else Report.model_validate(report)

VERDICT_STYLE = {"selected": "bold green", "within budget": "green", "baseline": "cyan",
                 "rejected": "red", "failed": "red", "reported": "dim"}


def _num(v, fmt: str, dash: str = "-") -> str:
    return dash if v is None else format(v, fmt)


def _delta(r: Row) -> str:
    if r.delta is None or r.delta_ci95 is None:
        return "-"
    lo, hi = r.delta_ci95
    return f"{r.delta:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def _cost(r: Row) -> str:
    if r.usd_per_1k is None or r.operating_point is None:
        return "-"
    return f"${r.usd_per_1k:.5f} @b{r.operating_point.batch_size}"


def _format(r: Row) -> str:
    """The format and, where the format's name does not say it, the runtime that ran it:
    `onnx (onnxruntime)`, `hf (torch)`, `openvino`. (Reports from before rows named their
    runtime show the format alone.)"""
    return r.format if r.runtime in (None, r.format) else f"{r.format} ({r.runtime})"


def table_rows(report: "Report | dict") -> list[list[str]]:
    report = as_report(report)
    out = []
    for r in report.rows:
        fmt = _format(r)
        verdict = r.verdict or ""
        if not r.ok:
            out.append([r.id, fmt, r.device, "-", "-", "-", "-", "-", "-", "-", verdict])
            continue
        lat = r.latency_ms
        tput = max(r.throughput.values())
        out.append([
            r.id, fmt, r.device, f"{r.quality:.2f}", _delta(r), f"{r.size_mb:.1f}",
            f"{lat.p50:.2f} / {lat.p95:.2f} / {lat.p99:.2f}",
            _num(r.speedup_vs_baseline, ".2f") + "x" if r.speedup_vs_baseline else "-",
            f"{tput:,.0f}", _cost(r), verdict,
        ])
    return out


def headers(report: Report) -> list[str]:
    """The table's column headings: the quality columns are named after the task's metric."""
    m, info = report.metric, report.task_info
    delta = f"delta {'pts' if m.delta_unit == 'points' else m.delta_unit} [95% CI]".replace("  ", " ")
    return ["variant", "format", "device", m.label or m.name, delta, "MB", "p50/p95/p99 ms",
            "speed-up", info.throughput_unit, "$/1K", "verdict"]


def _dur(seconds: float) -> str:
    from compress.console import duration

    return duration(seconds)


def timing_lines(report: Report, top: int = 5) -> list[str]:
    """Where the run's time went (report.json `timing`), in three short lines; none for a
    report written before the key existed."""
    t = report.timing
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


def print_report(report: "Report | dict", console=None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from compress.console import out

    report = as_report(report)
    console = console or out
    d = report.decision
    table = Table(title=f"{report.recipe}: variants on {', '.join(report.devices)} "
                  f"({report.manifest.threads} threads)", title_justify="left")
    for h in headers(report):
        table.add_column(h, justify="left" if h in ("variant", "format", "device", "verdict") else "right")
    for row, r in zip(table_rows(report), report.rows):
        table.add_row(*row, style=VERDICT_STYLE.get(r.verdict or "", ""))
    console.print(table)
    for r in report.rows:
        for reason in r.reasons if r.verdict in ("rejected", "within budget", "failed") else []:
            console.print(f"  [dim]{r.id}:[/dim] {reason}", highlight=False)
        for note in r.notes:
            console.print(f"  [dim]{r.id} ({r.device}): {note}[/dim]", highlight=False)
    for note in report.notes + d.notes:
        console.print(f"  [yellow]note:[/yellow] {note}", highlight=False)
    for line in timing_lines(report):
        console.print(f"  [dim]{escape(line)}[/dim]", highlight=False)
    if d.selected:
        console.print(f"[bold green]deploy: {d.selected}[/bold green] ({d.objective} on {d.device}, "
                      f"max drop {report.budget.max_accuracy_drop} {report.metric.delta_unit})", highlight=False)
    elif d.too_few_eval_examples:
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


def markdown(report: "Report | dict") -> str:
    report = as_report(report)
    d = report.decision
    b = report.budget
    m = report.metric
    lines = [f"## compress: {report.recipe}", ""]
    if d.selected:
        sel = next(r for r in report.rows if r.id == d.selected and r.device == d.device)
        lines.append(
            f"**Deploy `{d.selected}`** ({d.objective} on {d.device}): {m.name} {sel.quality:.2f} "
            f"({_delta(sel)} {m.delta_unit} vs `{b.baseline}`), {sel.size_mb:.1f} MB, p95 {sel.p95_ms:.2f} ms, "
            f"{_cost(sel)}."
        )
    elif d.too_few_eval_examples:
        lines.append(f"**Nothing deployed: too few eval sentences to decide** (budget.min_eval_examples "
                     f"{b.min_eval_examples}).")
    else:
        lines.append(f"**No compressed variant is within budget** (max drop {b.max_accuracy_drop} {m.delta_unit}). ")
        bf = d.best_failed
        if bf is not None:
            lines.append(f"Closest: `{bf.id}` at {bf.delta:+.2f} {m.delta_unit}: {_md('; '.join(bf.reasons))}.")
    heads = headers(report)
    lines += ["", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in table_rows(report)]
    lines += ["", f"Budget: max {m.name} drop {b.max_accuracy_drop} {m.delta_unit} (gate on {b.gate_on})"
              + (f", p95 <= {b.latency_p95_ms} ms" if b.latency_p95_ms else "")
              + (f", size <= {b.max_size_mb} MB" if b.max_size_mb else "") + "."]
    why = [f"- `{r.id}` ({r.device}): {_md('; '.join(r.reasons))}" for r in report.rows
           if r.verdict in ("rejected", "within budget", "failed") and r.reasons]
    if why:
        lines += ["", "<details><summary>Why the others lost</summary>", "", *why, "", "</details>"]
    notes = [f"- {_md(n)}" for n in report.notes + d.notes]
    notes += [f"- `{r.id}` ({r.device}): {_md(n)}" for r in report.rows for n in r.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    timing = timing_lines(report, top=20)
    if timing:
        lines += ["", "<details><summary>Where the time went</summary>", "", *[f"- {x}" for x in timing], "",
                  "</details>"]
    man = report.manifest
    paired = any(r.paired_vs_baseline for r in report.rows)
    lines += ["", f"<sub>{man.hardware['cpu']['model']}, {man.threads} threads; latency at batch 1 over "
              f"{man.data['eval_examples']} eval sentences; $/1K at the best batch size"
              f"{' meeting the SLO' if b.latency_p95_ms else ''}"
              f"{'; speed-ups from rounds timing each variant alternately with the baseline' if paired else ''}"
              f". compress {man.versions.get('compress', '?')}, "
              f"torch {man.versions.get('torch', '?')}.</sub>", ""]
    return "\n".join(lines)


def write_reports(report: "Report | dict", run_dir: Path) -> None:
    """report.json, report.md, junit.xml and report.html, each written atomically (JSON
    first: the other three are rendered from it and can be re-rendered by `compress report`).
    `report`: the record, or report.json's object."""
    from compress import html_report, junit

    record = as_report(report)
    data = finite_json(record.dump())
    record = Report.model_validate(data)  # NaN and infinities are gone from what is rendered too
    renders = ((REPORT_JSON, lambda: json.dumps(data, indent=1, allow_nan=False)), (REPORT_MD, lambda: markdown(record)),
               (junit.JUNIT_XML, lambda: junit.junit_xml(record)), (html_report.REPORT_HTML, lambda: html_report.render(record)))
    for name, render in renders:
        tmp = run_dir / (name + ".part")
        # backslashreplace: a lone surrogate (a file name that is not UTF-8, decoded with
        # surrogateescape) is written as an escape instead of failing the whole report.
        tmp.write_text(render(), encoding="utf-8", errors="backslashreplace")
        tmp.rename(run_dir / name)


def read_report(path: Path) -> Report:
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
    if not isinstance(report, dict) or report.get("schema_version") not in SCHEMA_VERSIONS or "rows" not in report:
        raise CompressError(f"{path}: not a compress report (schema_version {' or '.join(map(str, SCHEMA_VERSIONS))})")
    try:
        return Report.model_validate(report)
    except ValidationError as err:
        raise CompressError(f"{path}: malformed report.json: {_first_problem(err)}; re-run `compress run` to write "
                            f"it again") from err
    except RecursionError as exc:
        raise CompressError(f"{path}: malformed report.json: nested too deeply; re-run `compress run` to write "
                            f"it again") from exc


def _first_problem(err: ValidationError) -> str:
    """The first problem pydantic found, as `where: what` on one line."""
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"])
    msg = str(e["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}"[:300] if where else msg[:300]
