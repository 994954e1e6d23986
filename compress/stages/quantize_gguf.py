"""`quantize_gguf`: GGUF variants of a model given as a GGUF file, run by llama.cpp.

- `type: source`: the file as shipped (what a user has before compressing anything).
- `type: Q4_K_M` (or any llama.cpp file type): llama.cpp's own quantizer from the source file,
  as `llama-quantize --allow-requantize` makes it; with `imatrix: true`, given an importance
  matrix measured on calibration text (compress.tasks.causal_lm.gguf_quant).
- `size_of: Q4_K_M`: a per-tensor type mix chosen by measured sensitivity, no larger than what
  llama.cpp's `size_of` type makes from the same file (or `max_mb`).

Calibration text: the recipe's perplexity text after the windows the benchmark scores, so
that no scored token is calibrated on. The variant folder holds `model.gguf` with the source
model's transformers tokenizer and config (every row of a report scores the same token ids).
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from compress.core.registry import StageConfig, StageKind, StageResult

FileType = Literal["Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0", "IQ4_NL",
                   "IQ4_XS"]
TensorType = Literal["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]


class Config(StageConfig):
    type: Literal["source"] | FileType = Field(
        "Q4_K_M", description="`source`: the GGUF file as shipped; otherwise the llama.cpp file type to quantize to "
        "(with size_of or max_mb: the type of tensors the mix leaves out).")
    imatrix: bool = Field(False, description="Give llama.cpp an importance matrix measured on calibration text "
                          "(always on for a mix).")
    size_of: Literal["source"] | FileType | None = Field(
        None, description="Mix per-tensor types to at most the size of the file llama.cpp makes at this type from "
        "the same source (`source`: of the source file itself).")
    max_mb: PositiveFloat | None = Field(None, description="Mix per-tensor types to at most this many MB (1e6 bytes) "
                                         "of tensors.")
    candidates: list[TensorType] = Field(["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q5_K", "Q6_K"],
                                         description="Tensor types the mix chooses among.")
    calibration_tokens: PositiveInt = Field(8192, description="Calibration tokens (in chunks of lm.perplexity.context).")
    kv_cache_type: Literal["f16", "q8_0"] = Field("f16", description="llama.cpp's KV cache type when the variant runs.")

    @model_validator(mode="after")
    def _applies(self):
        if importlib.util.find_spec("llama_cpp") is None:
            raise ValueError("llama-cpp-python is not installed; pip install -e '.[gguf]' (builds llama.cpp)")
        mix = self.size_of is not None or self.max_mb is not None
        if self.size_of is not None and self.max_mb is not None:
            raise ValueError("size_of and max_mb both set a budget; keep one")
        if self.type == "source" and (mix or self.imatrix):
            raise ValueError("type source is the file as shipped; remove imatrix, size_of and max_mb")
        # A dumped config holds every key: only a value other than the default is "given".
        if self.candidates != type(self).model_fields["candidates"].default and not mix:
            raise ValueError("candidates apply to a mix only; set size_of or max_mb, or remove candidates")
        if mix and len(set(self.candidates)) < 2:
            raise ValueError("candidates: a mix needs at least two types")
        return self


class Result(StageResult):
    type: str
    imatrix_tensors: int
    calibration_tokens: int
    tensor_types: dict[str, int]  # ggml type -> tensors in the written file
    size_bytes: int
    budget_bytes: int | None  # the mix's, in tensor bytes
    kv_cache_type: str


def source_file(ctx):
    """The GGUF file the recipe's model came from (validation made sure there is one)."""
    from compress.core.errors import StageError
    from compress.recipe.peek import gguf_file

    file = gguf_file(ctx.recipe.model, ctx.recipe.base_dir)
    if file is None:
        raise StageError(f"{ctx.stage_id}: quantize_gguf needs the recipe's model.source to be a GGUF file")
    return file


