"""`quantize_dynamic`: torch dynamic INT8 of the Linear layers (weights INT8 ahead of time,
activations quantized on the fly), stored without pickle (see formats/torch_int8.py).

`accuracy_aware` mode does what Intel Neural Compressor is known for: if quantizing every
Linear layer costs more accuracy than allowed on a calibration slice of the training
data (never the eval split), the layers whose quantization hurts the logits most are
put back to fp32, one at a time, until the drop is within the target. Which layers stayed
fp32 is recorded in the result.

A causal LM (task `causal-lm`) has no labelled calibration slice: every Linear layer is
quantized (mode `all`) except the `keep_fp32` patterns, which default for a causal LM to
CAUSAL_KEEP_FP32 (see there why).
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from compress.core.registry import StageConfig, StageKind, StageResult


class Config(StageConfig):
    scheme: Literal["per_channel", "per_tensor"] = Field(
        "per_channel",
        description="Weight scales per output channel (more accurate) or one per matrix.",
    )
    mode: Literal["all", "accuracy_aware"] = Field(
        "accuracy_aware",
        description="`all` quantizes every Linear layer; `accuracy_aware` keeps the most "
        "sensitive ones in fp32 until the calibration accuracy drop is within `max_drop`.",
    )
    max_drop: NonNegativeFloat | None = Field(
        None,
        description="Accuracy drop allowed on the calibration slice, in points. Default: half "
        "of budget.max_accuracy_drop, leaving room for the gap between calibration and eval data.",
    )
    calibration_examples: PositiveInt = Field(
        1000, description="Training examples (outside the training subset) for the accuracy check."
    )
    sensitivity_examples: PositiveInt = Field(
        256, description="Calibration examples used to rank layer sensitivity (one pass per layer)."
    )
    max_fp32_layers: NonNegativeInt = Field(
        8, description="At most this many Linear layers go back to fp32."
    )
    keep_fp32: list[str] = Field(
        default_factory=list,
        description="Linear layer names (glob patterns, e.g. `classifier`) never quantized.",
    )
    max_length: PositiveInt = Field(128, description="Tokens per calibration example.")


class Result(StageResult):
    scheme: str
    quantized_layers: int
    fp32_layers: list[str]
    calibration: dict  # accuracies on the calibration slice


# A causal LM's default fp32 layers, measured on SmolLM2-135M (wikitext-2, one 512-token
# window, fp32 perplexity 20.3): every Linear INT8 gives 56.3; the MLP's down projections
# kept fp32 give 25.3 (o_proj kept: 51.7, up_proj kept: 49.5). Their input, SiLU(gate) * up
# [B, T, intermediate], has outlier channels that one dynamic scale per tensor cannot cover.
# A tied lm_head kept fp32 is stored once with the embedding (29 MB less on disk than its
# INT8 copy, on four windows perplexity 88 against 94 with it INT8).
CAUSAL_KEEP_FP32 = ["*.mlp.down_proj"]


def is_causal(ctx) -> bool:
    return getattr(ctx.recipe, "task", None) == "causal-lm"


def run(ctx) -> Result:
    if is_causal(ctx):
        return _run_causal(ctx)
    import copy

    import torch
    from transformers import AutoTokenizer

    from compress.formats import hf, torch_int8
    from compress.techniques.predict import encode, predict_logits

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    fp32 = hf.load_model(ctx.input.path, ctx.recipe.model.trust_remote_code).eval()
    names = torch_int8.linear_layers(fp32)
    forced = [n for n in names if any(fnmatch(n, p) for p in cfg.keep_fp32)]

    def quantized(keep: list[str]):
        layers = {n: cfg.scheme for n in names if n not in keep}
        return torch_int8.quantize(copy.deepcopy(fp32), layers), layers

    fp32_layers = list(forced)
    model, layers = quantized(fp32_layers)
    calibration: dict = {}
    if cfg.mode == "accuracy_aware":
        target = cfg.max_drop if cfg.max_drop is not None else ctx.budget.max_accuracy_drop / 2
        calib = ctx.data.calibration(cfg.calibration_examples)
        enc = encode(tokenizer, calib, cfg.max_length)
        labels = calib.labels

        def accuracy(m) -> float:
            return float((predict_logits(m, tokenizer, enc).argmax(-1) == labels).mean() * 100)

        base_acc = accuracy(fp32)
        acc = accuracy(model)
        ctx.log(f"  calibration ({len(labels)} ex): fp32 {base_acc:.2f}, all INT8 {acc:.2f} (target drop <= {target:.2f})")
        steps = [{"fp32_layers": len(fp32_layers), "accuracy": acc}]
        if base_acc - acc > target and cfg.max_fp32_layers > 0:
            with ctx.progress(len([n for n in names if n not in forced]), "layer sensitivity") as bar:
                ranked = _rank_sensitivity(fp32, names, forced, tokenizer, calib, cfg, quantized, bar.advance)
            best = (acc, list(fp32_layers), model, layers)
            for name in ranked[: cfg.max_fp32_layers]:
                fp32_layers.append(name)
                model, layers = quantized(fp32_layers)
                acc = accuracy(model)
                steps.append({"fp32_layers": len(fp32_layers), "added": name, "accuracy": acc})
                ctx.log(f"  keep {name} in fp32: calibration accuracy {acc:.2f}")
                if acc > best[0]:
                    best = (acc, list(fp32_layers), model, layers)
                if base_acc - acc <= target:
                    break
            acc, fp32_layers, model, layers = best
        calibration = {
            "examples": int(len(labels)), "fp32_accuracy": base_acc, "int8_accuracy": acc,
            "target_drop": target, "met": bool(base_acc - acc <= target), "steps": steps,
        }

    fp32.config.save_pretrained(ctx.out)
    tokenizer.save_pretrained(ctx.out)
    torch_int8.save(model, layers, fp32_layers, ctx.out)
    notes = []
    if calibration and not calibration["met"]:
        notes.append(
            f"calibration drop {calibration['fp32_accuracy'] - calibration['int8_accuracy']:.2f} points stays "
            f"above the target {calibration['target_drop']:.2f} with {len(fp32_layers)} fp32 layers"
        )
    return Result(
        format="torch_int8", scheme=cfg.scheme, quantized_layers=len(layers),
        fp32_layers=fp32_layers, calibration=calibration, notes=notes,
    )


def _run_causal(ctx) -> Result:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from compress.formats import torch_int8

    cfg: Config = ctx.config
    if "mode" in cfg.model_fields_set and cfg.mode == "accuracy_aware":
        raise ValueError("quantize_dynamic: mode accuracy_aware needs a labelled calibration slice, which a "
                         "causal LM has not; use mode: all (and keep_fp32 for layers to leave in fp32)")
    torch.set_num_threads(ctx.threads)
    trust = ctx.recipe.model.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(ctx.input.path, dtype=torch.float32, use_safetensors=True,
                                                 trust_remote_code=trust).eval()
    names = torch_int8.linear_layers(model)
    keep = cfg.keep_fp32
    if "keep_fp32" not in cfg.model_fields_set:
        tied = model.get_output_embeddings() is not None and \
            model.get_output_embeddings().weight is model.get_input_embeddings().weight
        keep = CAUSAL_KEEP_FP32 + (["lm_head"] if tied else [])
    fp32_layers = [n for n in names if any(fnmatch(n, p) for p in keep)]
    layers = {n: cfg.scheme for n in names if n not in fp32_layers}
    torch_int8.quantize(model, layers)
    model.config.save_pretrained(ctx.out)
    try:
        GenerationConfig.from_pretrained(ctx.input.path, trust_remote_code=False).save_pretrained(ctx.out)
    except OSError:  # a folder without generation_config.json: transformers derives one from config.json
        pass
    tokenizer.save_pretrained(ctx.out)
    torch_int8.save(model, layers, fp32_layers, ctx.out)
    ctx.log(f"  {len(layers)} Linear layers INT8 ({cfg.scheme}), {len(fp32_layers)} kept fp32")
    return Result(format="torch_int8", scheme=cfg.scheme, quantized_layers=len(layers), fp32_layers=fp32_layers,
                  calibration={}, notes=[f"causal LM: no accuracy-aware fallback; fp32 layers by pattern: {', '.join(keep) or 'none'}"])


def _check_model(cfg: Config, config: dict) -> str | None:
    archs = config.get("architectures") or []
    causal = isinstance(archs, list) and any(str(a).endswith("ForCausalLM") for a in archs)
    if causal and "mode" in cfg.model_fields_set and cfg.mode == "accuracy_aware":
        return "mode: accuracy_aware needs a labelled calibration slice, which a causal LM has not; use mode: all"
    return None


def _rank_sensitivity(fp32, names, forced, tokenizer, calib, cfg: Config, quantized, on_layer=None) -> list[str]:
    """Layers ordered by how much quantizing each one alone moves the logits:
    mean KL(p_fp32 || p_int8) over `sensitivity_examples` calibration examples.
    `on_layer(1)` after each layer (a progress bar's advance)."""
    import copy

    import torch

    from compress.formats import torch_int8
    from compress.techniques.predict import encode, predict_logits

    sub = calib.select(range(min(cfg.sensitivity_examples, len(calib))))
    enc = encode(tokenizer, sub, cfg.max_length)
    ref = torch.log_softmax(torch.from_numpy(predict_logits(fp32, tokenizer, enc)), -1)
    scores = {}
    for name in names:
        if name in forced:
            continue
        one = torch_int8.quantize(copy.deepcopy(fp32), {name: cfg.scheme})
        out = torch.log_softmax(torch.from_numpy(predict_logits(one, tokenizer, enc)), -1)
        scores[name] = float(torch.nn.functional.kl_div(out, ref, log_target=True, reduction="batchmean"))
        if on_layer is not None:
            on_layer(1)
    return sorted(scores, key=lambda n: -scores[n])


KIND = StageKind(
    name="quantize_dynamic",
    summary="torch dynamic INT8 of Linear layers, per-channel, with accuracy-aware fp32 fallback.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="torch_int8",
    budget_keys=("max_accuracy_drop",),
    check_model=_check_model,
    tasks=("sequence-classification", "causal-lm"),
)
