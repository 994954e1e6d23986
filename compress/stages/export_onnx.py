"""`export_onnx`: a transformers classifier to ONNX, through Optimum's exporter.

Batch and sequence axes stay dynamic, so one graph serves every batch size and length.
Whatever the torch side looks like (fewer layers, pruned heads via `config.pruned_heads`,
a smaller feed-forward, a trimmed vocabulary), the exporter traces the module as it is.

Optimum only warns when the exported graph drifts from its source; here the stage runs
both on real eval sentences and fails when they disagree beyond the configured limits,
so a broken export never reaches the benchmark.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, PositiveInt

from compress.core.registry import StageConfig, StageKind, StageResult


class Config(StageConfig):
    opset: PositiveInt | None = Field(
        None, description="ONNX opset; unset uses Optimum's recommended opset for the architecture."
    )
    parity_examples: PositiveInt = Field(
        200, description="Eval sentences on which the export is compared with its torch source."
    )
    tolerance: NonNegativeFloat = Field(
        1e-3, description="Largest accepted absolute logit difference between ONNX and torch."
    )
    min_label_agreement: float = Field(
        99.5, ge=0, le=100,
        description="Smallest accepted share (percent) of parity sentences on which both predict the same label.",
    )
    max_length: PositiveInt = Field(128, description="Tokens per parity sentence.")


class Result(StageResult):
    opset: int
    inputs: list[str]
    parity: dict  # examples, max_abs_diff, label_agreement


def run(ctx) -> Result:
    import warnings

    import torch
    from optimum.exporters.onnx import onnx_export_from_model
    from transformers import AutoTokenizer

    from compress.techniques import parity as parity_check
    from compress.formats import hf, onnx as onnx_fmt

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    model = hf.load_model(ctx.input.path, ctx.recipe.model.trust_remote_code).eval()
    # Optimum validates with random inputs and only logs a warning on a mismatch; the
    # parity check below replaces it with real sentences and a hard failure.
    with warnings.catch_warnings():
        # Tracing warns about constants it records (the attention-mask fill value): harmless.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        onnx_export_from_model(
            model, ctx.out, opset=cfg.opset, task="text-classification", do_validation=False, device="cpu",
        )
    tokenizer.save_pretrained(ctx.out)

    import onnx

    graph = onnx.load(str(onnx_fmt.model_file(ctx.out)), load_external_data=False)
    opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
    inputs = [i.name for i in graph.graph.input]

    reference = hf.TorchPredictor(ctx.input.path, model, tokenizer, "cpu")
    exported = onnx_fmt.load(ctx.out, "cpu", ctx.threads, {})
    split = ctx.data.eval.select(range(min(cfg.parity_examples, len(ctx.data.eval))))
    parity = onnx_fmt.compare(reference, exported, split, cfg.max_length)
    ctx.log(
        f"  parity on {parity['examples']} eval sentences: max |logit diff| {parity['max_abs_diff']:.2e}, "
        f"label agreement {parity['label_agreement']:.2f}%"
    )
    parity_check.require(
        parity, stage_id=ctx.stage_id, what="ONNX export does not match its torch source", tolerance=cfg.tolerance,
        min_label_agreement=cfg.min_label_agreement, hint="try another opset or raise with.tolerance",
    )
    return Result(format="onnx", opset=opset, inputs=inputs, parity=parity)


KIND = StageKind(
    name="export_onnx",
    summary="Export a classifier to ONNX (Optimum; dynamic axes) and check parity on eval sentences.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="onnx",
)
