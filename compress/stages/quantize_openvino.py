"""`quantize_openvino`: NNCF post-training quantization of an OpenVINO model.

- `int8`: static INT8 of weights and activations (`nncf.quantize`), activation ranges from
  a calibration slice of the training data (never the eval split), with NNCF's transformer
  preset (`model_type=TRANSFORMER`: SmoothQuant, and the operations whose quantization
  costs transformers accuracy left in float). The INT8 IR keeps FakeQuantize operations,
  which the CPU plugin runs as INT8 kernels.
  With `accuracy_control`, `nncf.quantize_with_accuracy_control` checks the accuracy on
  calibration examples and puts the most sensitive operations back to float, one group at
  a time, until the drop is within `max_drop` (default: half of the recipe's
  `budget.max_accuracy_drop`, as quantize_dynamic does); the layers left in float are
  recorded in the result.
- `weights_int8`, `weights_int4`: weight-only compression (`nncf.compress_weights`):
  weights stored as INT8 / INT4 with scales, activations stay float. Smaller files; the
  speed-up on a small encoder is not what it is on an LLM, where weights dominate memory
  traffic. INT4 keeps the embeddings and the last layer in INT8 (NNCF's backup mode).

Quantizing twice is refused at validation, as for quantize_onnx: a second rounding only
loses accuracy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt, confloat, model_validator

from compress.core.registry import StageConfig, StageKind, StageResult, refuse_after


class Config(StageConfig):
    mode: Literal["int8", "weights_int8", "weights_int4"] = Field(
        "int8", description="`int8`: static INT8 of weights and activations (calibrated); `weights_int8` / "
        "`weights_int4`: weight-only compression, activations stay float."
    )
    preset: Literal["mixed", "performance"] | None = Field(
        None, description="NNCF's quantization preset (`mixed`: asymmetric activations; `performance`: "
        "symmetric); unset: NNCF's default for transformers (mixed)."
    )
    calibration_examples: PositiveInt = Field(
        300, description="Training examples (outside the training subset) for the activation ranges (int8)."
    )
    fast_bias_correction: bool = Field(True, description="NNCF's fast bias correction (int8); off: the slower, full one.")
    accuracy_control: bool = Field(
        False, description="int8 only: put the most sensitive operations back to float until the accuracy drop "
        "on calibration examples is within `max_drop` (nncf.quantize_with_accuracy_control)."
    )
    max_drop: NonNegativeFloat | None = Field(
        None, description="Accuracy drop allowed by accuracy control on its calibration examples, in points. "
        "Default: half of budget.max_accuracy_drop, leaving room for the gap between calibration and eval data."
    )
    validation_examples: PositiveInt = Field(
        1000, description="Training examples (outside the training subset) on which accuracy control measures the drop."
    )
    max_iterations: PositiveInt = Field(
        8, description="Accuracy control: at most this many steps of putting operations back to float."
    )
    keep_fp32: list[str] = Field(
        default_factory=list,
        description="OpenVINO operation names (glob patterns, e.g. `*/classifier/*`) left in float.",
    )
    group_size: int = Field(
        128, ge=-1, description="weights_int4: weights per INT4 scale along the input axis (-1: one scale per "
        "output channel); a layer whose width it does not divide gets a smaller group."
    )
    ratio: confloat(gt=0, le=1) = Field(  # type: ignore[valid-type]
        1.0, description="weights_int4: share of the layers in INT4; the rest are INT8."
    )
    parity_examples: PositiveInt = Field(
        200, description="Calibration examples on which the result's labels are compared with its input's (reported only)."
    )
    max_length: PositiveInt = Field(128, description="Tokens per calibration and parity example.")

    @model_validator(mode="after")
    def _accuracy_control_needs_int8(self):
        if self.accuracy_control and self.mode != "int8":
            raise ValueError("accuracy_control works with mode int8 only (weight-only compression has no activations to revert)")
        if self.group_size == 0:
            raise ValueError("group_size must be positive, or -1 for one scale per output channel")
        return self


class Result(StageResult):
    mode: str
    preset: str | None
    operations: dict  # FakeQuantize count and the compressed weight types in the result
    fp32_layers: list[str]  # int8: weight MatMuls whose activations stayed float
    accuracy_control: dict  # examples, fp32_accuracy, int8_accuracy, target_drop, met (when on)
    size_bytes: dict  # {"input": ..., "output": ...} of model.bin
    parity: dict


def run(ctx) -> Result:
    import collections
    from fnmatch import fnmatch

    import nncf
    import numpy as np
    import openvino as ov
    from transformers import AutoTokenizer

    from compress.data.artifacts import copy_side_files
    from compress.formats import onnx as onnx_fmt, openvino as ov_fmt

    cfg: Config = ctx.config
    src = ov_fmt.model_file(ctx.input.path)
    model = ov.Core().read_model(str(src))
    inputs = [i.get_any_name() for i in model.inputs]
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)

    def items(split) -> list:
        # One example per item, each its own length (no padding): (model inputs [1, T], label).
        enc = tokenizer(split.texts, split.pairs, truncation=True, max_length=cfg.max_length)
        return [({k: np.asarray([enc[k][i]], dtype=np.int64) for k in inputs}, int(split.labels[i]))
                for i in range(len(split.texts))]

    names = [op.get_friendly_name() for op in model.get_ops()]
    ignored = [n for n in names if any(fnmatch(n, p) for p in cfg.keep_fp32)]
    scope = nncf.IgnoredScope(names=ignored) if ignored else None
    preset = getattr(nncf.QuantizationPreset, cfg.preset.upper()) if cfg.preset else None
    control: dict = {}
    with _quiet():
        if cfg.mode == "int8":
            calib = items(ctx.data.calibration(cfg.calibration_examples))
            dataset = nncf.Dataset(calib, lambda item: item[0])
            common = dict(preset=preset, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib),
                          fast_bias_correction=cfg.fast_bias_correction, ignored_scope=scope)
            if cfg.accuracy_control:
                from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

                target = cfg.max_drop if cfg.max_drop is not None else ctx.budget.max_accuracy_drop / 2
                validation = nncf.Dataset(items(ctx.data.calibration(cfg.validation_examples)), lambda item: item[0])
                ctx.log(f"  INT8 with accuracy control on {cfg.validation_examples} calibration examples "
                        f"(target drop <= {target:.2f} points)")
                quantized = nncf.quantize_with_accuracy_control(
                    model, dataset, validation, _validate, max_drop=target, drop_type=nncf.DropType.ABSOLUTE,
                    advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                        max_num_iterations=cfg.max_iterations),
                    **common,
                )
                control = {"examples": cfg.validation_examples, "target_drop": target}
            else:
                ctx.log(f"  INT8, calibrated on {len(calib)} training examples")
                quantized = nncf.quantize(model, dataset, **common)
        else:
            from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

            int4 = cfg.mode == "weights_int4"
            mode = nncf.CompressWeightsMode.INT4_SYM if int4 else nncf.CompressWeightsMode.INT8_ASYM
            extra = dict(ratio=cfg.ratio, group_size=cfg.group_size,
                         advanced_parameters=AdvancedCompressionParameters(
                             group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)) if int4 else {}
            ctx.log(f"  weight-only {'INT4' if int4 else 'INT8'} compression")
            quantized = nncf.compress_weights(model, mode=mode, ignored_scope=scope, **extra)
    ov_fmt.save(quantized, ctx.out)
    copy_side_files(ctx.input.path, ctx.out)

    ops = collections.Counter(op.get_type_name() for op in quantized.get_ops())
    weights = collections.Counter(op.get_element_type().get_type_name() for op in ov_fmt.weight_constants(quantized))
    operations = {"FakeQuantize": ops.get("FakeQuantize", 0), "weights": dict(sorted(weights.items()))}
    fp32_layers = _float_matmuls(quantized) if cfg.mode == "int8" else []
    before = ov_fmt.load(ctx.input.path, "cpu", ctx.threads, {"trust_remote_code": ctx.recipe.model.trust_remote_code})
    after = ov_fmt.load(ctx.out, "cpu", ctx.threads, {"trust_remote_code": ctx.recipe.model.trust_remote_code})
    parity = onnx_fmt.compare(before, after, ctx.data.calibration(cfg.parity_examples), cfg.max_length)
    if control:
        validation = items(ctx.data.calibration(cfg.validation_examples))
        base, acc = _validate(before.compiled, validation)[0], _validate(after.compiled, validation)[0]
        control.update(fp32_accuracy=base, int8_accuracy=acc, met=bool(base - acc <= control["target_drop"]))
        ctx.log(f"  calibration accuracy: fp32 {base:.2f}, INT8 {acc:.2f}; {len(fp32_layers)} layers left in float")
    sizes = {"input": (ctx.input.path / ov_fmt.WEIGHTS_FILE).stat().st_size,
             "output": (ctx.out / ov_fmt.WEIGHTS_FILE).stat().st_size}
    ctx.log(
        f"  {cfg.mode}: {sizes['input'] / 1e6:.1f} -> {sizes['output'] / 1e6:.1f} MB, label agreement with the "
        f"input {parity['label_agreement']:.2f}% on {parity['examples']} calibration examples"
    )
    notes = []
    if control and not control["met"]:
        notes.append(f"calibration drop {control['fp32_accuracy'] - control['int8_accuracy']:.2f} points stays above "
                     f"the target {control['target_drop']:.2f} after {cfg.max_iterations} steps of accuracy control")
    return Result(
        format="openvino", mode=cfg.mode, preset=cfg.preset, operations=operations, fp32_layers=fp32_layers,
        accuracy_control=control, size_bytes=sizes, parity=parity, notes=notes,
    )


def _validate(compiled, data) -> tuple[float, list[float]]:
    """Accuracy (percent) of a compiled model over (inputs, label) items, and each item's
    0/100, which NNCF's accuracy control ranks the operations by."""
    per_item = [100.0 * float(compiled(inputs)[0].argmax(-1)[0] == label) for inputs, label in data]
    return (sum(per_item) / len(per_item) if per_item else 0.0), per_item


