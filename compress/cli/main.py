"""The `compress` command line: thin commands over the library, one-line errors.

Exit codes: 0 success, 1 unexpected failure, 2 bad usage / recipe / input,
3 no compressed variant within the accuracy budget (the CI gate).
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from compress.core.errors import EXIT_BUDGET, EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, CompressError

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
    if debug:  # the runner and the benchmark processes read it too
        os.environ["COMPRESS_DEBUG"] = "1"


@app.command()
def validate(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Check a recipe (keys, types, stage graph, formats) without loading any model."""
    from compress.core.console import out
    from compress.recipe.schema import load_recipe

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
    no_rebuild: Annotated[bool, typer.Option("--no-rebuild", help="Fail (exit 2) instead of running a stage whose output is missing, stale or corrupt.")] = False,
) -> None:
    """Run a recipe: stages, benchmark, decision, reports. Exit 3 if no compressed variant is within budget."""
    from compress.core.console import log
    from compress.core.errors import RecipeError
    from compress.recipe.schema import load_recipe
    from compress.reports.render import print_report
    from compress.reports.report_json import as_report
    from compress.run.runner import run_recipe

    r = load_recipe(recipe, set_ or [])
    if artifacts.exists() and not artifacts.is_dir():
        raise CompressError(f"--artifacts: '{artifacts}' is a file, not a folder; point it at a folder (created if missing)")
    ids = {s.id for s in r.stages}
    for f in force or []:
        if f not in ids:
            raise RecipeError("--force", f, f"names no stage (known: {', '.join(sorted(ids))})")
    if force and no_rebuild:
        raise CompressError("--force and --no-rebuild contradict each other; use one")
    written = run_recipe(r, artifacts, tuple(force or ()), threads=threads, rebuild=not no_rebuild)
    if written is None:  # a secondary process of `accelerate launch`: the main one reports
        return
    report = as_report(written)
    print_report(report)
    run_dir = Path(report.run_dir)
    log(f"reports: {run_dir / 'report.md'}, {run_dir / 'report.html'}, "
        f"{run_dir / 'report.json'}, {run_dir / 'junit.xml'}"
        f" ({report.manifest.seconds or 0:.0f}s)")
    raise typer.Exit(report.decision.exit_code)


@app.command()
def stages(name: Annotated[Optional[str], typer.Argument(help="Show one stage kind.")] = None) -> None:
    """List the stage kinds with their settings and documentation."""
    from rich.table import Table

    from compress.core.console import out
    from compress.core.registry import get_stage, registry

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
    """Re-render the reports of a finished run (terminal table, report.md, report.html, junit.xml)."""
    from compress.reports.render import print_report, write_reports
    from compress.reports.report_json import read_report

    rep = read_report(run_dir)
    print_report(rep)
    folder = run_dir if run_dir.is_dir() else run_dir.parent
    write_reports(rep, folder)


