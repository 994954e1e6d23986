"""Causal language modelling: a variant is scored on perplexity (its headline quality),
zero-shot multiple choice (ARC-Easy, PIQA) and dialogue summarisation, and timed on greedy
generation (time to first token, time per output token, tokens/s per batch size).

Unlike classification, one measurement runs several evals of different shapes, so the
benchmark worker hands this task the eval file's rows and a loaded predictor at once
(`measure_lm`), and gets back typed figures (compress.tasks.causal_lm.records.LMFigures).

Every figure is computed with the variant's own tokenizer, from the predictor contract in
compress.formats.causal (`logprobs` for scoring, `start`/`step` through `greedy` for
generation), so every runtime is scored the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compress.formats.causal import CausalLM, greedy, left_pad, pad_id, right_pad
from compress.tasks.causal_lm.timing import peak_rss_bytes, time_generation
from compress.tasks.causal_lm.records import ChoiceSpec, EvalFigure, LMFigures, LMSpec, PerplexitySpec, SummarySpec
from compress.tasks.causal_lm.memory_plan import memory_plan
from compress.tasks.causal_lm.roofline import roofline
from compress.core.task import Metric, Task

# Logits of one scoring batch are [B, T, V] float32 and log_softmax makes a second copy:
# the batch is sized so that both stay under this many bytes (SmolLM2's V = 49152 at
# T = 512: 201 MB a row, so 2 rows).
SCORING_BYTES = 512 * 2**20
# The multiple-choice continuations follow the context after this delimiter
# (lm-evaluation-harness's target_delimiter); acc_norm divides by the choice's length
# without it, as lm-evaluation-harness does (len of the choice string, in characters).
MC_DELIMITER = " "
SUMMARY_FALLBACK = "{prompt}\nSummary:"  # a tokenizer without a chat template


def rows_per_batch(tokens: int, vocab: int, budget: int = SCORING_BYTES) -> int:
    """Rows of `tokens` tokens whose logits and log-probabilities fit `budget` bytes (at least 1)."""
    return max(1, budget // max(1, tokens * vocab * 4 * 2))


def _vocab(pred: CausalLM) -> int:
    return int(getattr(pred.config, "vocab_size", None) or len(pred.tokenizer))


def _check(lp: np.ndarray, what: str) -> None:
    if not np.isfinite(lp).all():
        raise ValueError(f"the model gave NaN or infinite log-probabilities on {what}; its weights are broken")


def eos_ids(pred: CausalLM) -> tuple[int, ...]:
    """The ids generation stops at: the config's (the end of an assistant turn for a chat model),
    then the tokenizer's, in that order (greedy fills an ended row with the first)."""
    ids: list[int] = []
    for src in (getattr(pred.config, "eos_token_id", None), pred.tokenizer.eos_token_id):
        for tid in (src if isinstance(src, (list, tuple)) else [src]):
            if tid is not None and int(tid) not in ids:
                ids.append(int(tid))
    return tuple(ids)


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    """A user message as the model's chat template puts it, the assistant turn opened. The
    template writes its own special tokens, so the text is encoded without adding more."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    else:  # no template: a plain prompt, opened by BOS where the tokenizer adds one
        return bos_prefix(tokenizer) + tokenizer(SUMMARY_FALLBACK.format(prompt=prompt), add_special_tokens=False)["input_ids"]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_prompt_lengths(evals: Any, spec: LMSpec, folder: Path, trust_remote_code: bool = False) -> None:
    """Before any stage: every summarised dialogue, as the model's chat template puts it, with
    `max_new_tokens` after it, fits the model's positions (config.json's position table);
    past it, generation crashes mid-benchmark or runs on positions the model never learned.
    DataError naming the file and the line of the first dialogue too long. Nothing is checked
    when the model's config or tokenizer cannot be read (the model checks name that)."""
    import json

    from compress.core.errors import DataError
    from compress.recipe.peek import position_limit

    summ, rows = spec.summarization, evals.of("samsum")
    if summ is None or not rows:
        return
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
        limit = position_limit(config) if isinstance(config, dict) else None
    except (OSError, ValueError):
        return
    if limit is None:
        return
    most, why = limit
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except Exception:  # a broken tokenizer is check_model_folder's to name
        return
    lines = evals.lines.get("samsum", [])
    path = evals.sources.get("samsum", {}).get("path", summ.path)
    for i, row in enumerate(rows):
        n = len(chat_ids(tokenizer, row["prompt"]))
        if n + summ.max_new_tokens > most:
            line = lines[i] if i < len(lines) else i + 1
            raise DataError(
                f"lm.summarization.path: {path} line {line}: dialogue {str(row['id'])[:40]} is {n} tokens as the "
                f"model's chat prompt, {n + summ.max_new_tokens} with lm.summarization.max_new_tokens "
                f"{summ.max_new_tokens}: more than the model takes ({most}: {why}); lower max_new_tokens or "
                f"lm.summarization.max_items, or drop the dialogue")


