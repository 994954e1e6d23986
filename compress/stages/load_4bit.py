"""`load_4bit`: bitsandbytes 4-bit weights (NF4 or FP4) for the encoder's Linear layers.

Weights are stored packed, two 4-bit codes per byte with one scale per block of 64
(`double_quant` quantizes those scales again, saving about 0.4 bits per weight); each
matmul dequantizes on the fly and computes in `compute_dtype`. The classification head
(and the pooler feeding it) stays in full precision, as do embeddings and norms.

Storage: transformers saves a bitsandbytes 4-bit model as safetensors (packed weights
plus their quantization state) and reloads it directly, so the folder's size is the
real size as stored. bitsandbytes >= 0.47 runs 4-bit on the CPU as well as on CUDA.

A 4-bit model is an end point: it cannot be exported to ONNX or quantized again
(export_onnx and quantize_* do not accept `bnb_4bit`; validation says why).
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from compress.core.registry import StageConfig, StageKind, StageResult

DTYPES = ("float32", "bfloat16", "float16")


class Config(StageConfig):
    quant_type: Literal["nf4", "fp4"] = Field(
        "nf4", description="4-bit code: `nf4` (normal-float, suited to normally distributed weights) or `fp4`."
    )
    compute_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Precision of the matmuls after dequantization. float16/bfloat16 are faster on a GPU; "
        "on a CPU without bf16 instructions they are slower than float32.",
    )
    double_quant: bool = Field(True, description="Quantize the block scales too (smaller, same accuracy).")
    keep_full_precision: list[str] = Field(
        default_factory=lambda: ["classifier", "pooler", "pre_classifier"],
        description="Modules (name parts) left in full precision: the classification head by default.",
    )
    parity_examples: PositiveInt = Field(
        128, description="Calibration examples on which 4-bit and full-precision labels are compared (reported only)."
    )
    max_length: PositiveInt = Field(128, description="Tokens per parity example.")

    @model_validator(mode="after")
    def _backend_installed(self) -> "Config":
        # A cheap check at validation time (no import): the package must be there.
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError("bitsandbytes is not installed; pip install 'bitsandbytes>=0.47' (CPU and CUDA 4-bit)")
        return self


class Result(StageResult):
    quant_type: str
    compute_dtype: str
    double_quant: bool
    linear_4bit: int  # Linear layers stored in 4 bits
    memory_bytes: int  # weights in memory (transformers' get_memory_footprint)
    device: str
    parity: dict


def run(ctx) -> Result:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, BitsAndBytesConfig

    from compress.core.errors import StageError
    from compress.formats import bnb_4bit, hf, onnx as onnx_fmt

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    problem = bnb_4bit.check_backend(ctx.device)
    if problem:
        raise StageError(f"{ctx.stage_id}: {problem}")
    qconfig = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=cfg.quant_type,
        bnb_4bit_compute_dtype=getattr(torch, cfg.compute_dtype),
        bnb_4bit_use_double_quant=cfg.double_quant,
        llm_int8_skip_modules=list(cfg.keep_full_precision),
    )
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    # bitsandbytes' CPU kernels repack each 4-bit weight [out, in] into blocks of 64
    # inputs x 32 outputs on first use, so layers of other shapes stay in full precision.
    odd = [n for n in bnb_4bit.unpackable_layers(hf.load_model(ctx.input.path, ctx.recipe.model.trust_remote_code))
           if not any(k in n.split(".") for k in cfg.keep_full_precision)]
    qconfig.llm_int8_skip_modules = list(cfg.keep_full_precision) + odd
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            ctx.input.path, quantization_config=qconfig, use_safetensors=True,
            trust_remote_code=ctx.recipe.model.trust_remote_code,
            # Without dtype, transformers loads the non-quantized parts in float16.
            dtype=torch.float32, device_map={"": ctx.device},
        )
    except (ImportError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise StageError(f"{ctx.stage_id}: bitsandbytes 4-bit loading failed on {ctx.device}: {first[:200]}")
    model.eval()
    n4 = bnb_4bit.count_4bit(model)
    if n4 == 0:
        raise StageError(f"{ctx.stage_id}: no Linear layer was quantized to 4 bits; check keep_full_precision")
    model.save_pretrained(ctx.out, safe_serialization=True)
    tokenizer.save_pretrained(ctx.out)

    reference = hf.load(ctx.input.path, "cpu", ctx.threads, {})
    quantized = bnb_4bit.Bnb4bitPredictor(ctx.out, model, tokenizer, ctx.device)
    parity = onnx_fmt.compare(reference, quantized, ctx.data.calibration(cfg.parity_examples), cfg.max_length)
    memory = int(model.get_memory_footprint())
    ctx.log(
        f"  {n4} Linear layers in {cfg.quant_type}{' (double quant)' if cfg.double_quant else ''}, "
        f"{memory / 1e6:.1f} MB in memory; label agreement with fp32 {parity['label_agreement']:.2f}%"
    )
    notes = [f"{len(odd)} Linear layers kept in full precision: their shape is not a multiple of "
             f"{bnb_4bit.BLOCK_IN}x{bnb_4bit.BLOCK_OUT}"] if odd else []
    return Result(
        format="bnb_4bit", notes=notes, quant_type=cfg.quant_type, compute_dtype=cfg.compute_dtype,
        double_quant=cfg.double_quant, linear_4bit=n4, memory_bytes=memory, device=ctx.device, parity=parity,
    )


KIND = StageKind(
    name="load_4bit",
    summary="bitsandbytes 4-bit (NF4/FP4) weights, head in full precision; CPU or GPU.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="bnb_4bit",
)
