"""`export_openvino`: a classifier to OpenVINO IR, through `openvino.convert_model`.

The input is either the ONNX export (`onnx`: OpenVINO's ONNX frontend reads the graph
export_onnx wrote) or the transformers model itself (`hf`: OpenVINO's PyTorch frontend
traces it). Batch and sequence axes stay dynamic, so one IR serves every batch size and
length. Weights are stored in fp32 (openvino.save_model would halve them to fp16 by
default); quantize_openvino makes the INT8 / INT4 variants.

Like export_onnx, the stage runs the result and its source on real eval sentences and
fails when they disagree beyond the configured limits (the source is onnxruntime for an
ONNX input, torch for a transformers one).

A graph fused by optimize_onnx converts too (OpenVINO reads onnxruntime's Attention,
SkipLayerNormalization and BiasGelu); the plain export is the simpler source. An INT8 ONNX
graph (quantize_onnx upstream) is refused at validation: OpenVINO would run
onnxruntime's quantization as it is, and INT8 for OpenVINO is quantize_openvino's job.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, PositiveInt

from compress.core.registry import StageConfig, StageKind, StageResult, refuse_after


class Config(StageConfig):
    parity_examples: PositiveInt = Field(
        200, description="Eval sentences on which the IR is compared with its source (onnxruntime or torch)."
    )
    tolerance: NonNegativeFloat = Field(
        1e-3, description="Largest accepted absolute logit difference between OpenVINO and its source."
    )
    min_label_agreement: float = Field(
        99.5, ge=0, le=100,
        description="Smallest accepted share (percent) of parity sentences on which both predict the same label.",
    )
    max_length: PositiveInt = Field(128, description="Tokens per parity sentence.")


class Result(StageResult):
    source: str  # "onnx" or "torch": what was converted
    openvino: str  # the OpenVINO version that converted it
    inputs: list[str]
    parity: dict  # examples, max_abs_diff, label_agreement


def run(ctx) -> Result:
    import warnings

    import openvino as ov
    from transformers import AutoTokenizer

    from compress.techniques import parity as parity_check
    from compress.data.artifacts import copy_side_files
    from compress.core.errors import StageError
    from compress.formats import hf, onnx as onnx_fmt, openvino as ov_fmt

    cfg: Config = ctx.config
    split = ctx.data.eval.select(range(min(cfg.parity_examples, len(ctx.data.eval))))
    if ctx.input.format == "onnx":
        source = "onnx"
        reference = onnx_fmt.load(ctx.input.path, "cpu", ctx.threads, {"trust_remote_code": ctx.recipe.model.trust_remote_code})
        try:
            model = ov.convert_model(str(onnx_fmt.model_file(ctx.input.path)))
        except Exception as exc:
            raise StageError(f"{ctx.stage_id}: OpenVINO cannot read the ONNX graph of '{ctx.input.id}' "
                             f"({str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__}); "
                             f"convert the plain export_onnx output or the transformers model") from exc
    else:
        import torch

        source = "torch"
        torch.set_num_threads(ctx.threads)
        tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
        module = hf.load_model(ctx.input.path, ctx.recipe.model.trust_remote_code).eval()
        reference = hf.TorchPredictor(ctx.input.path, module, tokenizer, "cpu")
        # The trace needs one example batch; two sentences of different lengths, padded.
        texts = split.texts[:2] if len(split.texts) >= 2 else ["a", "a longer example"]
        example = dict(tokenizer(texts, truncation=True, max_length=cfg.max_length, padding=True, return_tensors="pt"))
        with warnings.catch_warnings(), torch.inference_mode():
            # Tracing warns about constants it records (the attention-mask fill value): harmless.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            model = ov.convert_model(module, example_input=example)
        # The frontend names each input after the argument and a graph value ("attention_mask",
        # "64"): keep the argument's name alone, the one the loader feeds by.
        for inp in model.inputs:
            named = inp.get_names() & set(example)
            if named:
                inp.get_tensor().set_names(named)
        # Without an input shape, the frontend leaves every axis dynamic; say so on the model.
        model.reshape({i.get_any_name(): ov.PartialShape([-1, -1]) for i in model.inputs})
    ov_fmt.save(model, ctx.out)
    if source == "onnx":
        copy_side_files(ctx.input.path, ctx.out)
    else:
        module.config.save_pretrained(ctx.out)
        tokenizer.save_pretrained(ctx.out)

    exported = ov_fmt.load(ctx.out, "cpu", ctx.threads, {"trust_remote_code": ctx.recipe.model.trust_remote_code})
    parity = onnx_fmt.compare(reference, exported, split, cfg.max_length)
    ctx.log(
        f"  parity with {source} on {parity['examples']} eval sentences: max |logit diff| "
        f"{parity['max_abs_diff']:.2e}, label agreement {parity['label_agreement']:.2f}%"
    )
    parity_check.require(
        parity, stage_id=ctx.stage_id, what=f"the OpenVINO model does not match its {source} source",
        tolerance=cfg.tolerance, min_label_agreement=cfg.min_label_agreement,
        hint="convert from the other source (hf or onnx) or raise with.tolerance",
    )
    return Result(format="openvino", source=source, openvino=ov.get_version(), inputs=list(exported.input_names),
                  parity=parity)


KIND = StageKind(
    name="export_openvino",
    summary="Convert a classifier (transformers or ONNX) to OpenVINO IR (dynamic axes) and check parity on eval sentences.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf", "onnx"),
    produces="openvino",
    check_input=refuse_after(  # what the `from` chain may not hold, and why
        "quantize_onnx",
        "its input is an INT8 ONNX graph (a quantize_onnx stage is upstream): convert the fp32 export "
        "and quantize it with quantize_openvino instead",
    ),
)