# --- perplexity

def windows(n_tokens: int, context: int, stride: int, max_windows: int | None = None,
            prefixed: bool = False) -> list[tuple[int, int, int]]:
    """Sliding windows over a token stream, as the Hugging Face perplexity recipe takes them:
    (begin, end, scored) with `scored` the window's last tokens not scored by an earlier
    window (all but a window's first token, which has no context, unless `prefixed`: each
    window is opened by a BOS token that gives its first token one)."""
    out: list[tuple[int, int, int]] = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        scored = min(end - prev_end, end - begin - (0 if prefixed else 1))
        if scored > 0:
            out.append((begin, end, scored))
        prev_end = end
        if end == n_tokens or (max_windows is not None and len(out) >= max_windows):
            break
    return out


def bos_prefix(tokenizer: Any) -> list[int]:
    """[bos id] when the tokenizer opens every text with its BOS token (Gemma: without it the
    model's perplexity on WikiText-2 more than doubles), else [] (SmolLM2's file adds none)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return [int(bos)] if getattr(tokenizer, "add_bos_token", False) and bos is not None else []


def perplexity(pred: CausalLM, text: str, spec: PerplexitySpec, phases: Any) -> EvalFigure:
    """Perplexity of the text: tokenized once (the windows are cut from one stream), each
    window opened by BOS where the tokenizer adds one, each window's scored tokens' negative
    log-likelihood. `scores`: per window, the mean NLL per scored token (nats); the figure is
    exp of the mean over all scored tokens."""
    ids = pred.tokenizer(text, add_special_tokens=False)["input_ids"]
    prefix = bos_prefix(pred.tokenizer)
    k = len(prefix)
    wins = windows(len(ids), spec.context, spec.stride, spec.max_windows, prefixed=bool(prefix))
    if not wins:
        raise ValueError(f"the perplexity text is {len(ids)} tokens long; it needs at least 2")
    bs = rows_per_batch(spec.context + k, _vocab(pred))
    pid = pad_id(pred.tokenizer)
    nll = np.zeros(len(wins))  # [W] summed NLL of each window's scored tokens
    phases.begin("perplexity", len(wins))
    for start in range(0, len(wins), bs):
        chunk = wins[start:start + bs]
        tid, mask = right_pad([prefix + ids[b:e] for b, e, _ in chunk], pid)
        lp = pred.logprobs(tid, mask)  # [B, T-1]; row j's scored tokens end at its last real position
        for j, (b, e, scored) in enumerate(chunk):
            row = lp[j, k + e - b - 1 - scored: k + e - b - 1]
            _check(row, "the perplexity text")
            nll[start + j] = -float(row.sum())
        phases.step(len(chunk))
    counts = np.array([s for _, _, s in wins])
    total = int(counts.sum())
    opened = "with each window opened by the tokenizer's BOS" if prefix else "without BOS"
    protocol = (f"WikiText-2 test, lines joined with a blank line, tokenized once {opened}; windows of "
                f"{spec.context} tokens every {spec.stride} tokens ({len(wins)} windows"
                f"{'' if spec.max_windows is None else f', the first {len(wins)} only'}), each scoring its tokens "
                f"not scored before; {total} tokens scored; ppl = exp(mean NLL per token)")
    return EvalFigure(name="perplexity", metric="perplexity", value=float(np.exp(nll.sum() / total)),
                      scores=(nll / counts).tolist(), protocol=protocol, items=len(wins), tokens=total)


# --- multiple choice

def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-evaluation-harness's split (api/model.py `_encode_pair`, causal case): spaces ending
    the context move to the continuation, the two are encoded together with the tokenizer's
    own special tokens, and the continuation is what follows the context's own tokens."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer(context + continuation)["input_ids"]
    ctx = tokenizer(context)["input_ids"]
    return ctx, whole[len(ctx):]


def loglikelihoods(pred: CausalLM, requests: list[tuple[list[int], list[int]]], phases: Any) -> list[float]:
    """Summed log p(continuation | context) per (context ids, continuation ids) request, in
    right-padded batches of similar lengths (longest first), left-truncated to the model's
    context as lm-evaluation-harness does."""
    max_len = int(getattr(pred.config, "max_position_embeddings", 0) or getattr(pred.config, "n_positions", 0) or 2048)
    seqs = [(c + x)[-(max_len + 1):] for c, x in requests]
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    pid, vocab = pad_id(pred.tokenizer), _vocab(pred)
    out = [0.0] * len(seqs)
    i = 0
    while i < len(order):
        bs = rows_per_batch(len(seqs[order[i]]), vocab)
        chunk = order[i:i + bs]
        ids, mask = right_pad([seqs[k] for k in chunk], pid)
        want = np.zeros((len(chunk), ids.shape[1] - 1), dtype=bool)  # [B, T-1]: each row's continuation
        for j, k in enumerate(chunk):
            n, c = len(seqs[k]), len(requests[k][1])
            want[j, n - 1 - c: n - 1] = True
        lp = pred.logprobs(ids, mask, want=want)  # [B, T-1]
        for j, k in enumerate(chunk):
            n, c = len(seqs[k]), len(requests[k][1])
            row = lp[j, n - 1 - c: n - 1]  # the continuation's tokens are the row's last c
            _check(row, "a multiple-choice question")
            out[k] = float(row.sum())
        phases.step(len(chunk))
        i += len(chunk)
    return out


def multiple_choice(pred: CausalLM, rows: list[dict], spec: ChoiceSpec, phases: Any) -> EvalFigure:
    """Zero-shot multiple choice as lm-evaluation-harness scores it: acc (the choice of highest
    log-likelihood) and acc_norm (log-likelihood divided by the choice's length in characters)."""
    requests, owner = [], []
    for q, row in enumerate(rows):
        for choice in row["choices"]:
            requests.append(encode_pair(pred.tokenizer, row["context"], MC_DELIMITER + choice))
            owner.append(q)
    phases.begin(spec.name, len(requests))
    lls = np.array(loglikelihoods(pred, requests, phases))
    acc, acc_norm = [], []
    pos = 0
    for row in rows:
        k = len(row["choices"])
        ll = lls[pos:pos + k]
        pos += k
        lengths = np.array([float(len(c)) for c in row["choices"]])
        acc.append(float(np.argmax(ll) == row["gold"]))
        acc_norm.append(float(np.argmax(ll / lengths) == row["gold"]))
    protocol = (f"zero-shot, as lm-evaluation-harness: log-likelihood of '{MC_DELIMITER}' + choice after "
                f"'Question: ...\\nAnswer:', context and choice tokenized together with the tokenizer's own special "
                f"tokens; acc_norm divides by the choice's length in characters; {len(rows)} questions")
    return EvalFigure(name=spec.name, metric="acc", value=100 * float(np.mean(acc)),
                      secondary={"acc_norm": 100 * float(np.mean(acc_norm))}, scores=acc,
                      secondary_scores={"acc_norm": acc_norm}, protocol=protocol, items=len(rows))


# --- summarisation

def rouge(predictions: list[str], references: list[str]) -> dict[str, list[float]]:
    """ROUGE-1/2/L F1 per pair (0..1), Porter stemming, as the rouge-score package computes them."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    out: dict[str, list[float]] = {"rouge1": [], "rouge2": [], "rougeL": []}
    for p, r in zip(predictions, references):
        s = scorer.score(r, p)  # (target, prediction)
        for k in out:
            out[k].append(float(s[k].fmeasure))
    return out


def summarise(pred: CausalLM, rows: list[dict], spec: SummarySpec, eos: tuple[int, ...],
              phases: Any) -> tuple[EvalFigure, list[str]]:
    """Greedy summaries, one dialogue at a time (batch 1: no padding to change a row's
    numbers), stopped at eos or `max_new_tokens`; (the figure, the summaries)."""
    phases.begin("samsum", len(rows))
    texts = []
    for row in rows:
        ids, mask = left_pad([chat_ids(pred.tokenizer, row["prompt"])], pad_id(pred.tokenizer))
        out = greedy(pred, ids, mask, spec.max_new_tokens, eos, stop_at_eos=True)[0].tolist()
        cut = next((i for i, t in enumerate(out) if t in eos), len(out))
        texts.append(pred.tokenizer.decode(out[:cut], skip_special_tokens=True).strip())
        phases.step()
    scores = rouge(texts, [r["summary"] for r in rows])
    protocol = (f"SAMSum validation, {len(rows)} dialogues; 'Summarize this dialogue:' + the dialogue as the user turn "
                f"of the chat template; greedy, batch 1, at most {spec.max_new_tokens} new tokens, stop at eos; "
                f"ROUGE-1/2/L F1 (rouge-score, Porter stemming)")
    return EvalFigure(name="samsum", metric="rougeL", value=100 * float(np.mean(scores["rougeL"])),
                      secondary={k: 100 * float(np.mean(scores[k])) for k in ("rouge1", "rouge2")},
                      scores=scores["rougeL"], secondary_scores={k: scores[k] for k in ("rouge1", "rouge2")},
                      protocol=protocol, items=len(rows)), texts


# --- intervals

def delta(value: float, base: float) -> float:
    """A variant's perplexity against the baseline's: relative increase in percent."""
    return 100.0 * (value / base - 1.0)


def _relative(mean_nll_diff: np.ndarray) -> np.ndarray:
    return 100.0 * (np.exp(mean_nll_diff) - 1.0)


def interval(base_scores: list[float], scores: list[float], samples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% paired bootstrap interval of the relative perplexity increase (percent), resampling
    windows: 100 (exp(mean(nll_variant - nll_base)) - 1) per resample. With windows of equal
    token counts, the point value lies within it."""
    from compress.core.stats import paired_bootstrap

    return paired_bootstrap(np.asarray(base_scores, dtype=float), np.asarray(scores, dtype=float), samples,
                            seed=seed, scale=1.0, transform=_relative)


def points_interval(base_scores: list[float], scores: list[float], samples: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """95% paired bootstrap interval of the mean difference (variant - base) in points, for
    per-item scores in 0..1 (acc 0/1, ROUGE F1)."""
    from compress.core.stats import paired_bootstrap

    return paired_bootstrap(np.asarray(base_scores, dtype=float), np.asarray(scores, dtype=float), samples,
                            seed=seed, scale=100.0)


def _threads() -> int:
    """The benchmark worker's thread count (it sets torch's before loading a variant)."""
    import torch

    return int(torch.get_num_threads())


class CausalLMTask(Task):
    name = "causal-lm"
    metric = Metric(name="perplexity", direction="lower", unit="", label="ppl", delta_unit="%",
                    better="lower perplexity", best="lowest perplexity")
    secondary = (
        Metric(name="arc_easy", direction="higher", unit="%", label="ARC-E acc %", delta_unit="points"),
        Metric(name="piqa", direction="higher", unit="%", label="PIQA acc %", delta_unit="points"),
        Metric(name="samsum", direction="higher", unit="%", label="SAMSum ROUGE-L", delta_unit="points"),
    )
    columns = ("eval",)  # and per eval: text; context, choices, gold; prompt, summary
    workload = "greedy generation: a prefill to the first token, then one decode step per token (KV cache)"
    throughput_unit = "tok/s"

    def eval_rows(self, split: Any) -> list[dict]:
        """The rows of an LMEvalSet (compress.tasks.causal_lm.data), one per scored item."""
        return list(split.rows)

    def measure_lm(self, pred: CausalLM, rows: list[dict], spec: LMSpec, phases: Any) -> LMFigures:
        """Every eval of the spec, the generation timings and the memory plan, for one loaded variant."""
        by_eval: dict[str, list[dict]] = {}
        for r in rows:
            by_eval.setdefault(r["eval"], []).append(r)
        evals = []
        text = by_eval.get("perplexity")
        if not text:
            raise ValueError("the eval file has no perplexity row; rebuild it with compress.tasks.causal_lm.data.load_lm_evals")
        evals.append(perplexity(pred, text[0]["text"], spec.perplexity, phases))
        for mc in spec.multiple_choice:
            evals.append(multiple_choice(pred, by_eval.get(mc.name, []), mc, phases))
        eos = eos_ids(pred)
        if spec.summarization is not None and by_eval.get("samsum"):
            evals.append(summarise(pred, by_eval["samsum"], spec.summarization, eos, phases)[0])
        prompts = [chat_ids(pred.tokenizer, r["prompt"]) for r in by_eval.get("prompt", [])][: spec.timing.prompts]
        generation, ttft, tpot, tokens = time_generation(pred, prompts, spec.timing, eos, phases)
        plan = memory_plan(pred.config, pred.size_bytes(), spec.memory_tiers,
                           kv_dtype_bytes=getattr(pred, "kv_cache_bytes", 2))
        b1 = next(g for g in generation if g.batch_size == 1)
        limits = roofline(pred.size_bytes(), pred.num_params(), plan.kv_bytes_per_token, b1, _threads())
        return LMFigures(evals=evals, generation=generation, ttft_ms=ttft, tpot_ms=tpot, greedy_tokens=tokens,
                         memory_plan=plan, peak_rss_bytes=peak_rss_bytes(), roofline=limits)

    def read_eval(self, rows: list[dict]) -> tuple[list[dict], np.ndarray]:
        """(rows, no targets): what a causal LM is scored against lives in the rows."""
        return rows, np.zeros(0)

    def measurement_scores(self, measurement: Any, targets: np.ndarray) -> np.ndarray:
        """Per-window mean NLL [W] of the perplexity eval: what the paired bootstrap resamples."""
        ppl = next(e for e in measurement.lm.evals if e.name == "perplexity")
        return np.asarray(ppl.scores, dtype=np.float64)

    metric_is_mean = False  # perplexity is exp(mean NLL), not the windows' mean
    delta = staticmethod(delta)
    interval = staticmethod(interval)
    points_interval = staticmethod(points_interval)


TASK = CausalLMTask()
