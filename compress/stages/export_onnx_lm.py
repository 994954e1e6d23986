"""`export_onnx_lm`: a transformers causal LM to ONNX with a KV cache (Optimum's exporter,
task text-generation-with-past), checked by greedy decoding against its torch source.

A kind of its own rather than a branch of export_onnx: the classifier's settings (label
agreement, sentence length) mean nothing for a language model and these (prompts, new
tokens) nothing for a classifier; with one kind per task each config holds only what
applies, and recipe validation already refuses a kind whose task is not the recipe's.

The parity check fails the stage: on `parity_prompts` prompts both runtimes decode
`parity_new_tokens` tokens greedily, and every prompt's tokens must be identical (or the
share set in `min_identical`); the largest logit difference along the way is reported and,
with `tolerance` set, limited too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt

from compress.core.registry import StageConfig, StageKind, StageResult


class Config(StageConfig):
    opset: PositiveInt | None = Field(None, description="ONNX opset; unset uses Optimum's recommended opset for the architecture.")
    parity_prompts: PositiveInt = Field(50, description="Prompts decoded greedily by both torch and onnxruntime.")
    parity_new_tokens: PositiveInt = Field(16, description="Tokens generated per parity prompt (eos ignored).")
    prompt_source: Literal["tokenizer", "data"] = Field(
        "tokenizer", description="`tokenizer`: built-in English sentence starts encoded by the model's tokenizer (its "
        "chat template when it has one); `data`: the recipe data's generation prompts.")
    parity_batch_size: PositiveInt = Field(8, description="Prompts per parity batch (left-padded).")
    min_identical: float = Field(100.0, ge=0, le=100, description="Smallest accepted share (percent) of parity prompts "
                                 "whose greedy tokens are identical to torch's.")
    tolerance: NonNegativeFloat | None = Field(
        None, description="Largest accepted absolute logit difference on the parity steps; unset: reported only "
        "(a near-tie between two tokens may differ by float rounding without changing any token).")


class Result(StageResult):
    opset: int
    inputs: list[str]
    parity: dict  # prompts, new_tokens, identical, token_agreement, max_abs_diff, first_mismatch


def prompts(ctx, source: str, n: int, tokenizer) -> list[list[int]]:
    """Token ids of `n` parity prompts from `source` (see Config.prompt_source)."""
    from compress.tasks.causal_lm import export as lm_export
    from compress.core.errors import StageError

    if source == "tokenizer":
        return lm_export.tokenizer_prompts(tokenizer, n)
    data = ctx.data
    if not hasattr(data, "prompts"):
        raise StageError(f"{ctx.stage_id}: the recipe's data gives no generation prompts; set "
                         "with.prompt_source: tokenizer")
    texts = list(data.prompts(n))
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
            if getattr(tokenizer, "chat_template", None) else tokenizer(t)["input_ids"] for t in texts]


def run(ctx) -> Result:
    import warnings

    import torch

    from compress.tasks.causal_lm import export as lm_export
    from compress.core.errors import StageError
    from compress.formats import causal, causal_onnx

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    with warnings.catch_warnings():
        # Tracing warns about the Python branches it records (cache length checks): harmless
        # for a graph whose axes the exporter declares dynamic; parity below is the check.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        graph = lm_export.export(ctx.input.path, ctx.out, opset=cfg.opset)
    reference = causal.load_hf(ctx.input.path, "cpu", ctx.threads, {})
    exported = causal_onnx.load(ctx.out, "cpu", ctx.threads, {})
    ids = prompts(ctx, cfg.prompt_source, cfg.parity_prompts, reference.tokenizer)
    parity = lm_export.parity(reference, exported, ids, cfg.parity_new_tokens, cfg.parity_batch_size)
    share = 100.0 * parity["identical"] / max(parity["prompts"], 1)
    ctx.log(f"  parity on {parity['prompts']} prompts x {parity['new_tokens']} greedy tokens: {parity['identical']} "
            f"identical, max |logit diff| {parity['max_abs_diff']:.2e}")
    if share < cfg.min_identical or (cfg.tolerance is not None and parity["max_abs_diff"] > cfg.tolerance):
        raise StageError(
            f"{ctx.stage_id}: ONNX export does not match its torch source: {parity['identical']}/{parity['prompts']} "
            f"prompts decode identically (minimum {cfg.min_identical:g}%), max |logit diff| "
            f"{parity['max_abs_diff']:.3g}" + (f" (tolerance {cfg.tolerance:g})" if cfg.tolerance is not None else "")
            + f", first differing prompt #{parity['first_mismatch']}; try another opset or lower with.min_identical")
    return Result(format="onnx", opset=graph["opset"], inputs=graph["inputs"], parity=parity)


KIND = StageKind(
    name="export_onnx_lm",
    summary="Export a causal LM to ONNX with a KV cache (Optimum) and check greedy parity with torch.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="onnx",
    tasks=("causal-lm",),
)
