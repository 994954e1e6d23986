"""The main job's figures in README.md, generated from a run's report.json.

    python docs/figures.py artifacts/bert_sentiment/report.json          # rewrite README.md's block
    python docs/figures.py artifacts/bert_sentiment/report.json --check  # exit 1 if the block differs
    python docs/figures.py artifacts/bert_sentiment/report.json --print  # print the block only

The block is the text between the markers `<!-- figures:start -->` and `<!-- figures:end -->`:
one table of the variants on the deciding device (the selected row in bold) and one line
naming the decision, the machine and, where the manifest records one, the commit.
Exit codes: 0 done (or the block is current), 1 `--check` found a different block,
2 a missing or unreadable report, or a README without the markers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing it
    sys.path.insert(0, str(ROOT))

START = "<!-- figures:start -->"
END = "<!-- figures:end -->"
README = ROOT / "README.md"

from compress.reports.report_json import delta_cell, money  # noqa: E402 - after the path above


def _best(throughput: dict) -> str:
    batch, rate = max(throughput.items(), key=lambda kv: kv[1])
    return f"{rate:,.0f} @b{batch}"


def _cost(r) -> str:
    if r.usd_per_1k is None:
        return "-"
    at = f" @b{r.operating_point.batch_size}" if r.operating_point is not None else ""
    return f"${money(r.usd_per_1k)}{at}"


def headers(report) -> list[str]:
    m, info = report.metric, report.task_info
    quality = "acc %" if m.name == "accuracy" else f"{m.name} {m.unit}".strip()
    delta = f"delta{' ' + m.delta_unit if m.delta_unit and m.delta_unit != 'points' else ''} [95% CI]"
    return ["variant", quality, delta, "MB", "p50 / p95 ms", "speed-up", f"best {info.throughput_unit}",
            "$/1K", "verdict"]


def rows(report) -> list[tuple[str, list[str]]]:
    """(variant id, cells) for every row on the deciding device, in the report's order."""
    device = report.decision.device
    out = []
    for r in report.rows:
        if r.device != device:
            continue
        if not r.ok:
            out.append((r.id, [r.id, *["-"] * 7, r.verdict or "failed"]))
            continue
        lat = r.latency_ms
        out.append((r.id, [
            r.id, f"{r.quality:.2f}", delta_cell(r), f"{r.size_mb:.1f}", f"{lat.p50:.2f} / {lat.p95:.2f}",
            f"{r.speedup_vs_baseline:.2f}x" if r.speedup_vs_baseline else "-",
            _best(r.throughput) if r.throughput else "-", _cost(r), r.verdict or "",
        ]))
    return out


def _cpu(hardware: dict) -> str:
    cpu = hardware.get("cpu") or {}
    words = [str(cpu.get("model") or "an unnamed CPU")]
    detail = []
    if cpu.get("cores"):
        detail.append(f"{cpu['cores']} cores")
    isa = cpu.get("isa") or []
    if isa:
        detail.append(", ".join(isa))
    if detail:
        words.append(f"({'; '.join(detail)})")
    gpu = hardware.get("gpu")
    if isinstance(gpu, dict) and gpu.get("name"):
        words.append(f"with {gpu['name']}")
    return " ".join(words)


def summary(report) -> str:
    d, m = report.decision, report.manifest
    if d.selected:
        what = f"Decision: deploy **{d.selected}** ({d.objective} on {d.device}, exit {d.exit_code})."
    else:
        what = f"Decision: no compressed variant within budget ({d.objective} on {d.device}, exit {d.exit_code})."
    where = f"Measured on {_cpu(m.hardware)}, {m.threads} thread{'s' if m.threads != 1 else ''}"
    if m.started:
        where += f", {m.started[:10]}"
    return f"{what} {where}."


def render(report) -> str:
    """The block between the markers (without them), ending in a newline."""
    heads = headers(report)
    lines = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    for vid, cells in rows(report):
        if vid == report.decision.selected:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n\n" + summary(report) + "\n"


def replace_block(text: str, block: str) -> str:
    """README text with the block between the markers replaced; ValueError without both markers."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"needs one {START} line and one {END} line after it")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="a run's report.json, or its run folder")
    ap.add_argument("--readme", type=Path, default=README, help="the file holding the block (default: README.md)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the block differs from the report's")
    mode.add_argument("--print", dest="print_only", action="store_true", help="print the block, write nothing")
    args = ap.parse_args(argv)

    from compress.core.errors import CompressError
    from compress.reports.report_json import read_report

    try:
        report = read_report(args.report)
    except CompressError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    block = render(report)
    if args.print_only:
        sys.stdout.write(block)
        return 0
    try:
        text = args.readme.read_text(encoding="utf-8")
        new = replace_block(text, block)
    except (OSError, ValueError) as exc:
        print(f"error: {args.readme}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{args.readme}: the figures block differs from {args.report}; "
                  f"run `python docs/figures.py {args.report}`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.readme.write_text(new, encoding="utf-8")
    print(f"{args.readme}: figures from {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