def _float_matmuls(model) -> list[str]:
    """Names of the weight MatMuls (Linear layers) whose activation input is not quantized:
    the layers NNCF left in float (its ignored patterns, keep_fp32, accuracy control)."""
    out = []
    for op in model.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        sources = [_producer(v.get_node()) for v in op.input_values()]
        if not any(s.get_type_name() in ("Constant", "Convert", "Multiply") and _from_constant(s) for s in sources):
            continue  # activation x activation (attention scores): not a Linear layer
        if not any(s.get_type_name() == "FakeQuantize" for s in sources):
            out.append(op.get_friendly_name())
    return out


def _producer(node):
    """The node behind shape-only operations (Reshape, Transpose, Squeeze)."""
    while node.get_type_name() in ("Reshape", "Transpose", "Squeeze", "Unsqueeze"):
        node = node.input_value(0).get_node()
    return node


def _from_constant(node, depth: int = 4) -> bool:
    """Whether `node` computes from constants alone (a weight, possibly decompressed)."""
    if node.get_type_name() == "Constant":
        return True
    if depth == 0 or node.get_type_name() not in ("Convert", "Multiply", "Subtract", "Reshape", "Transpose"):
        return False
    return all(_from_constant(v.get_node(), depth - 1) for v in node.input_values())


class _quiet:
    """NNCF prints progress bars and tables on stdout (rich) and logs at INFO: the run's own
    log lines say what the stage does, so both are held back (warnings still show)."""

    def __enter__(self):
        import contextlib
        import io
        import logging

        import nncf

        self._level = logging.getLogger("nncf").level
        nncf.set_log_level(logging.WARNING)
        self._redirect = contextlib.redirect_stdout(io.StringIO())
        self._redirect.__enter__()
        return self

    def __exit__(self, *exc):
        import nncf

        self._redirect.__exit__(*exc)
        nncf.set_log_level(self._level or 20)
        return False


KIND = StageKind(
    name="quantize_openvino",
    summary="NNCF INT8 of an OpenVINO model (static, optionally accuracy-controlled) or weight-only INT8/INT4.",
    config=Config,
    result=Result,
    run=run,
    accepts=("openvino",),
    produces="openvino",
    budget_keys=("max_accuracy_drop",),
    check_input=refuse_after(  # what the `from` chain may not hold, and why
        "quantize_openvino",
        "its input is already quantized (a quantize_openvino stage is upstream); quantizing twice only "
        "adds rounding error: take the export_openvino output instead",
    ),
)
