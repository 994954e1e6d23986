"""Running a causal-LM stage on a tiny model without a recipe run: the context a stage gets,
with only what the causal stages read."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from compress.data.context import StageContext


def causal_ctx(kind, model: Path, out: Path, **config) -> StageContext:
    out.mkdir(parents=True, exist_ok=True)
    recipe = SimpleNamespace(task="causal-lm", model=SimpleNamespace(trust_remote_code=False))
    return StageContext(stage_id="s", config=kind.config(**config), input=SimpleNamespace(path=model, format="hf"),
                        out=out, recipe=recipe, log=lambda m: None, threads=1)
