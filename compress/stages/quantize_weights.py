"""`quantize_weights`: weight-only INT8 or INT4 of a causal LM's Linear layers with torchao
(activations stay fp32; each matmul reads the packed integer weights and their scales).
The token embedding table is stored INT8 per row unless `embedding: false`. Written in the
`torchao` format (compress/formats/torchao.py, which says which torchao configs and why).

Linear layers whose input width is not a multiple of `group_size` (INT4) cannot be grouped
(nor packed when their output width is not a multiple of 16) and stay fp32; they are named in the result, so that group_size 128 on a model 576 wide
(SmolLM2-135M) is not mistaken for an INT4 model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from compress.core.registry import StageConfig, StageKind, StageResult


class Config(StageConfig):
    scheme: Literal["int8", "int4"] = Field(
        "int8", description="`int8`: one scale per output channel; `int4`: asymmetric groups of `group_size` "
        "weights, packed two per byte for torch's CPU int4 kernel.")
    group_size: Literal[32, 64, 128] | None = Field(
        None, description="INT4 only: weights sharing one scale and zero point along each row (32, 64 or 128; "
        "default 32). Smaller groups are more accurate and slightly larger.")
    embedding: bool = Field(
        True, description="Also store the token embedding table INT8 (one scale per row); false keeps it fp32.")
    keep_fp32: list[str] = Field(
        default_factory=list, description="Linear layer names (glob patterns, e.g. `lm_head`) left in fp32.")

    @field_validator("group_size")
    @classmethod
    def _int4_only(cls, v, info: ValidationInfo):
        if v is not None and info.data.get("scheme") == "int8":
            raise ValueError("group_size applies to scheme int4 only (INT8 has one scale per output channel)")
        return v


class Result(StageResult):
    scheme: str
    group_size: int | None
    embedding: bool
    quantized_layers: int
    fp32_layers: list[str]
    torchao: str  # the torchao config class used for the Linear layers
    size_bytes: int  # of the weights file


def run(ctx) -> Result:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from compress.formats import torchao

    cfg: Config = ctx.config
    group = (cfg.group_size or 32) if cfg.scheme == "int4" else None
    linear_cfg, _ = torchao.ao_configs(cfg.scheme, group)  # torchao missing: fail before loading anything
    torch.set_num_threads(ctx.threads)
    trust = ctx.recipe.model.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=trust)
    model = AutoModelForCausalLM.from_pretrained(ctx.input.path, dtype=torch.float32, use_safetensors=True,
                                                 trust_remote_code=trust).eval()
    spec = torchao.quantize(model, cfg.scheme, group, cfg.embedding, cfg.keep_fp32)
    model.config.save_pretrained(ctx.out)
    try:
        GenerationConfig.from_pretrained(ctx.input.path, trust_remote_code=False).save_pretrained(ctx.out)
    except OSError:  # no generation_config.json: transformers derives one from config.json
        pass
    tokenizer.save_pretrained(ctx.out)
    torchao.save(model, spec, ctx.out)
    size = (ctx.out / torchao.WEIGHTS_FILE).stat().st_size
    notes = []
    skipped = [n for n in spec["fp32_layers"] if n not in cfg.keep_fp32]
    if skipped and cfg.scheme == "int4":
        notes.append(f"{len(skipped)} Linear layers stay fp32: their input width is not a multiple of "
                     f"group_size {group} or their output width not a multiple of 16 (first: {skipped[0]})")
    ctx.log(f"  torchao {cfg.scheme.upper()}: {len(spec['layers'])} Linear layers, "
            f"{len(spec['fp32_layers'])} fp32, weights {size / 1e6:.1f} MB")
    return Result(format="torchao", scheme=cfg.scheme, group_size=group, embedding=cfg.embedding,
                  quantized_layers=len(spec["layers"]), fp32_layers=spec["fp32_layers"],
                  torchao=type(linear_cfg).__name__, size_bytes=size, notes=notes)


def _check_model(cfg: Config, config: dict) -> str | None:
    """Refuses, before any model loads, a group size that divides none of the model's widths."""
    if cfg.scheme != "int4":
        return None
    group = cfg.group_size or 32
    widths = [config.get(k) for k in ("hidden_size", "n_embd", "intermediate_size") if isinstance(config.get(k), int)]
    if widths and all(w % group for w in widths):
        return f"group_size: {group} divides none of the model's widths ({', '.join(map(str, widths))}); use 32 or 64"
    return None


KIND = StageKind(
    name="quantize_weights",
    summary="torchao weight-only INT8 / INT4 (groups) of a causal LM's Linear layers, INT8 embedding.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="torchao",
    check_model=_check_model,
    tasks=("causal-lm",),
)
