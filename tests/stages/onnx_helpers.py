"""Runs ONNX and 4-bit stage kinds directly on a folder of any format (no runner, no
benchmark), for the tests of export_onnx, optimize_onnx, quantize_onnx and load_4bit."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import tiny_recipe


def run_kind(uses: str, settings: dict, src: Path, fmt: str, data: Path, out: Path, model: Path | None = None,
             device: str = "cpu"):
    """Runs stage kind `uses` with `settings` on the artifact folder `src` (format `fmt`);
    writes into `out` (recreated). `model` is any classifier folder, for the recipe."""
    from compress.data.artifacts import Artifact
    from compress.data.context import StageContext
    from compress.tasks.classification.data import Data
    from compress.recipe.schema import validate_recipe
    from compress.core.registry import get_stage

    raw = tiny_recipe(model or src, data)
    raw["data"]["max_train_examples"] = 200
    raw["stages"] = raw["stages"][:1]
    recipe = validate_recipe(raw)
    kind = get_stage(uses)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    dataset = Data(recipe.data, recipe.base_dir)
    ctx = StageContext(
        stage_id=out.name, config=kind.config.model_validate(settings),
        input=Artifact("input", src, fmt, "fp"), out=out, recipe=recipe,
        _data=lambda: dataset, log=lambda m: None, threads=1, device=device,
    )
    result = kind.run(ctx)
    assert result.format == kind.produces
    return result
