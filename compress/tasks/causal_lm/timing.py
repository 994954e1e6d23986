"""Generation timings of a causal LM: time to first token (the prefill, then the first token
chosen) and time per output token (one decode step) at batch 1 over real prompts, then the
prefill and decode rates at larger batches with the KV cache.

The clock is compress.formats.causal.greedy's `on_token` callback, called after each token
is chosen, with the predictor synchronised first: every runtime is timed by the same loop,
the same way. Tokens/s count the tokens of every row (batch 4 at 10 ms a step: 400/s).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from compress.formats.causal import CausalLM, greedy, left_pad, pad_id
from compress.tasks.causal_lm.records import GenFigures, TimingSpec

WARMUP_TOKENS = 4  # decode steps of each untimed warm-up run: enough to build every kernel and cache buffer


def percentiles(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {}
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


def peak_rss_bytes() -> int | None:
    """The process's peak resident memory so far (Linux: ru_maxrss in KiB; macOS: bytes)."""
    try:
        import resource
        import sys
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def timed_greedy(pred: CausalLM, prompts: list[list[int]], max_new_tokens: int, eos: tuple[int, ...],
                 stop_at_eos: bool) -> tuple[np.ndarray, float, list[float], int]:
    """One greedy run of a left-padded batch: (new tokens [B, n], prefill ms (first token chosen),
    decode step ms [n-1], real prompt tokens)."""
    ids, mask = left_pad(prompts, pad_id(pred.tokenizer))
    marks: list[float] = []

    def on_token(i: int) -> None:
        pred.sync()
        marks.append(time.perf_counter())

    start = time.perf_counter()
    out = greedy(pred, ids, mask, max_new_tokens, eos, on_token=on_token, stop_at_eos=stop_at_eos)
    ttft = (marks[0] - start) * 1000.0
    steps = (np.diff(marks) * 1000.0).tolist()
    return out, ttft, steps, int(mask.sum())


def _trim(row: np.ndarray, eos: tuple[int, ...]) -> list[int]:
    """A batch-1 continuation up to and including its first eos."""
    toks = row.tolist()
    for i, t in enumerate(toks):
        if t in eos:
            return toks[: i + 1]
    return toks


def time_generation(pred: CausalLM, prompts: list[list[int]], spec: TimingSpec, eos: tuple[int, ...],
                    phases: Any) -> tuple[list[GenFigures], dict[str, float], dict[str, float], list[list[int]]]:
    """(figures per batch size, batch-1 TTFT percentiles, batch-1 TPOT percentiles (ms), the
    batch-1 greedy continuations). Prompts are cut to their last `max_prompt_tokens` tokens.
    Batch 1 runs every prompt to its eos (at most `new_tokens`); larger batches take the
    prompts in turn (repeating them when there are fewer) and generate `new_tokens` for every
    row, eos ignored, so that every step times the full batch."""
    if not prompts:
        raise ValueError("no timing prompts; lm.timing.prompts must be at least 1")
    prompts = [p[-spec.max_prompt_tokens:] for p in prompts]
    n = spec.new_tokens

    phases.begin("generation warm-up", 1 + len(spec.batch_sizes))
    timed_greedy(pred, prompts[:1], WARMUP_TOKENS, eos, stop_at_eos=False)
    phases.step()

    phases.begin("generation (batch 1)", len(prompts))
    ttfts, tpots, greedy_tokens, rows1 = [], [], [], []
    for p in prompts:
        out, ttft, steps, real = timed_greedy(pred, [p], n, eos, stop_at_eos=True)
        ttfts.append(ttft)
        if steps:  # a prompt answered with eos at once has no decode step
            tpots.append(float(np.mean(steps)))
        greedy_tokens.append(_trim(out[0], eos))
        rows1.append((real, ttft, steps))
        phases.step()

    figures: list[GenFigures] = []
    for bs in sorted(set(spec.batch_sizes) | {1}):
        if bs == 1:  # every prompt once, as timed above
            prompt_tok = sum(r for r, _, _ in rows1)
            prefill_ms = sum(t for _, t, _ in rows1)
            steps = [s for _, _, ss in rows1 for s in ss]
            figures.append(GenFigures(
                batch_size=1, prompt_tokens=prompt_tok / len(rows1), new_tokens=n,
                ttft_ms=float(np.mean(ttfts)), tpot_ms=float(np.mean(steps)) if steps else 0.0,
                prefill_tokens_per_s=prompt_tok / (prefill_ms / 1000.0),
                decode_tokens_per_s=len(steps) / (sum(steps) / 1000.0) if steps else 0.0,
                runs=len(rows1)))
            continue
        batch = [prompts[i % len(prompts)] for i in range(bs)]
        phases.begin(f"generation (batch {bs})", 2)
        timed_greedy(pred, batch, WARMUP_TOKENS, eos, stop_at_eos=False)  # this batch shape, untimed
        phases.step()
        _, ttft, steps, real = timed_greedy(pred, batch, n, eos, stop_at_eos=False)
        phases.step()
        figures.append(GenFigures(
            batch_size=bs, prompt_tokens=real / bs, new_tokens=n, ttft_ms=ttft,
            tpot_ms=float(np.mean(steps)) if steps else 0.0,
            prefill_tokens_per_s=real / (ttft / 1000.0),
            decode_tokens_per_s=bs * len(steps) / (sum(steps) / 1000.0) if steps else 0.0, runs=1))
    phases.end()
    return figures, percentiles(ttfts), percentiles(tpots), greedy_tokens