@app.command()
def load(
    run_dir: Annotated[Path, typer.Argument(help="A finished run folder (artifacts/NAME).", show_default=False)],
    recipe: Annotated[Optional[Path], typer.Option(help="The recipe with the `serving:` block (default: the "
                                                   "one the run was made from).")] = None,
    set_: SetOpt = None,
    variant: Annotated[Optional[str], typer.Option(help="The variant to serve (default: the run's selected one).")] = None,
    gguf: Annotated[Optional[str], typer.Option(help="Causal LMs: serve this GGUF file (a .gguf path or package:MODULE) "
                                                "instead of a run's variant; RUN_DIR is where the figures go (give --recipe).")] = None,
) -> None:
    """Serve the run's variant in each configuration, measure it under load (MLPerf LoadGen's server scenario over
    HTTP) and plan capacity and $/month for the recipe's traffic. A causal LM's GGUF variant is served by llama-server,
    a request at a time and batched continuously, on LoadGen's token latencies (TTFT, TPOT)."""
    from compress.core.console import log
    from compress.recipe.schema import load_recipe
    from compress.reports.render import print_report
    from compress.reports.report_json import read_report
    from compress.run.load import load_run

    if recipe is None and gguf is not None:
        raise CompressError("--gguf: give --recipe FILE too (its lm.timing dialogues are the prompts)")
    if recipe is None:
        made_from = read_report(run_dir).manifest.recipe_file
        if not made_from or not Path(made_from).is_file():
            raise CompressError(f"{run_dir}: the recipe it was made from is not at hand ({made_from or 'not recorded'}); "
                                f"give --recipe FILE")
        recipe = Path(made_from)
    r = load_recipe(recipe, set_ or [])
    if r.is_causal:
        from compress.run.load_lm import load_lm_run
        from compress.serving.lm_load import SERVING_LM_DIR, SERVING_LM_JSON

        load_lm_run(r, run_dir, variant=variant, gguf=gguf, log=log)
        log(f"figures: {run_dir / SERVING_LM_DIR / SERVING_LM_JSON}")
        return
    if gguf is not None:
        raise CompressError("--gguf serves causal LMs; this recipe's task is " + r.task)
    if r.serving is None:
        raise CompressError(f"{recipe}: no `serving:` block, so nothing to load; add one "
                            f"(recipes/bert_sentiment.yaml has an example) or give --recipe FILE")
    rep = load_run(r, run_dir, variant=variant, log=log)
    print_report(rep)
    log(f"reports: {run_dir / 'report.md'}, {run_dir / 'report.html'}, {run_dir / 'serving' / 'serving.json'}")
    raise typer.Exit(rep.decision.exit_code if rep.budget.objective == "min_monthly_cost" else EXIT_OK)


@app.command("llama-server")
def llama_server(
    source: Annotated[Optional[Path], typer.Option(help="A llama.cpp checkout to build from (default: the llama.cpp "
                                                   "that the installed llama-cpp-python's source package vendors).")] = None,
    jobs: Annotated[Optional[int], typer.Option(help="Compile jobs (default: the usable CPUs).", min=1)] = None,
    force: Annotated[bool, typer.Option(help="Build again even when it is built.")] = False,
) -> None:
    """Build llama.cpp's llama-server (continuous batching; what `compress load` serves a causal LM's GGUF variant
    with) into ~/.cache/compress/llama-server/, once per llama-cpp-python version; print its path."""
    from compress.core.console import log
    from compress.serving import llama_server as ls

    found = None if force or source is not None else ls.find()
    if found is not None:
        log(f"llama-server: {found} ({ls.version_of(found)})")
        print(found)
        return
    built = ls.build(source=source, jobs=jobs, force=force or source is not None, log=log)
    print(built.path)


@app.command()
def gate(
    report_path: Annotated[Path, typer.Argument(metavar="REPORT", help="report.json or its run folder.")],
    variant: Annotated[str, typer.Option(help="The variant to check.")],
    max_drop: Annotated[Optional[float], typer.Option(help="Accuracy drop allowed in points (default: the report's budget).", min=0)] = None,
    device: Annotated[Optional[str], typer.Option(help="Device row to check (default: the report's deciding device).")] = None,
) -> None:
    """Check one variant of an existing report against the quality budget (accuracy for a classifier): exit 0 or 3."""
    from compress.core.console import out
    from compress.decision.decide import quality_check
    from compress.reports.report_json import read_report

    rep = read_report(report_path)
    device = device or rep.decision.device
    rows = [r for r in rep.rows if r.id == variant and r.device == device]
    if not rows:
        known = sorted({r.id for r in rep.rows})
        raise CompressError(f"--variant: no variant '{variant}' on {device} in the report (known: {', '.join(known)})")
    r = rows[0]
    metric = rep.metric
    limit = rep.budget.quality_limit(rep.metric.name) if max_drop is None else max_drop
    if not r.ok or r.delta is None or r.delta_ci95 is None:
        out.print(f"FAIL {variant}: not measured ({r.error or f'no {metric.name} delta'})", highlight=False)
        raise typer.Exit(EXIT_BUDGET)
    gate_on = rep.budget.gate_on
    ok = quality_check(r, limit, gate_on, metric).status == "pass"
    lo, hi = r.delta_ci95
    out.print(f"{'PASS' if ok else 'FAIL'} {variant} on {device}: {metric.name} {r.quality:.2f}, delta "
              f"{r.delta:+.2f} {metric.delta_unit} (95% CI {lo:+.2f}..{hi:+.2f}); "
              f"allowed drop {limit:.2f} (on {gate_on})", highlight=False)
    raise typer.Exit(EXIT_OK if ok else EXIT_BUDGET)


