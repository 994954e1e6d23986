"""The stage registry: every stage kind is a pydantic config, a typed result and a
`run(ctx)` function, registered under an explicit name (see `compress/stages/__init__.py`).

Artifact formats name what a stage writes to its folder, so the recipe validator can
check that a stage is fed something it can take before any model loads:

- `checkpoint`: a transformers model folder without a task head (only model sources).
- `hf`: a transformers sequence-classification folder (safetensors + tokenizer).
- `torch_int8`: torch dynamic INT8 weights as safetensors (see formats/torch_int8.py).
- `onnx`: an ONNX model folder with its tokenizer.
- `openvino`: an OpenVINO IR folder (model.xml + model.bin) with its tokenizer.
- `bnb_4bit`: a bitsandbytes 4-bit model (loaded from an `hf` folder plus its settings).
- `cascade`: two variants combined by a confidence threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # pragma: no cover
    from compress.context import StageContext

Format = Literal["checkpoint", "hf", "torch_int8", "onnx", "openvino", "bnb_4bit", "cascade"]


class StageConfig(BaseModel):
    """Base of every stage's `with:` block: unknown keys are errors, never ignored."""

    # allow_inf_nan=False: `.inf`, `1e400` or `.nan` for a float setting is an error naming
    # the key (an infinite learning rate trains a NaN model without a word).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def refs(self) -> dict[str, str]:
        """Other stages this one reads besides its `from` input, as {config key: stage id}."""
        return {}


class StageResult(BaseModel):
    """What a stage returns; saved as `result.json` beside its outputs."""

    model_config = ConfigDict(extra="forbid")

    format: Format
    notes: list[str] = []


@dataclass(frozen=True)
class StageKind:
    name: str
    summary: str
    config: type[StageConfig]
    result: type[StageResult]
    run: Callable[["StageContext"], StageResult]
    accepts: tuple[Format, ...]  # formats the `from` input may have
    produces: Format
    # Formats a config ref (see StageConfig.refs) may point at.
    ref_accepts: tuple[Format, ...] = ()
    # Keys of the recipe's `budget` block that this stage reads: a change to them must
    # re-run the stage, so they enter its fingerprint.
    budget_keys: tuple[str, ...] = ()
    # Optional validation against the config.json (as a dict) of the stage's input model,
    # called by recipe validation when that file is at hand without running anything (the
    # input is the recipe's model): returns a problem ("key: why") or None.
    check_model: Callable[[StageConfig, dict], str | None] | None = None
    # Optional check of the stages the input comes through, called by recipe validation
    # with the `from` chain, nearest first, as (stage kind name, its config) pairs (the
    # recipe's model ends it as ('model', None)): returns why the order is refused, or None.
    check_input: Callable[[list[tuple[str, StageConfig | None]]], str | None] | None = None
    # Whether the output has the input's architecture (config.json's model_type) under this
    # config: validation follows the `from` chain up through such stages to the recipe's
    # model, so `check_model` refuses an unsupported family before any stage trains. None:
    # the architecture may change (or is not an `hf` model), and the chain stops there.
    keeps_architecture: Callable[[StageConfig], bool] | None = None
    # Optional validation against the tokenizer.json (as a dict) of the tokenizer the stage
    # gets, when that is the recipe's model's and at hand: returns a problem ("key: why") or None.
    check_tokenizer: Callable[[StageConfig, dict], str | None] | None = None
    # The stage fits a new classification head for the data (finetune): a classifier given
    # to it need not have the data's label count.
    new_head: bool = False
    # The output has another tokenizer than the input (trim_vocab): the stages downstream
    # of it no longer share token ids with the rest of the recipe.
    new_tokenizer: bool = False
    # The config refs must use the `from` input's tokenizer (for a kind that tokenises once
    # for its input and its refs); checked at validation through `new_tokenizer` on the way
    # up. No kind needs it today: a cascade's members each tokenize for themselves.
    refs_share_tokenizer: bool = False
    # The tasks (compress/tasks) whose models the stage can take and make: a recipe whose
    # `task` is not among them is refused at validation.
    tasks: tuple[str, ...] = ("sequence-classification",)
    extra: dict[str, Any] = field(default_factory=dict)


def registry() -> dict[str, StageKind]:
    from compress.stages import STAGES

    return STAGES


def get_stage(name: str) -> StageKind:
    stages = registry()
    if name not in stages:
        raise KeyError(f"unknown stage kind '{name}'; valid: {', '.join(sorted(stages))}")
    return stages[name]
