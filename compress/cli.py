"""The `compress` command line: thin commands over the library, one-line errors.

Exit codes: 0 success, 1 unexpected failure, 2 bad usage / recipe / input,
3 no compressed variant within the accuracy budget (the CI gate).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from compress.errors import EXIT_BUDGET, EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, CompressError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Compress a transformer text classifier into deployable variants, benchmark them "
    "the same way, and pick the one to ship.",
    pretty_exceptions_enable=False,
)

_state = {"debug": False}

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", "-s", help="Override a recipe value: KEY.PATH=VALUE (YAML value); repeatable. "
                 "Stages by index or id: stages[0].with.lr=1e-4, stages.baseline.with.epochs=2."),
]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    _state["debug"] = debug or os.environ.get("COMPRESS_DEBUG", "") not in ("", "0")


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe (keys, types, stage graph, formats) without loading any model."""
    from compress.console import out
    from compress.recipe import load_recipe

    r = load_recipe(recipe, set_ or [])
    chain = ", ".join(f"{s.id} ({s.uses} <- {s.source})" for s in r.stages)
    out.print(f"{recipe}: valid: {len(r.stages)} stages: {chain}", highlight=False)


@app.command()
def run(
    recipe: RecipeArg,
    set_: SetOpt = None,
    force: Annotated[Optional[list[str]], typer.Option("--force", "-f", help="Re-run this stage even if its output is up to date; repeatable.")] = None,
    artifacts: Annotated[Path, typer.Option(help="Folder for run outputs (one sub-folder per recipe name).")] = Path("artifacts"),
    threads: Annotated[Optional[int], typer.Option(help="Override benchmark.threads (also used for training).", min=1)] = None,
) -> None:
    """Run a recipe: stages, benchmark, decision, reports. Exit 3 if no compressed variant is within budget."""
    from compress.console import log
    from compress.errors import RecipeError
    from compress.recipe import load_recipe
    from compress.report import print_report
    from compress.runner import run_recipe

    r = load_recipe(recipe, set_ or [])
    ids = {s.id for s in r.stages}
    for f in force or []:
        if f not in ids:
            raise RecipeError("--force", f, f"names no stage (known: {', '.join(sorted(ids))})")
    report = run_recipe(r, artifacts, tuple(force or ()), threads=threads)
    print_report(report)
    log(f"reports: {Path(report['run_dir']) / 'report.md'}, {Path(report['run_dir']) / 'report.json'}"
        f" ({report['manifest']['seconds']:.0f}s)")
    raise typer.Exit(report["decision"]["exit_code"])


@app.command()
def stages(name: Annotated[Optional[str], typer.Argument(help="Show one stage kind.")] = None) -> None:
    """List the stage kinds with their settings and documentation."""
    from rich.table import Table

    from compress.console import out
    from compress.registry import get_stage, registry

    kinds = [get_stage(name)] if name else list(registry().values())
    for kind in kinds:
        out.print(f"[bold]{kind.name}[/bold]: {kind.summary}  [dim]({' | '.join(kind.accepts)} -> {kind.produces})[/dim]")
        if name is None:
            continue
        table = Table(show_header=True, box=None, pad_edge=False)
        for col in ("key", "type", "default", "description"):
            table.add_column(col, overflow="fold")
        for key, field in kind.config.model_fields.items():
            default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
            table.add_row(key, _type_name(field.annotation), default, field.description or "")
        out.print(table)
    if name is None:
        out.print("[dim]compress stages NAME shows a kind's settings.[/dim]")


def _type_name(ann) -> str:
    """Readable types for `compress stages`: Literal['a', 'b'] -> a|b, Optional[X] -> X|None."""
    from typing import Literal, Union, get_args, get_origin

    origin, args = get_origin(ann), get_args(ann)
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if origin is Union or type(ann).__name__ == "UnionType":
        return "|".join(_type_name(a) for a in args)
    if origin is not None and args:
        if type(ann).__name__ == "_AnnotatedAlias" or str(origin).endswith("Annotated"):
            return _type_name(args[0])
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    return "None" if ann is type(None) else getattr(ann, "__name__", str(ann))


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run folder (artifacts/NAME) or its report.json.")]) -> None:
    """Re-render the reports of a finished run (terminal table, report.md)."""
    from compress.report import print_report, read_report, write_reports

    rep = read_report(run_dir)
    print_report(rep)
    folder = run_dir if run_dir.is_dir() else run_dir.parent
    write_reports(rep, folder)


@app.command()
def gate(
    report_path: Annotated[Path, typer.Argument(metavar="REPORT", help="report.json or its run folder.")],
    variant: Annotated[str, typer.Option(help="The variant to check.")],
    max_drop: Annotated[Optional[float], typer.Option(help="Accuracy drop allowed in points (default: the report's budget).", min=0)] = None,
    device: Annotated[Optional[str], typer.Option(help="Device row to check (default: the report's deciding device).")] = None,
) -> None:
    """Check one variant of an existing report against the accuracy budget: exit 0 or 3."""
    from compress.console import out
    from compress.report import read_report

    rep = read_report(report_path)
    device = device or rep["decision"]["device"]
    rows = [r for r in rep["rows"] if r["id"] == variant and r["device"] == device]
    if not rows:
        known = sorted({r["id"] for r in rep["rows"]})
        raise CompressError(f"--variant: no variant '{variant}' on {device} in the report (known: {', '.join(known)})")
    r = rows[0]
    limit = rep["budget"]["max_accuracy_drop"] if max_drop is None else max_drop
    if not r["ok"] or r.get("delta") is None:
        out.print(f"FAIL {variant}: not measured ({r.get('error', 'no accuracy delta')})", highlight=False)
        raise typer.Exit(EXIT_BUDGET)
    gate_on = rep["budget"].get("gate_on", "point")
    value = r["delta_ci95"][0] if gate_on == "ci_lower" else r["delta"]
    ok = -value <= limit
    out.print(f"{'PASS' if ok else 'FAIL'} {variant} on {device}: accuracy {r['accuracy']:.2f}, delta "
              f"{r['delta']:+.2f} points (95% CI {r['delta_ci95'][0]:+.2f}..{r['delta_ci95'][1]:+.2f}); "
              f"allowed drop {limit:.2f} (on {gate_on})", highlight=False)
    raise typer.Exit(EXIT_OK if ok else EXIT_BUDGET)


@app.command()
def env() -> None:
    """Versions, CPU, GPU and thread settings of this machine."""
    import json

    from compress import manifest
    from compress.console import out

    out.print_json(json.dumps({"versions": manifest.versions(), "hardware": manifest.hardware(),
                               "threads_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
                               "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE")}))


def main() -> None:
    command = typer.main.get_command(app)
    try:
        code = command.main(args=sys.argv[1:], prog_name="compress", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else EXIT_OK)
    except CompressError as exc:
        if _state["debug"]:
            raise
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted; run again to resume (finished stages are kept)", 130)
    except Exception as exc:
        if _state["debug"] and not hasattr(exc, "format_message"):
            raise
        kind = type(exc).__name__
        if kind == "Exit":
            sys.exit(getattr(exc, "exit_code", EXIT_OK))
        if kind == "Abort":
            _fail("interrupted", 130)
        if hasattr(exc, "format_message"):  # click's usage errors (typer may vendor click)
            _fail(f"{exc.format_message()} (see compress --help)", EXIT_USAGE)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _fail(f"unexpected {kind}: {first[:300]} (re-run with --debug for the traceback)", EXIT_UNEXPECTED)


def _fail(message: str, code: int) -> None:
    from compress.console import err

    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)
