"""Checks compress's zero-shot multiple choice (ARC-Easy, PIQA: acc and acc_norm) against
lm-evaluation-harness's own scoring of the same questions with the same model.

lm-evaluation-harness must be importable (it is not a dependency of compress: install it in
a separate environment that also sees compress). Its task loader fetches datasets from the
Hugging Face hub, so the questions are read here with compress.tasks.causal_lm.data and handed to its
HFLM.loglikelihood as the (context, continuation) requests its arc_easy and piqa tasks
build (doc_to_text "Question: ...\\nAnswer:", target delimiter " "), and acc / acc_norm are
computed from its log-likelihoods as its Task.process_results does.

    python eval/lm_eval_check.py MODEL_FOLDER --data ../shared/data --items 100 [--threads 2]

Prints, per set, both accuracies, how many questions' predictions differ, and the largest
difference of a choice's log-likelihood.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def lm_eval_lls(model: Path, requests: list[tuple[str, str]], batch_size: int) -> list[float]:
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(model), device="cpu", dtype="float32", batch_size=batch_size)
    inst = [Instance(request_type="loglikelihood", doc={}, arguments=r, idx=i) for i, r in enumerate(requests)]
    return [ll for ll, _ in lm.loglikelihood(inst, disable_tqdm=True)]


def accuracies(rows: list[dict], lls: list[float]) -> tuple[list[float], list[float]]:
    """acc and acc_norm per question, as lm_eval.api.task.Task.process_results (multiple_choice)."""
    acc, norm, pos = [], [], 0
    for row in rows:
        k = len(row["choices"])
        ll = np.array(lls[pos:pos + k])
        pos += k
        lengths = np.array([float(len(c)) for c in row["choices"]])
        acc.append(float(np.argmax(ll) == row["gold"]))
        norm.append(float(np.argmax(ll / lengths) == row["gold"]))
    return acc, norm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="a transformers causal-LM folder")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

    import torch

    from compress.formats.causal import load_hf
    from compress.tasks.causal_lm.data import load_lm_evals
    from compress.tasks.causal_lm.records import LMSpec
    from compress.tasks.causal_lm.task import MC_DELIMITER, encode_pair, loglikelihoods

    torch.set_num_threads(args.threads)
    spec = LMSpec.model_validate({
        "perplexity": {"path": str(args.data / "wikitext2" / "wiki.test.raw")},
        "multiple_choice": [{"name": n, "path": str(args.data / n), "max_items": args.items} for n in ("arc_easy", "piqa")],
        "timing": {"prompts": 1}, "summarization": {"path": str(args.data / "samsum" / "validation.jsonl"), "max_items": 1}})
    evals = load_lm_evals(spec, Path("/"))
    pred = load_hf(args.model, "cpu", args.threads, {})

    class _Quiet:
        def begin(self, *a): pass
        def step(self, *a): pass

    for mc in spec.multiple_choice:
        rows = evals.of(mc.name)
        requests = [(r["context"], MC_DELIMITER + c) for r in rows for c in r["choices"]]
        t = time.perf_counter()
        ours = loglikelihoods(pred, [encode_pair(pred.tokenizer, c, x) for c, x in requests], _Quiet())
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        theirs = lm_eval_lls(args.model, requests, args.batch_size)
        t_theirs = time.perf_counter() - t
        a_ours, n_ours = accuracies(rows, ours)
        a_theirs, n_theirs = accuracies(rows, theirs)
        diff = np.abs(np.array(ours) - np.array(theirs))
        print(f"{mc.name}: {len(rows)} questions, {len(requests)} requests | compress acc {100 * np.mean(a_ours):.2f} "
              f"acc_norm {100 * np.mean(n_ours):.2f} ({t_ours:.0f} s) | lm-eval acc {100 * np.mean(a_theirs):.2f} "
              f"acc_norm {100 * np.mean(n_theirs):.2f} ({t_theirs:.0f} s) | questions differing: acc "
              f"{sum(x != y for x, y in zip(a_ours, a_theirs))}, acc_norm {sum(x != y for x, y in zip(n_ours, n_theirs))} "
              f"| max |ll diff| {diff.max():.2e} nats, mean {diff.mean():.2e}")


if __name__ == "__main__":
    main()