@app.command()
def env() -> None:
    """Versions, CPU, GPU and thread settings of this machine."""
    import json

    from compress.core import manifest
    from compress.core.console import out

    out.print_json(json.dumps({"versions": manifest.versions(), "hardware": manifest.hardware(),
                               "threads_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
                               "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE")}))


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="The reference run folder or report.json (e.g. the main branch).")],
    run_b: Annotated[Path, typer.Argument(help="The run to check against it (e.g. a pull request).")],
    fail_on_regression: Annotated[bool, typer.Option(help="Exit 3 when a change beyond noise is flagged.")] = False,
    markdown: Annotated[Optional[Path], typer.Option(help="Also write the comparison as Markdown to this file.")] = None,
) -> None:
    """Per-variant change in accuracy, latency, size and $/1K between two runs, with regressions beyond noise flagged."""
    from compress.reports.compare import compare as compare_runs
    from compress.reports.compare import markdown as compare_markdown
    from compress.reports.compare import print_comparison

    cmp = compare_runs(run_a, run_b)
    print_comparison(cmp)
    if markdown is not None:
        markdown.write_text(compare_markdown(cmp), encoding="utf-8")
    raise typer.Exit(EXIT_BUDGET if fail_on_regression and cmp["regressions"] else EXIT_OK)


@app.command()
def serve(
    run_dir: Annotated[Path, typer.Argument(help="A finished run folder (artifacts/NAME).", show_default=False)],
    variant: Annotated[Optional[str], typer.Option(help="The variant to serve (default: the run's selected one).")] = None,
    port: Annotated[Optional[int], typer.Option(help="HTTP port (default: serving.server.port; 0 picks a free one).",
                                                min=0, max=65535)] = None,
    address: Annotated[Optional[str], typer.Option(help="A Ray cluster to serve on (ray://HOST:10001 or auto) "
                                                   "instead of a local Ray started and stopped here.")] = None,
    recipe: Annotated[Optional[Path], typer.Option(help="Take the serving block from this recipe instead of the "
                                                   "one the run was made with.")] = None,
    host: Annotated[Optional[str], typer.Option(help="Listen address (default: serving.server.host).")] = None,
    replicas: Annotated[Optional[int], typer.Option(help="Model replicas (serving.server.num_replicas).", min=1)] = None,
    threads: Annotated[Optional[int], typer.Option(help="Intra-op threads per replica (serving.server.threads).", min=1)] = None,
    max_batch_size: Annotated[Optional[int], typer.Option(help="Texts per model call (serving.server.max_batch_size); "
                                                          "1 serves unbatched.", min=1)] = None,
    batch_wait_ms: Annotated[Optional[float], typer.Option(help="Longest wait for a batch to fill, in ms "
                                                           "(serving.server.batch_wait_timeout_s).", min=0)] = None,
    cache: Annotated[Optional[str], typer.Option(help="Result cache: none, memory or redis (serving.cache.kind).")] = None,
    cache_url: Annotated[Optional[str], typer.Option(help="Redis URL of the redis cache (serving.cache.url).")] = None,
) -> None:
    """Serve a variant of a finished run over HTTP on Ray Serve (POST /predict, GET /healthz, GET /metrics) until SIGTERM or Ctrl-C."""
    import signal
    import threading

    from pydantic import ValidationError

    from compress.core.console import log
    from compress.recipe.schema import load_recipe
    from compress.recipe.serving import ServingSpec
    from compress.serving.server import run_serving_spec, start

    if recipe is not None:
        spec = load_recipe(recipe).serving or ServingSpec()
    else:
        spec = run_serving_spec(run_dir)
    raw = spec.model_dump(mode="json", exclude_unset=True)
    server_over = {"host": host, "num_replicas": replicas, "threads": threads, "max_batch_size": max_batch_size,
                   "batch_wait_timeout_s": None if batch_wait_ms is None else batch_wait_ms / 1000}
    cache_over = {"kind": cache, "url": cache_url}
    for block, over in (("server", server_over), ("cache", cache_over)):
        given = {k: v for k, v in over.items() if v is not None}
        if given:
            raw[block] = {**raw.get(block, {}), **given}
    if replicas is not None:  # a fixed count replaces the recipe's autoscaling
        raw["server"].pop("autoscaling", None)
    try:
        spec = ServingSpec.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        raise CompressError(f"serving.{where}: {e['msg'].removeprefix('Value error, ')} (from the recipe or a flag)") from exc

    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server = start(run_dir, spec, variant=variant, port=spec.server.port if port is None else port, address=address)
    except KeyboardInterrupt:  # start() has stopped what it began
        log("interrupted before the server was up; nothing is left running")
        raise typer.Exit(128 + 15 if _state.get("terminated") else 130) from None
    try:
        for sig in previous:  # after start(): Ray's init sets handlers of its own
            signal.signal(sig, lambda *_: stop.set())
        s = spec.server
        log(f"serving {server.variant} at {server.url} (POST /predict, GET /healthz, GET /metrics); "
            f"batch <= {s.max_batch_size} texts, {s.num_replicas if s.autoscaling is None else 'autoscaled'} "
            f"replica(s) x {s.threads} thread(s), cache {spec.cache.kind}; SIGTERM or Ctrl-C stops it")
        while not stop.wait(0.5):
            pass
        log(f"stopping: draining requests in flight (at most {s.drain_timeout_s:g}s)")
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log("stopped")


