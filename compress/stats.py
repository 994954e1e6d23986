"""Statistics shared by the tasks and the decision: the paired bootstrap."""

from __future__ import annotations

from typing import Callable

import numpy as np


def paired_bootstrap(scores_a: np.ndarray, scores_b: np.ndarray, samples: int, seed: int = 0,
                     scale: float = 100.0, transform: Callable[[np.ndarray], np.ndarray] | None = None
                     ) -> tuple[float, float]:
    """95% interval of quality(b) - quality(a), resampling examples together (the two models
    are scored on the same examples, so their errors are paired). scores [N]: the task's
    per-example scores (classification: correct or not), whose mean times `scale` is the
    metric (100: accuracy in points)."""
    n = len(scores_a)
    rng = np.random.default_rng(seed)
    diff = scores_b.astype(np.float32) - scores_a.astype(np.float32)  # [N]
    deltas = np.empty(samples, dtype=np.float64)
    for start in range(0, samples, 200):  # chunks keep the index matrix small
        idx = rng.integers(0, n, size=(min(200, samples - start), n))
        deltas[start : start + idx.shape[0]] = diff[idx].mean(axis=1) * scale
    if transform is not None:  # a statistic of the mean difference (perplexity: its relative increase)
        deltas = transform(deltas / scale)
    lo, hi = np.percentile(deltas, [2.5, 97.5])
    return float(lo), float(hi)
