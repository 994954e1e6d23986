"""`quantize_onnx_lm`: onnxruntime weight quantization of a causal LM exported by
export_onnx_lm (compress.tasks.causal_lm.export does the work).

- scheme weight_only (bits 4 or 8): MatMulNBits (blocks of `block_size` weights share a
  scale; `rtn` rounds to nearest, `hqq` fits scales and zero points by half-quadratic
  optimisation, `minmax` takes each block's range with a float zero point). `accuracy_level` 4 runs the products in INT8 on the CPU (the fast path).
  `embeddings` quantizes the token table's Gather (GatherBlockQuantized, 4-bit); `lm_head`
  unties a tied output projection and quantizes it (`lm_head_bits`): together they are a
  fifth of a 135M model.
- scheme dynamic (bits 8): weights INT8 ahead of time, activations per call (per-tensor
  scales: on SmolLM2 this costs far more perplexity than weight-only INT8).

A kind of its own rather than a branch of quantize_onnx (the classifier's static
calibration, presets and label parity do not apply to a generator; see export_onnx_lm).
Settings that do not apply to the chosen `bits` or `algorithm` are refused at validation.
The result reports greedy agreement with the input graph on a few prompts (reported only:
quantization is expected to change some tokens; the benchmark measures the quality).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from compress.core.registry import StageConfig, StageKind, StageResult, refuse_after

WEIGHT_ONLY = ("algorithm", "block_size", "symmetric", "accuracy_level", "lm_head_bits")
DYNAMIC_ONLY = ("per_channel",)


class Config(StageConfig):
    bits: Literal[4, 8] = Field(4, description="Weight width: 4 or 8.")
    scheme: Literal["weight_only", "dynamic"] = Field(
        "weight_only", description="`weight_only`: MatMulNBits (weights in blocks, activations INT8 per block with "
        "accuracy_level 4); `dynamic`: INT8 weights with activations quantized per call (MatMulInteger; bits 8 only).")
    algorithm: Literal["rtn", "hqq", "minmax"] = Field(
        "rtn", description="weight_only: `rtn` round-to-nearest per block (integer zero point); `hqq` half-quadratic "
        "fit; `minmax` each block's own range with a float zero point (exact for weights from a GGUF Q4_1 file).")
    block_size: Literal[16, 32, 64, 128, 256] = Field(32, description="weight_only: weights per quantization block "
                                                      "(smaller: more accurate, larger file).")
    symmetric: bool = Field(True, description="weight_only `rtn`: symmetric blocks (no zero point).")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        4, description="weight_only: the MatMulNBits compute type; 4 quantizes activations to INT8 per block (fastest "
        "on CPUs), 0 keeps fp32 activations.")
    lm_head_bits: Literal[4, 8] | None = Field(None, description="weight_only: width of the output projection (unset: "
                                               "`bits`); 8 keeps the logits close at a few MB.")
    per_channel: bool = Field(True, description="dynamic: one weight scale per output channel rather than per matrix.")
    embeddings: bool = Field(True, description="Quantize the token-embedding table (Gather) too (4-bit blocks for "
                             "weight_only, INT8 for dynamic).")
    lm_head: bool = Field(True, description="Quantize the output projection too (untied first when it shares the "
                          "embedding table).")
    keep_fp32: list[str] = Field(default_factory=list, description="ONNX node names (glob patterns) left in fp32.")
    parity_prompts: PositiveInt = Field(8, description="Prompts on which greedy tokens are compared with the input graph "
                                        "(reported only).")
    parity_new_tokens: PositiveInt = Field(16, description="Tokens generated per parity prompt.")

    def _changed(self) -> set[str]:
        """Settings given with a value other than their default: a default that does not apply
        is harmless (and a dumped config, which holds every key, must read back)."""
        return {k for k in self.model_fields_set if getattr(self, k) != type(self).model_fields[k].default}

    @model_validator(mode="after")
    def _applies(self):
        given = self._changed()
        if self.scheme == "dynamic":
            if self.bits != 8:
                raise ValueError("scheme dynamic is INT8: set bits: 8 or scheme: weight_only")
            wrong = [k for k in WEIGHT_ONLY if k in given]
            if wrong:
                raise ValueError(f"{', '.join(wrong)} apply to scheme weight_only only; remove them or set "
                                 "scheme: weight_only")
        else:
            wrong = [k for k in DYNAMIC_ONLY if k in given]
            if wrong:
                raise ValueError(f"{', '.join(wrong)} applies to scheme dynamic only; remove it or set scheme: dynamic")
            if self.algorithm != "rtn" and "symmetric" in given:
                raise ValueError(f"symmetric applies to algorithm rtn only ({self.algorithm} has a zero point per "
                                 "block); remove it")
            if not self.lm_head and "lm_head_bits" in given:
                raise ValueError("lm_head_bits applies when lm_head is quantized; remove it or set lm_head: true")
        return self


class Result(StageResult):
    bits: int
    scheme: str  # weight_only, dynamic
    algorithm: str  # rtn, hqq, dynamic
    settings: dict  # what the quantizer was given
    operators: dict  # op type -> count in the output graph
    untied: list[str]  # MatMuls given a constant weight of their own (a tied lm_head)
    size_bytes: dict  # {"input": ..., "output": ...} graph bytes
    parity: dict  # greedy agreement with the input graph (see compress.tasks.causal_lm.export.parity)


def run(ctx) -> Result:
    from fnmatch import fnmatch

    import onnx

    from compress.tasks.causal_lm import export as lm_export
    from compress.formats import causal_onnx
    from compress.formats import onnx as onnx_fmt

    cfg: Config = ctx.config
    src = onnx_fmt.model_file(ctx.input.path)
    names = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node]
    exclude = [n for n in names if any(fnmatch(n, p) for p in cfg.keep_fp32)]
    if cfg.scheme == "weight_only":
        settings = dict(bits=cfg.bits, algorithm=cfg.algorithm, block_size=cfg.block_size, symmetric=cfg.symmetric,
                        accuracy_level=cfg.accuracy_level, embeddings=cfg.embeddings, lm_head=cfg.lm_head,
                        lm_head_bits=cfg.lm_head_bits or cfg.bits)
        rec = lm_export.quantize_int4(ctx.input.path, ctx.out, exclude=exclude, **settings)
        algorithm = cfg.algorithm
    else:
        settings = dict(per_channel=cfg.per_channel, embeddings=cfg.embeddings, lm_head=cfg.lm_head)
        rec = lm_export.quantize_int8(ctx.input.path, ctx.out, exclude=exclude, **settings)
        algorithm = "dynamic"
    before = causal_onnx.load(ctx.input.path, "cpu", ctx.threads, {})
    after = causal_onnx.load(ctx.out, "cpu", ctx.threads, {})
    parity = lm_export.parity(before, after, lm_export.tokenizer_prompts(before.tokenizer, cfg.parity_prompts),
                              cfg.parity_new_tokens, batch_size=8)
    sizes = rec["size_bytes"]
    ctx.log(f"  INT{cfg.bits} ({algorithm}): {sizes['input'] / 1e6:.1f} -> {sizes['output'] / 1e6:.1f} MB, greedy "
            f"tokens agree with the input on {parity['token_agreement']:.1f}% of {parity['prompts']} x "
            f"{parity['new_tokens']}")
    return Result(format="onnx", bits=cfg.bits, scheme=cfg.scheme, algorithm=algorithm, settings=settings, operators=rec["operators"],
                  untied=rec["untied"], size_bytes=sizes, parity=parity)


KIND = StageKind(
    name="quantize_onnx_lm",
    summary="onnxruntime weight-only INT4/INT8 (MatMulNBits, embeddings and lm_head included) or dynamic INT8 of a causal LM.",
    config=Config,
    result=Result,
    run=run,
    accepts=("onnx",),
    produces="onnx",
    tasks=("causal-lm",),
    check_input=refuse_after(
        "quantize_onnx_lm",
        "its input is already quantized (a quantize_onnx_lm stage is upstream); quantizing twice only adds rounding "
        "error: take the export_onnx_lm output instead",
    ),
)