@app.command()
def init(
    model: Annotated[str, typer.Option(help="Model source: hub id, local folder or package:MODULE.")],
    dataset: Annotated[str, typer.Option(help="Dataset: hub id, or a local folder or file.")],
    text: Annotated[Optional[str], typer.Option(
        help="Column holding the text (default: sentence, or a common pair such as premise/hypothesis).")] = None,
    text_pair: Annotated[Optional[str], typer.Option(help="Column holding the second text, for pair tasks.")] = None,
    label: Annotated[str, typer.Option(help="Column holding the labels (integers or class names).")] = "label",
    config: Annotated[Optional[str], typer.Option(help="Configuration of a hub dataset (glue: mnli, qqp, ...).")] = None,
    output: Annotated[Path, typer.Option(help="Recipe file to write.")] = Path("recipe.yaml"),
    force: Annotated[bool, typer.Option(help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter recipe for a model and a dataset, sized for this machine."""
    from compress.core.console import out
    from compress.run.init import write

    write(model, dataset, text or "sentence", label, output, force=force, text_pair=text_pair, config=config,
          guess_pair=text is None)
    out.print(f"wrote {output}; next: compress validate {output} && compress run {output}", highlight=False)


def _on_sigterm(signum, frame) -> None:
    """SIGTERM (a CI job cancelled, `kill`, a container stopped) ends the run as Ctrl-C does:
    the stage being written is discarded, the benchmark worker is stopped and reaped
    (compress/bench/benchmark.py, stop_worker; it also dies with its parent), and one line
    is printed. Only the first one counts: any later one (a CI runner or a supervisor often
    sends several) is ignored from here to the exit. Raised into the clean-up, it would stop
    it halfway (the worker left running, a traceback instead of the line); arriving while
    the interpreter shuts down, when Python has put the default action back for a handler
    of its own, it would kill the run (-15) or run this handler amid the teardown."""
    import signal

    if _state.get("terminated"):
        return
    _state["terminated"] = True
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an ignored signal stays ignored through the teardown
    except ValueError:  # pragma: no cover - not the main thread
        pass
    raise KeyboardInterrupt


def _interrupted() -> None:
    if _state.get("terminated"):
        _fail(TERMINATED, 128 + 15)
    _fail(INTERRUPTED, 130)


def main() -> None:
    import signal

    command = typer.main.get_command(app)
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (an embedding program): its own handling stays
        pass
    try:
        code = command.main(args=sys.argv[1:], prog_name="compress", standalone_mode=False)
        if code == 130:  # typer turns Ctrl-C into a silent exit code 130
            _interrupted()
        sys.exit(code if isinstance(code, int) else EXIT_OK)
    except CompressError as exc:
        if _state["debug"]:
            raise
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:
        if _state["debug"] and not hasattr(exc, "format_message"):
            raise
        kind = type(exc).__name__
        if kind == "Exit":
            sys.exit(getattr(exc, "exit_code", EXIT_OK))
        if kind == "Abort":
            _interrupted()
        disk = _disk_problem(exc)
        if disk:
            _fail(disk, EXIT_USAGE)
        if hasattr(exc, "format_message"):  # click's usage errors (typer may vendor click)
            _fail(f"{exc.format_message()} (see compress --help)", EXIT_USAGE)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _fail(f"unexpected {kind}: {first[:300]} (re-run with --debug for the traceback)", EXIT_UNEXPECTED)


INTERRUPTED = "interrupted; run again to resume (finished stages are kept)"
TERMINATED = "terminated (SIGTERM); run again to resume (finished stages are kept)"

# errno -> (what happened, what to do). Some writers (safetensors' Rust core) report the
# OS error only in their message, hence the texts.
_DISK_ERRORS = {
    errno.ENOSPC: ("no space left on the device", "free some space or point --artifacts at a larger disk, then run again"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or point --artifacts at another disk, then run again"),
    errno.EROFS: ("read-only file system", "point --artifacts at a writable folder"),
    errno.EACCES: ("permission denied", "fix the permissions of that path, or point --artifacts at a folder you can write to"),
}
_DISK_TEXTS = {
    errno.ENOSPC: ("No space left on device", "StorageFull", "os error 28"),
    errno.EDQUOT: ("Disk quota exceeded", "QuotaExceeded", "os error 122"),
    errno.EROFS: ("Read-only file system", "ReadOnlyFilesystem", "os error 30"),
    errno.EACCES: ("Permission denied", "PermissionDenied", "os error 13"),
}


def _disk_problem(exc: BaseException) -> str | None:
    """A one-line message for a write that failed for want of space or permission
    (the exception or one it was raised from), else None. Stage outputs are written to a
    temporary folder first, so such a failure never leaves a trusted partial output."""
    seen = 0
    while exc is not None and seen < 8:
        code = exc.errno if isinstance(exc, OSError) else None
        if code not in _DISK_ERRORS:
            text = str(exc)
            code = next((c for c, needles in _DISK_TEXTS.items() if any(n in text for n in needles)), None)
        if code in _DISK_ERRORS:
            what, todo = _DISK_ERRORS[code]
            name = getattr(exc, "filename", None)
            return f"{what}{f' ({name})' if name else ''}; {todo} (finished stages are kept)"
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


MAX_ERROR_CHARS = 500


def _fail(message: str, code: int) -> None:
    from compress.core.console import err

    from rich.markup import escape

    from compress.reports.render import printable

    # One line whatever the input held (an id with a newline, say), printed as written:
    # "[int8] ..." is a stage id, not rich markup. Control characters and right-to-left
    # overrides (which reorder what the terminal shows) are written as escapes, and a huge
    # value quoted in the message (a 50 MB --set) is cut in the middle.
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    if len(message) > MAX_ERROR_CHARS:
        half = MAX_ERROR_CHARS // 2
        message = f"{message[:half]} ... ({len(message) - 2 * half} characters left out) ... {message[-half:]}"
    message = printable(message)
    if len(message) > MAX_ERROR_CHARS + 60:  # escapes lengthened it
        message = message[:MAX_ERROR_CHARS] + " ..."
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)
