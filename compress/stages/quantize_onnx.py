"""`quantize_onnx`: onnxruntime INT8, dynamic or static, through Optimum's ORTQuantizer.

- dynamic: weights INT8 ahead of time, activations quantized on the fly per batch
  (DynamicQuantizeLinear + MatMulInteger). No calibration data needed.
- static: activation ranges fixed from calibration examples of the training data
  (never the eval split), stored as QuantizeLinear/DequantizeLinear pairs (QDQ) that
  onnxruntime folds into INT8 kernels when the session loads.

The preset follows the CPU's instruction set (Optimum's AutoQuantizationConfig: avx2
uses unsigned INT8 weights, avx512 / avx512_vnni / arm64 signed ones); `auto` reads it
from the machine running the stage and the result records which one was used and why.

Embeddings: with `quantize_embeddings` the word-embedding Gather is quantized too
(dynamic mode), which matters for size: a BERT's vocabulary table is often a fifth of
its weights or more.

Order: a graph fused by optimize_onnx contains onnxruntime's own operators (Attention,
SkipLayerNormalization), which ONNX's shape inference does not know, and the quantizer
then fails with "Unable to find data type for weight_name ...". The stage therefore runs
onnxruntime's symbolic shape inference (quant_pre_process) first, which knows them; the
fused Attention then becomes QAttention. Quantizing an INT8 graph again is rejected at
validation: a second rounding only loses accuracy.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt, confloat

from compress.core.registry import StageConfig, StageKind, StageResult, refuse_after

PRESETS = ("avx2", "avx512", "avx512_vnni", "arm64")


class Config(StageConfig):
    mode: Literal["dynamic", "static"] = Field(
        "dynamic", description="`dynamic`: activations quantized per batch at run time; `static`: fixed "
        "activation ranges from calibration examples."
    )
    preset: Literal["auto", "avx2", "avx512", "avx512_vnni", "arm64"] = Field(
        "auto", description="Optimum's quantization preset for the target CPU; `auto` picks it from this machine's instruction set."
    )
    per_channel: bool = Field(True, description="One weight scale per output channel (more accurate) rather than per matrix.")
    quantize_embeddings: bool = Field(
        True, description="Quantize the embedding tables (Gather) as well, in dynamic mode: a large part of a small model's size."
    )
    keep_fp32: list[str] = Field(
        default_factory=list,
        description="ONNX node names (glob patterns, e.g. `/classifier/*`) left in fp32.",
    )
    calibration_examples: PositiveInt = Field(
        200, description="Training examples (outside the training subset) for static calibration."
    )
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="How static activation ranges are chosen from the calibration activations."
    )
    percentile: confloat(gt=90, le=100) = Field(  # type: ignore[valid-type]
        99.999, description="Percentile of the activation histogram kept, for calibration_method `percentile`."
    )
    parity_examples: PositiveInt = Field(
        200, description="Calibration examples on which the INT8 graph's labels are compared with its input's (reported only)."
    )
    max_length: PositiveInt = Field(128, description="Tokens per calibration and parity example.")


class Result(StageResult):
    mode: str
    preset: str
    preset_reason: str
    per_channel: bool
    operators: list[str]  # op types the quantizer was allowed to quantize
    quantized: dict  # INT8 op type -> count in the result
    size_bytes: dict  # {"input": ..., "output": ...} of the .onnx file
    parity: dict


def cpu_preset() -> tuple[str, str]:
    """(preset, why) for this machine, from its architecture and CPU flags."""
    machine = platform.machine().lower()
    if machine in ("arm64", "aarch64"):
        return "arm64", f"machine is {machine}"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "avx512_vnni", "CPU has AVX-512 VNNI"
    if "avx512f" in flags and "avx512bw" in flags:
        return "avx512", "CPU has AVX-512"
    if "avx2" in flags:
        return "avx2", "CPU has AVX2"
    return "avx2", "CPU flags unknown; AVX2 assumed (the most common x86-64 target)"


def run(ctx) -> Result:
    import collections
    import shutil
    import tempfile
    from fnmatch import fnmatch

    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from optimum.onnxruntime import AutoCalibrationConfig, AutoQuantizationConfig, ORTQuantizer
    from optimum.onnxruntime.configuration import (
        ORT_DEFAULT_OPS_DYNAMIC_QUANTIZATION,
        ORT_DEFAULT_OPS_STATIC_QUANTIZATION_QDQ,
    )

    from compress.formats import onnx as onnx_fmt
    from compress.data.artifacts import copy_side_files

    cfg: Config = ctx.config
    src = onnx_fmt.model_file(ctx.input.path)
    preset, why = cpu_preset() if cfg.preset == "auto" else (cfg.preset, "set in the recipe")
    static = cfg.mode == "static"
    ops = list(ORT_DEFAULT_OPS_STATIC_QUANTIZATION_QDQ if static else ORT_DEFAULT_OPS_DYNAMIC_QUANTIZATION)
    # In exported BERTs a Where builds the additive attention mask (0 or float32 min): INT8
    # buys nothing there, and its +-3.4e38 range overflows the histogram calibrators
    # (entropy, percentile: "Too many bins for data range").
    ops = [o for o in ops if o != "Where"]
    if not cfg.quantize_embeddings:
        ops = [o for o in ops if o not in ("Gather", "EmbedLayerNormalization")]
    node_names = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node]
    exclude = [n for n in node_names if any(fnmatch(n, p) for p in cfg.keep_fp32)]
    qconfig = getattr(AutoQuantizationConfig, preset)(
        is_static=static, per_channel=cfg.per_channel, operators_to_quantize=ops, nodes_to_exclude=exclude,
    )

    with tempfile.TemporaryDirectory(prefix="quantize_onnx-") as tmp:
        work = Path(tmp) / "in"
        work.mkdir()
        # Symbolic shape inference knows onnxruntime's fused operators, so a graph from
        # optimize_onnx quantizes too (see the module docstring).
        quant_pre_process(str(src), str(work / onnx_fmt.MODEL_FILE), skip_optimization=True, auto_merge=True)
        shutil.copy2(ctx.input.path / "config.json", work / "config.json")
        quantizer = ORTQuantizer.from_pretrained(work, file_name=onnx_fmt.MODEL_FILE)
        ranges = None
        if static:
            ranges = _calibrate(ctx, cfg, quantizer, ops, Path(tmp), AutoCalibrationConfig)
        quantizer.quantize(qconfig, ctx.out, file_suffix=None, calibration_tensors_range=ranges)
    copy_side_files(ctx.input.path, ctx.out)

    out_file = onnx_fmt.model_file(ctx.out)
    counts = collections.Counter(n.op_type for n in onnx.load(str(out_file)).graph.node)
    quantized = {k: v for k, v in sorted(counts.items()) if k in onnx_fmt.INT8_OPS or k == "DequantizeLinear"}
    parity = onnx_fmt.compare(
        onnx_fmt.load(ctx.input.path, "cpu", ctx.threads, {}), onnx_fmt.load(ctx.out, "cpu", ctx.threads, {}),
        ctx.data.calibration(cfg.parity_examples), cfg.max_length,
    )
    sizes = {"input": src.stat().st_size, "output": out_file.stat().st_size}
    ctx.log(
        f"  {cfg.mode} INT8, preset {preset} ({why}): {sizes['input'] / 1e6:.1f} -> {sizes['output'] / 1e6:.1f} MB, "
        f"label agreement with the input {parity['label_agreement']:.2f}% on {parity['examples']} calibration examples"
    )
    return Result(
        format="onnx", mode=cfg.mode, preset=preset, preset_reason=why, per_channel=cfg.per_channel,
        operators=ops, quantized=quantized, size_bytes=sizes, parity=parity,
    )


def _calibrate(ctx, cfg: Config, quantizer, ops, tmp: Path, AutoCalibrationConfig) -> dict:
    """Activation ranges from calibration examples, one example per batch."""
    import onnxruntime as ort
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    inputs = [i.name for i in ort.InferenceSession(str(quantizer.onnx_model_path), providers=["CPUExecutionProvider"]).get_inputs()]
    calib = ctx.data.calibration(cfg.calibration_examples)
    # minmax keeps running extremes, so each example can have its own length (no padding).
    # The histogram methods stack every batch's activations into one array, which needs one
    # shape: there all examples are padded to the longest (padding tokens are computed in
    # deployment too whenever a batch is padded, so their activations are fair samples).
    histogram = cfg.calibration_method != "minmax"
    enc = tokenizer(calib.texts, calib.pairs, truncation=True, max_length=cfg.max_length, padding=histogram)
    dataset = Dataset.from_dict({k: enc[k] for k in inputs})
    method = {
        "minmax": lambda: AutoCalibrationConfig.minmax(dataset),
        "entropy": lambda: AutoCalibrationConfig.entropy(dataset),
        "percentile": lambda: AutoCalibrationConfig.percentiles(dataset, percentile=cfg.percentile),
    }[cfg.calibration_method]()
    ctx.log(f"  calibrating on {len(dataset)} training examples ({cfg.calibration_method})")
    return quantizer.fit(
        dataset=dataset, calibration_config=method, operators_to_quantize=ops,
        onnx_augmented_model_name=str(tmp / "augmented.onnx"),
    )


KIND = StageKind(
    name="quantize_onnx",
    summary="onnxruntime INT8 (dynamic, or static with calibration), preset from the CPU's instruction set.",
    config=Config,
    result=Result,
    run=run,
    accepts=("onnx",),
    produces="onnx",
    check_input=refuse_after(  # what the `from` chain may not hold, and why
        "quantize_onnx",
        "its input is already INT8 (a quantize_onnx stage is upstream); quantizing twice only adds "
        "rounding error: take the export or optimize_onnx output instead",
    ),
)
