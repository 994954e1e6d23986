"""`export_genai`: a transformers causal LM to an onnxruntime-genai folder with its model
builder (onnxruntime_genai.models.builder): fused attention (GroupQueryAttention) and a
KV cache it manages itself, fp32 or INT4 (MatMulNBits; with `embeddings` the token table too).
INT4 `rtn` is the builder's own; INT4 `minmax` quantizes the builder's fp32 graph with
compress.tasks.causal_lm.export (float zero points folded out of the kernel, lm_head at `lm_head_bits`).

The builder's own tokenizer files are replaced by the model's Hugging Face tokenizer (see
compress.formats.genai for why), and the transformers config.json is copied beside it.

Parity: greedy tokens of the built model against torch on `parity_prompts` prompts. For
fp32 they must be identical (share `min_identical`); for INT4 the agreement is reported
only (quantization changes some tokens; the benchmark measures the quality).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from compress.core.registry import StageConfig, StageKind, StageResult


class Config(StageConfig):
    precision: Literal["fp32", "int8", "int4"] = Field(
        "int4", description="Weights of the built model. `int8`: 8-bit weight-only blocks (minmax) of the builder's "
        "fp32 graph, token table kept in fp32.")
    algorithm: Literal["rtn", "minmax"] = Field(
        "rtn", description="INT4 only: `rtn` the builder's own round-to-nearest; `minmax` the builder's fp32 model "
        "quantized by compress.tasks.causal_lm.export (each block's range, float zero point: exact on a GGUF Q4_1 grid).")
    lm_head_bits: Literal[4, 8] = Field(4, description="INT4 `minmax` only: width of the output projection.")
    block_size: Literal[16, 32, 64, 128, 256] = Field(32, description="INT4 only: weights per quantization block.")
    accuracy_level: Literal[1, 2, 3, 4] = Field(4, description="INT4 only: MatMulNBits compute type; 4 quantizes "
                                                "activations to INT8 per block (fastest on CPUs).")
    symmetric: bool = Field(True, description="INT4 only: symmetric blocks (no zero point).")
    embeddings: bool = Field(True, description="INT4 only: quantize the token table (Gather) too, shared with a tied lm_head.")
    parity_prompts: PositiveInt = Field(50, description="Prompts decoded greedily by torch and the built model.")
    parity_new_tokens: PositiveInt = Field(16, description="Tokens generated per parity prompt (eos ignored).")
    prompt_source: Literal["tokenizer", "data"] = Field(
        "tokenizer", description="`tokenizer`: built-in sentence starts encoded by the model's tokenizer; `data`: the "
        "recipe data's generation prompts.")
    min_identical: float = Field(100.0, ge=0, le=100, description="fp32 only: smallest accepted share (percent) of "
                                 "parity prompts decoded identically to torch.")

    def _changed(self) -> set[str]:
        """Settings given with a value other than their default: a default that does not apply
        is harmless (and a dumped config, which holds every key, must read back)."""
        return {k for k in self.model_fields_set if getattr(self, k) != type(self).model_fields[k].default}

    @model_validator(mode="after")
    def _applies(self):
        int4_only = [k for k in ("algorithm", "lm_head_bits", "block_size", "accuracy_level", "symmetric", "embeddings")
                     if k in self._changed()]
        if self.precision == "fp32" and int4_only:
            raise ValueError(f"{', '.join(int4_only)} apply to precision int4 only; remove them or set precision: int4")
        int8_refused = [k for k in ("algorithm", "lm_head_bits", "symmetric", "embeddings") if k in self._changed()]
        if self.precision == "int8" and int8_refused:
            raise ValueError(f"{', '.join(int8_refused)} apply to precision int4 only (int8 is minmax blocks, "
                             f"token table in fp32); remove them")
        if self.algorithm == "minmax" and "symmetric" in self._changed():
            raise ValueError("symmetric applies to algorithm rtn only (minmax has a zero point per block); remove it")
        if self.algorithm == "rtn" and "lm_head_bits" in self._changed():
            raise ValueError("lm_head_bits applies to algorithm minmax only; remove it or set algorithm: minmax")
        if self.precision != "fp32" and "min_identical" in self._changed():
            raise ValueError("min_identical applies to precision fp32 only (quantized parity is reported); remove it")
        return self


class Result(StageResult):
    precision: str
    builder_options: list[str]
    size_bytes: int
    parity: dict


def run(ctx) -> Result:
    import shutil
    import subprocess
    import sys

    from compress.tasks.causal_lm import export as lm_export
    from compress.core.errors import StageError
    from compress.formats import causal, genai
    from compress.stages.export_onnx_lm import prompts

    cfg: Config = ctx.config
    options = []
    minmax = cfg.precision == "int8" or (cfg.precision == "int4" and cfg.algorithm == "minmax")
    build = ctx.out.parent / (ctx.out.name + "-fp32") if minmax else ctx.out
    if cfg.precision == "int4" and not minmax:
        options = [f"int4_block_size={cfg.block_size}", f"int4_accuracy_level={cfg.accuracy_level}",
                   f"int4_is_symmetric={str(cfg.symmetric).lower()}"]
        if cfg.embeddings:
            options += ["int4_op_types_to_quantize=MatMul/Gather", "int4_tied_embeddings=true"]
    cache = ctx.out.parent / (ctx.out.name + "-builder-cache")
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ctx.input.path), "-o", str(build),
           "-p", "fp32" if minmax else cfg.precision, "-e", "cpu", "-c", str(cache)] + (["--extra_options", *options] if options else [])
    ctx.log(f"  onnxruntime-genai builder, {cfg.precision} {' '.join(options)}")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if done.returncode != 0:
        raise StageError(f"{ctx.stage_id}: the onnxruntime-genai builder failed ({builder_cause(done)}); check that "
                         "it supports this architecture")
    if minmax:
        try:
            if cfg.precision == "int8":  # the 8-bit grid holds every weight; ORT quantizes Gather at 4 bits only
                lm_export.quantize_int4(build, ctx.out, bits=8, algorithm="minmax", block_size=cfg.block_size,
                                        accuracy_level=cfg.accuracy_level, embeddings=False)
            else:
                lm_export.quantize_int4(build, ctx.out, algorithm="minmax", block_size=cfg.block_size,
                                        accuracy_level=cfg.accuracy_level, embeddings=cfg.embeddings,
                                        lm_head_bits=cfg.lm_head_bits)
        finally:
            shutil.rmtree(build, ignore_errors=True)
        head = 8 if cfg.precision == "int8" else cfg.lm_head_bits
        options = [f"minmax {cfg.precision} block {cfg.block_size}, lm_head {head}-bit, accuracy_level {cfg.accuracy_level}"]
    # The HF tokenizer and config replace the builder's copies (see compress.formats.genai).
    for f in ctx.input.path.iterdir():
        if f.is_file() and (f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges"))
                            or f.name in ("config.json", "generation_config.json")):
            shutil.copy2(f, ctx.out / f.name)
    reference = causal.load_hf(ctx.input.path, "cpu", ctx.threads, {})
    built = genai.load(ctx.out, "cpu", ctx.threads, {})
    ids = prompts(ctx, cfg.prompt_source, cfg.parity_prompts, reference.tokenizer)
    parity = lm_export.parity(reference, built, ids, cfg.parity_new_tokens, batch_size=1)
    ctx.log(f"  parity on {parity['prompts']} prompts: {parity['identical']} identical, max |logit diff| "
            f"{parity['max_abs_diff']:.2e}")
    if cfg.precision == "fp32" and 100.0 * parity["identical"] / max(parity["prompts"], 1) < cfg.min_identical:
        raise StageError(f"{ctx.stage_id}: the onnxruntime-genai model does not match its torch source: "
                         f"{parity['identical']}/{parity['prompts']} prompts decode identically (minimum "
                         f"{cfg.min_identical:g}%); lower with.min_identical or use export_onnx_lm")
    return Result(format="genai", precision=cfg.precision, builder_options=options, size_bytes=built.memory_bytes(),
                  parity=parity)


def builder_cause(done) -> str:
    """Why the builder's process failed, in a phrase: the exception line of its last
    traceback (`NotImplementedError: The Foo model is not currently supported`), which the
    builder's own prints, warnings and progress lines after it would otherwise hide; without
    a traceback its last line of output, or how it ended (a signal: killed, for want of
    memory say)."""
    text = "\n".join(t for t in (done.stderr, done.stdout) if t)
    lines = text.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if marks:
        # Frames are indented; the first line after them that is not is the exception.
        cause = next((ln for ln in lines[marks[-1] + 1:] if ln.strip() and not ln[:1].isspace()), "")
        if cause:
            return cause.strip()[:300]
    if done.returncode < 0:
        import signal

        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return f"killed by {name}"
    last = [ln.strip() for ln in lines if ln.strip()][-1:]
    return last[0][:300] if last else f"exit code {done.returncode}, no output"


KIND = StageKind(
    name="export_genai",
    summary="Build an onnxruntime-genai model (fp32 or INT4) from a causal LM and check greedy parity with torch.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="genai",
    tasks=("causal-lm",),
)
