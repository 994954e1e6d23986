"""Reports, all rendered from the one report.json: a terminal table, Markdown for a pull
request, the JSON itself for machines, junit.xml for CI (compress/reports/junit.py) and a
self-contained report.html with plots (compress/reports/html.py). `compress report RUN_DIR`
re-renders them.

report.json is the `Report` record (compress/reports/report_json.py), read and written through it.
"""

from __future__ import annotations

import json
from pathlib import Path

from compress.core.files import write_file

from compress.reports.report_json import REPORT_JSON, Report, as_report, cost_cell, delta_cell, headers, table_rows

REPORT_MD = "report.md"

VERDICT_STYLE = {"selected": "bold green", "within budget": "green", "baseline": "cyan",
                 "rejected": "red", "failed": "red", "reported": "dim"}


def _dur(seconds: float) -> str:
    from compress.core.console import duration

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

    from compress.core.console import out

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
    if report.serving is not None:
        from compress.reports.serving import terminal_lines

        for line in terminal_lines(report.serving):
            console.print(escape(line), highlight=False)
    for line in timing_lines(report):
        console.print(f"  [dim]{escape(line)}[/dim]", highlight=False)
    if d.selected:
        console.print(f"[bold green]deploy: {d.selected}[/bold green] ({d.objective} on {d.device}, "
                      f"max drop {report.budget.quality_limit(report.metric.name)} {report.metric.delta_unit}"
                      + (", on the interval's lower end" if report.budget.gate_on == "ci_lower" else "") + ")",
                      highlight=False)
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
    causal = report.task_info.name == "causal-lm"
    if d.selected and causal:
        sel = next(r for r in report.rows if r.id == d.selected and r.device == d.device)
        lm = sel.lm
        best = max(lm.decode_tokens_per_s.values()) if lm else 0.0
        cost = f", ${lm.usd_per_1m_tokens:.4f} per 1M output tokens" if lm and lm.usd_per_1m_tokens is not None else ""
        lines.append(
            f"**Deploy `{d.selected}`** ({d.objective} on {d.device}): perplexity {sel.quality:.3f} "
            f"({delta_cell(sel)} % vs `{b.baseline}`), {sel.size_mb:.1f} MB, {sel.latency_ms.p50:.2f} ms per output "
            f"token at batch 1, {best:.1f} tokens/s at its best batch{cost}."
        )
    elif d.selected:
        sel = next(r for r in report.rows if r.id == d.selected and r.device == d.device)
        lines.append(
            f"**Deploy `{d.selected}`** ({d.objective} on {d.device}): {m.name} {sel.quality:.2f} "
            f"({delta_cell(sel)} {m.delta_unit} vs `{b.baseline}`), {sel.size_mb:.1f} MB, p95 {sel.p95_ms:.2f} ms, "
            f"{cost_cell(sel)}."
        )
    elif d.too_few_eval_examples:
        lines.append(f"**Nothing deployed: too few eval sentences to decide** (budget.min_eval_examples "
                     f"{b.min_eval_examples}).")
    else:
        lines.append(f"**No compressed variant is within budget** (max drop {b.quality_limit(m.name)} {m.delta_unit}). ")
        bf = d.best_failed
        if bf is not None:
            lines.append(f"Closest: `{bf.id}` at {bf.delta:+.2f} {m.delta_unit}: {_md('; '.join(bf.reasons))}.")
    heads = headers(report)
    lines += ["", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in table_rows(report)]
    lines += ["", f"Budget: max {m.name} drop {b.quality_limit(m.name)} {m.delta_unit} (gate on {b.gate_on})"
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
    if report.serving is not None:
        from compress.reports.serving import markdown_lines

        lines += markdown_lines(report.serving, _md)
    timing = timing_lines(report, top=20)
    if timing:
        lines += ["", "<details><summary>Where the time went</summary>", "", *[f"- {x}" for x in timing], "",
                  "</details>"]
    man = report.manifest
    if causal:
        protocols = list(dict.fromkeys(f"{e.name}: {e.protocol}" for r in report.rows if r.lm for e in r.lm.evals
                                       if e.protocol))
        if protocols:
            lines += ["", "Protocols:", *[f"- {_md(p)}" for p in protocols]]
        lines += ["", f"<sub>{man.hardware['cpu']['model']}, {man.threads} threads; time to first token and per "
                  f"output token at batch 1 over real prompts, greedy; tokens/s count every row of a batch; "
                  f"$ per 1M output tokens at the best decode rate. compress {man.versions.get('compress', '?')}, "
                  f"torch {man.versions.get('torch', '?')}.</sub>", ""]
        return "\n".join(lines)
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
    from compress.reports import html as html_report
    from compress.reports import junit
    from pydantic import ValidationError

    record = as_report(report)
    data = finite_json(record.dump())
    try:  # what is rendered shows no NaN or infinity either ("-" where the JSON has null)
        record = Report.model_validate(data)
    except ValidationError:  # a null where a figure is required: render the figures as they are
        pass
    renders = ((REPORT_JSON, lambda: json.dumps(data, indent=1, allow_nan=False)), (REPORT_MD, lambda: markdown(record)),
               (junit.JUNIT_XML, lambda: junit.junit_xml(record)), (html_report.REPORT_HTML, lambda: html_report.render(record)))
    for name, render in renders:
        # backslashreplace: a lone surrogate (a file name that is not UTF-8, decoded with
        # surrogateescape) is written as an escape instead of failing the whole report.
        write_file(run_dir / name, render(), errors="backslashreplace")
