"""`optimize_onnx`: onnxruntime's transformer graph optimisations, written to disk.

Levels as in Optimum (ORTOptimizer / AutoOptimizationConfig): O1 basic graph rewrites
(constant folding, redundant nodes); O2 adds the transformer fusions (Attention,
SkipLayerNormalization, BiasGelu, EmbedLayerNormalization); O3 also replaces GELU by its
tanh approximation (FastGelu), which moves the logits slightly.

Why a separate, optional stage: onnxruntime performs most of these fusions itself when a
session loads a graph at its default level (ORT_ENABLE_ALL), so on a CPU an offline-fused
fp32 graph gains little over the plain export (1.09x at batch 1 on the accurate recipe's
small chain, in paired rounds, and less throughput at batch 32). Where it pays is before
quantize_onnx: the INT8 step then sees whole attention blocks and quantizes them as
QAttention, instead of quantizing the separate Q/K/V MatMuls that onnxruntime can no
longer fuse once they are INT8. On the shipped recipes' small chains that made the INT8
graph about 10% faster at batch 1, and its largest logit change from the fp32 graph (200
training examples) smaller in each model we compared: 0.24 against 0.53, 0.38 against
0.71, 0.57 against 0.64.
The attention fusion reads each layer's head count from the graph, so pruned models
(uneven heads) fuse too.

Model types: the fusion rules are onnxruntime's, chosen through Optimum's table of model
types (every family in compress/core/architectures.py has an entry). A model type without one
(or whose rules onnxruntime cannot apply) is not an error: the graph is copied unchanged with
a note, since onnxruntime still applies its generic rewrites when it loads the graph.

Order with quantize_onnx: both orders work. Quantizing a fused graph needs shape
information for onnxruntime's own operators, which quantize_onnx computes first.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt

from compress.core.registry import StageConfig, StageKind, StageResult


class Config(StageConfig):
    level: Literal["O1", "O2", "O3"] = Field(
        "O2",
        description="O1: basic graph rewrites; O2: plus transformer fusions; O3: plus approximate GELU.",
    )
    parity_examples: PositiveInt = Field(
        64, description="Calibration examples (training data) on which the result is compared with its input."
    )
    tolerance: NonNegativeFloat = Field(
        1e-2, description="Largest accepted absolute logit difference from the input graph (O3's GELU approximation moves logits a little)."
    )
    max_length: PositiveInt = Field(128, description="Tokens per parity example.")


class Result(StageResult):
    level: str
    operators: dict  # op type -> count in the optimised graph
    parity: dict


def run(ctx) -> Result:
    import collections
    import logging
    import shutil

    from optimum.onnxruntime import AutoOptimizationConfig, ORTOptimizer

    from compress.data.artifacts import copy_side_files
    from compress.core.errors import StageError
    from compress.formats import onnx as onnx_fmt

    cfg: Config = ctx.config
    src = onnx_fmt.model_file(ctx.input.path)
    unknown = _no_fusion_rules(ctx.input.path)
    if unknown:
        shutil.copy2(src, ctx.out / src.name)
        copy_side_files(ctx.input.path, ctx.out)
        ctx.log(f"  {unknown}")
        return Result(format="onnx", level=cfg.level, operators={}, parity={}, notes=[unknown])
    optimizer = ORTOptimizer.from_pretrained(ctx.input.path, file_names=[src.name])
    # for_gpu=False: fusions that run on every execution provider; the CUDA provider
    # runs the fused graph too.
    # On a head-pruned model the attention fusion warns, once per layer, that the layer's
    # attention width (heads x 64, e.g. 192) differs from the hidden size (384), then fuses
    # with the width it read from the weights, which is right (the parity check below
    # compares the logits). The warning reads as an error to a user, so it is muted here.
    # (onnxruntime imports the module under either name, depending on the version.)
    loggers = [logging.getLogger(n) for n in ("fusion_attention", "onnxruntime.transformers.fusion_attention")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        optimizer.optimize(getattr(AutoOptimizationConfig, cfg.level)(), ctx.out, file_suffix=None)
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
    copy_side_files(ctx.input.path, ctx.out)

    import onnx

    ops = collections.Counter(n.op_type for n in onnx.load(str(onnx_fmt.model_file(ctx.out))).graph.node)
    parity = onnx_fmt.compare(
        onnx_fmt.load(ctx.input.path, "cpu", ctx.threads, {}), onnx_fmt.load(ctx.out, "cpu", ctx.threads, {}),
        ctx.data.calibration(cfg.parity_examples), cfg.max_length,
    )
    fused = {k: v for k, v in ops.items() if k in ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu", "FastGelu", "Gelu")}
    ctx.log(f"  {cfg.level}: fused {dict(fused) or 'nothing'}; max |logit diff| {parity['max_abs_diff']:.2e}")
    if parity["max_abs_diff"] > cfg.tolerance:
        raise StageError(
            f"{ctx.stage_id}: the {cfg.level} graph moves the logits by {parity['max_abs_diff']:.3g} "
            f"(tolerance {cfg.tolerance:g}), label agreement {parity['label_agreement']:.2f}%; use a lower level"
        )
    notes = [] if fused or cfg.level == "O1" else ["no transformer pattern was fused"]
    return Result(format="onnx", level=cfg.level, operators=dict(sorted(ops.items())), parity=parity, notes=notes)


def _no_fusion_rules(folder) -> str | None:
    """Why onnxruntime's optimizer has no rules for the exported model's type, or None."""
    import json

    from optimum.onnxruntime.utils import ORTConfigManager

    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        model_type = None
    try:
        ORTConfigManager.check_optimization_supported_model(model_type, None)
    except (KeyError, NotImplementedError):
        return (f"onnxruntime's transformer optimizer has no fusion rules for model type '{model_type}': "
                f"the graph is copied unchanged (onnxruntime still applies its generic rewrites when it loads it)")
    return None


KIND = StageKind(
    name="optimize_onnx",
    summary="onnxruntime transformer graph fusions (Optimum levels O1-O3), with a parity check.",
    config=Config,
    result=Result,
    run=run,
    accepts=("onnx",),
    produces="onnx",
)
