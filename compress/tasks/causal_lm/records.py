"""Causal LMs: the recipe's `lm` block (what every variant is scored and timed on) and the
typed records a causal-LM measurement carries (quality per eval, generation timings per
batch size, the memory plan). Pydantic only, so that the recipe, the benchmark job and the
reports can all read them without importing a framework.

Units: times in ms, rates in tokens per second, memory in bytes. A `tokens/s` figure counts
tokens of every row of a batch (batch 4 at 10 ms per step: 400 tokens/s).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Setting(_Strict):
    # The recipe's `lm` block: every float is finite (`gb: .inf` would plan against infinite
    # memory), as in the recipe's other blocks. Not the measurement records: a diverged
    # model's perplexity may be infinite, and is reported as such.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PerplexitySpec(_Setting):
    path: str = Field("../../shared/data/wikitext2/wiki.test.raw",
                      description="Raw text file (relative to the recipe); its lines are joined as the Hugging Face recipe does.")
    context: PositiveInt = Field(512, description="Tokens per scored window.")
    stride: PositiveInt = Field(512, description="Tokens between window starts; a stride below `context` scores each "
                                                 "window's last `stride` tokens with the rest as context.")
    max_windows: PositiveInt | None = Field(None, description="Score the first N windows only (None: the whole file).")


class ChoiceSpec(_Setting):
    name: Literal["arc_easy", "piqa"] = Field(description="Which zero-shot multiple-choice set.")
    path: str = Field(description="Folder of the set (relative to the recipe), as in ../shared/data.")
    max_items: PositiveInt | None = Field(None, description="Score the first N questions only.")


class SummarySpec(_Setting):
    path: str = Field("../../shared/data/samsum/validation.jsonl", description="SAMSum JSON Lines (relative to the recipe).")
    max_items: PositiveInt = Field(20, description="Dialogues summarised (greedy decoding is the slow part).")
    max_new_tokens: PositiveInt = Field(64, description="Longest summary generated.")


class TimingSpec(_Setting):
    prompts: PositiveInt = Field(8, description="Real prompts (chat-templated dialogues) timed at batch 1.")
    new_tokens: PositiveInt = Field(64, description="Tokens generated per prompt when timing (eos ignored).")
    batch_sizes: list[PositiveInt] = Field(default_factory=lambda: [1, 4, 16],
                                           description="Batch sizes whose prefill and decode rates are measured.")
    max_prompt_tokens: PositiveInt = Field(256, description="Prompts are cut to their last N tokens.")
    path: str | None = Field(None, description="JSON Lines of {id, dialogue} rows the prompts are made from (relative to "
                                               "the recipe; None: SAMSum's train.jsonl beside lm.summarization.path, or "
                                               "the default SAMSum folder).")


class MemoryTierSpec(_Setting):
    name: str = Field(description="Tier name in the report (e.g. `gpu-16GB`).")
    gb: float = Field(gt=0, description="Fast memory of the tier, in GB (1e9 bytes).")


class LMSpec(_Setting):
    """What every causal-LM variant is scored and timed on."""

    perplexity: PerplexitySpec = Field(default_factory=PerplexitySpec)
    multiple_choice: list[ChoiceSpec] = Field(default_factory=list, description="Zero-shot multiple-choice sets.")
    summarization: SummarySpec | None = Field(None, description="Dialogue summarisation with ROUGE (None: skipped).")
    timing: TimingSpec = Field(default_factory=TimingSpec)
    memory_tiers: list[MemoryTierSpec] = Field(
        default_factory=lambda: [MemoryTierSpec(name="gpu-16GB", gb=16), MemoryTierSpec(name="gpu-80GB", gb=80)],
        description="Devices the memory plan checks besides this machine's own memory.")


# --- what a causal-LM measurement carries

class EvalFigure(_Strict):
    """One quality eval of one variant. `scores` [N]: the per-item unit the paired bootstrap
    resamples (perplexity: each window's mean negative log-likelihood per token, in nats;
    multiple choice: 1/0 per question (acc); summarisation: ROUGE-L F1 per dialogue)."""

    name: str  # "perplexity", "arc_easy", "piqa", "samsum"
    metric: str  # the headline figure's name: "perplexity", "acc", "rougeL"
    value: float  # perplexity as is; acc and ROUGE in percent
    secondary: dict[str, float] = {}  # acc_norm, rouge1, rouge2 ... (percent)
    scores: list[float] = []
    secondary_scores: dict[str, list[float]] = {}  # per item, for intervals on secondary figures (acc_norm)
    protocol: str = ""  # how it was scored, in words (context, stride, template, generation settings)
    items: int = 0
    tokens: int | None = None  # tokens scored (perplexity)


class GenFigures(_Strict):
    """Generation at one batch size: the prefill (time to first token) and the decode steps."""

    batch_size: int
    prompt_tokens: float  # mean prompt length of the rows
    new_tokens: int  # tokens generated per row
    ttft_ms: float  # prefill of the batch, first token chosen
    tpot_ms: float  # mean time of one decode step (one token for every row)
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    runs: int = 1


class MemoryTier(_Strict):
    name: str
    bytes: int
    fits_weights: bool
    max_context_batch1: int  # tokens of KV cache that fit beside the weights at batch 1 (0: none)
    max_batch_at_context: int  # rows of `context` tokens that fit (0: none)
    spills: bool  # the weights plus one full-context row do not fit: it would offload


class MemoryPlan(_Strict):
    """From the model config and the weights on disk: what one sequence's KV cache costs per
    token, and what fits each device tier."""

    weights_bytes: int
    kv_bytes_per_token: int  # 2 (K and V) x layers x kv heads x head dim x bytes per element
    kv_dtype: str
    context: int  # the context the plan's batch column is computed for (the model's max positions)
    tiers: list[MemoryTier]


class Roofline(_Strict):
    """Batch-1 speed against this machine's measured limits (compress/tasks/causal_lm/roofline.py)."""

    read_gb_s: float  # memory read bandwidth, the benchmark's threads
    fp32_gflop_s: float  # fp32 matrix-multiply rate, the benchmark's threads
    bytes_per_token: int  # weights as stored + the KV cache of the mean decoded position
    decode_fraction: float  # bytes_per_token x decode tokens/s at batch 1, over read_gb_s
    decode_ceiling_tokens_per_s: float  # read_gb_s / bytes_per_token
    prefill_fraction: float  # 2 FLOPs per weight x prefill tokens/s at batch 1, over fp32_gflop_s


class LMFigures(_Strict):
    """Everything a causal-LM measurement adds to the generic figures (quality = perplexity,
    latency = time per output token at batch 1, throughput = decode tokens/s per batch)."""

    evals: list[EvalFigure]
    generation: list[GenFigures]
    ttft_ms: dict[str, float]  # batch-1 time to first token over the real prompts: p50, p95, p99, mean
    tpot_ms: dict[str, float]  # batch-1 time per output token over the prompts: p50, p95, p99, mean
    greedy_tokens: list[list[int]] = []  # batch-1 greedy continuations of the timing prompts (agreement with the baseline)
    memory_plan: MemoryPlan | None = None
    peak_rss_bytes: int | None = None
    roofline: Roofline | None = None