def calibration(ctx, cfg: Config, tokenizer) -> list[list[int]]:
    """Chunks of the perplexity text after the windows the benchmark scores."""
    from pathlib import Path

    from compress.core.errors import DataError
    from compress.tasks.causal_lm.data import wikitext_text
    from compress.tasks.causal_lm.task import bos_prefix, windows

    spec = ctx.recipe.lm.perplexity
    path = Path(spec.path) if Path(spec.path).is_absolute() else ctx.recipe.base_dir / spec.path
    ids = tokenizer(wikitext_text(path), add_special_tokens=False)["input_ids"]
    scored = windows(len(ids), spec.context, spec.stride, spec.max_windows)
    rest = ids[scored[-1][1]:] if scored else ids
    if len(rest) < min(cfg.calibration_tokens, spec.context):
        raise DataError(f"lm.perplexity.path: {path} has {len(rest)} tokens after the scored windows; calibration "
                        f"needs {min(cfg.calibration_tokens, spec.context)}: lower lm.perplexity.max_windows")
    rest = rest[: cfg.calibration_tokens]
    bos = bos_prefix(tokenizer)  # each chunk opened as llama-imatrix opens them: BOS where the model expects one
    return [bos + rest[i:i + spec.context] for i in range(0, len(rest), spec.context) if len(rest[i:i + spec.context]) > 1]


def run(ctx) -> Result:
    import json
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from transformers import AutoTokenizer

    from compress.core.errors import StageError
    from compress.formats.llamacpp import GGUF_FILE, SETTINGS_FILE
    from compress.tasks.causal_lm import gguf_quant as gq

    cfg: Config = ctx.config
    src = source_file(ctx)
    out = ctx.out / GGUF_FILE
    imatrix, n_calib, budget = None, 0, None
    mix = cfg.size_of is not None or cfg.max_mb is not None
    try:
        if cfg.type == "source":
            ctx.log(f"  {src.name} as shipped")
            try:
                os.link(src, out)  # no copy of a file that never changes; a copy across filesystems
            except OSError:
                shutil.copy2(src, out)
        else:
            if cfg.imatrix or mix:
                tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=False)
                chunks = calibration(ctx, cfg, tokenizer)
                n_calib = sum(len(c) for c in chunks)
                imatrix = gq.importance(ctx.input.path, chunks, ctx.threads, ctx.log)
            types = None
            if mix:
                if cfg.size_of == "source":
                    budget = sum(t.bytes for t in gq.tensors(src).values())
                    ctx.log(f"  budget: the source file's {budget / 1e6:.1f} MB of tensors")
                elif cfg.size_of is not None:
                    with tempfile.TemporaryDirectory(prefix="compress-gguf-") as tmp:
                        stock = gq.quantize(src, Path(tmp) / "stock.gguf", cfg.size_of, ctx.threads)
                        budget = sum(t.bytes for t in gq.tensors(stock).values())
                    ctx.log(f"  budget: llama.cpp's {cfg.size_of} from this file, {budget / 1e6:.1f} MB of tensors")
                else:
                    budget = int(cfg.max_mb * 1e6)
                chosen = gq.choose(src, list(dict.fromkeys(cfg.candidates)), budget, imatrix, ctx.threads, ctx.log)
                types = chosen.types
                ctx.log(f"  mix: {', '.join(f'{n} {t}' for t, n in sorted(chosen.counts.items()))}; "
                        f"{chosen.tensor_bytes / 1e6:.1f} MB of tensors")
            gq.quantize(src, out, cfg.type, ctx.threads, imatrix, types)
    except (ValueError, RuntimeError) as exc:
        raise StageError(f"{ctx.stage_id}: {exc}") from exc
    # The source model's transformers tokenizer and config: the ids every row is scored on.
    for f in ctx.input.path.iterdir():
        if f.is_file() and (f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges"))
                            or f.name in ("config.json", "generation_config.json")):
            shutil.copy2(f, ctx.out / f.name)
    (ctx.out / SETTINGS_FILE).write_text(json.dumps({"kv_cache_type": cfg.kv_cache_type}) + "\n")
    written = gq.tensors(out)
    counts: dict[str, int] = {}
    for t in written.values():
        counts[t.type] = counts.get(t.type, 0) + 1
    ctx.log(f"  {GGUF_FILE}: {out.stat().st_size / 1e6:.1f} MB, " + ", ".join(f"{n} {t}" for t, n in sorted(counts.items())))
    return Result(format="gguf", type=cfg.type, imatrix_tensors=len(imatrix or {}), calibration_tokens=n_calib,
                  tensor_types=counts, size_bytes=out.stat().st_size, budget_bytes=budget,
                  kv_cache_type=cfg.kv_cache_type)


KIND = StageKind(
    name="quantize_gguf",
    summary="GGUF variants run by llama.cpp: the source file, llama.cpp's types (importance matrix optional), "
            "or a per-tensor mix chosen by measured sensitivity to a size budget.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="gguf",
    tasks=("causal-lm",),
    reads_gguf_source=True,
)
