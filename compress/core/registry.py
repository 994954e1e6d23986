"""The stage registry: every stage kind is a pydantic config, a typed result and a
`run(ctx)` function, registered under an explicit name in CATALOGUE (name -> the module
that defines it as `KIND`). The catalogue is data: a stage module is imported the first
time its kind is asked for, so this bottom-layer module imports no stage (nor anything a
stage imports), and validating a recipe imports only the stages it uses.

Artifact formats name what a stage writes to its folder, so the recipe validator can
check that a stage is fed something it can take before any model loads:

- `checkpoint`: a transformers model folder without a task head (only model sources).
- `hf`: a transformers sequence-classification folder (safetensors + tokenizer).
- `torch_int8`: torch dynamic INT8 weights as safetensors (see formats/torch_int8.py).
- `onnx`: an ONNX model folder with its tokenizer.
- `openvino`: an OpenVINO IR folder (model.xml + model.bin) with its tokenizer.
- `bnb_4bit`: a bitsandbytes 4-bit model (loaded from an `hf` folder plus its settings).
- `cascade`: two variants combined by a confidence threshold.
- `torchao`: torchao weight-only INT8 / INT4 of a causal LM (see formats/torchao.py).
- `genai`: an onnxruntime-genai folder (genai_config.json + model.onnx) with its tokenizer.
- `gguf`: a GGUF file run by llama.cpp (model.gguf) with its tokenizer (see formats/llamacpp.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict

Format = Literal["checkpoint", "hf", "torch_int8", "onnx", "openvino", "bnb_4bit", "cascade", "torchao", "genai", "gguf"]


@dataclass(frozen=True)
class ModelSource:
    """A model a stage config names besides its stages (distill's `student`): a hub id,
    local folder or `package:MODULE`, as the recipe's `model.source` takes them."""

    source: str
    revision: str | None = None


class StageConfig(BaseModel):
    """Base of every stage's `with:` block: unknown keys are errors, never ignored."""

    # allow_inf_nan=False: `.inf`, `1e400` or `.nan` for a float setting is an error naming
    # the key (an infinite learning rate trains a NaN model without a word).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def refs(self) -> dict[str, str]:
        """Other stages this one reads besides its `from` input, as {config key: stage id}."""
        return {}

    def sources(self) -> dict[str, ModelSource]:
        """Models this stage reads that are neither stages nor the recipe's model, as {config
        key: source}: their files enter the stage's fingerprint, so an edited folder re-runs it."""
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
    # run(ctx: compress.data.context.StageContext) -> its result. Typed Any here: the context
    # (layer 2) knows the recipe and the data, and this bottom layer imports neither.
    run: Callable[[Any], StageResult]
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
    # The stage reads the GGUF file the recipe's model was converted from (llama.cpp requantizes
    # it): validation refuses it unless its input is the recipe's model and that is a GGUF file.
    reads_gguf_source: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def refuse_after(upstream: str, why: str) -> Callable[[list[tuple[str, StageConfig | None]]], str | None]:
    """A StageKind.check_input that refuses an input coming through a stage of kind
    `upstream` anywhere up the `from` chain, saying `why`."""

    def check(chain: list[tuple[str, StageConfig | None]]) -> str | None:
        return why if any(kind == upstream for kind, _ in chain) else None

    return check


# Stage kind name -> the module that defines it as `KIND` (its `name` is this key).
# Order is the listing order of `compress stages`.
CATALOGUE: dict[str, str] = {
    "finetune": "compress.stages.finetune",
    "quantize_dynamic": "compress.stages.quantize_dynamic",
    "cascade": "compress.stages.cascade",
    "distill": "compress.stages.distill",
    "prune": "compress.stages.prune",
    "trim_vocab": "compress.stages.trim_vocab",
    "export_onnx": "compress.stages.export_onnx",
    "optimize_onnx": "compress.stages.optimize_onnx",
    "quantize_onnx": "compress.stages.quantize_onnx",
    "export_openvino": "compress.stages.export_openvino",
    "quantize_openvino": "compress.stages.quantize_openvino",
    "load_4bit": "compress.stages.load_4bit",
    "quantize_weights": "compress.stages.quantize_weights",
    "export_onnx_lm": "compress.stages.export_onnx_lm",
    "quantize_onnx_lm": "compress.stages.quantize_onnx_lm",
    "export_genai": "compress.stages.export_genai",
    "quantize_gguf": "compress.stages.quantize_gguf",
}

# The kinds imported so far, by name. registry() returns this very dict once it holds the
# whole catalogue, so a test may replace or remove a kind in it (monkeypatch.setitem).
_kinds: dict[str, StageKind] = {}
_complete = False


def _load(name: str) -> StageKind:
    kind = importlib.import_module(CATALOGUE[name]).KIND
    if kind.name != name:  # a catalogue typo would otherwise register a kind twice
        raise RuntimeError(f"{CATALOGUE[name]} defines stage kind '{kind.name}', catalogued as '{name}'")
    return kind


def registry() -> dict[str, StageKind]:
    """Every stage kind by name, in catalogue order (imports every stage module once)."""
    global _complete
    if not _complete:
        loaded = {name: _kinds[name] if name in _kinds else _load(name) for name in CATALOGUE}
        loaded.update({name: kind for name, kind in _kinds.items() if name not in loaded})
        _kinds.clear()
        _kinds.update(loaded)
        _complete = True
    return _kinds


def get_stage(name: str) -> StageKind:
    """One stage kind, importing its module only (see CATALOGUE)."""
    if name not in _kinds:
        if _complete or name not in CATALOGUE:  # complete: a kind removed from registry() is gone
            raise KeyError(f"unknown stage kind '{name}'; valid: {', '.join(sorted(registry()))}")
        _kinds[name] = _load(name)
    return _kinds[name]
