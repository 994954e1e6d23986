"""Statistics shared by the tasks and the decision: the paired bootstrap, and the eval split
size its interval needs."""

from __future__ import annotations

import math
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


# The two-sided 95% normal quantile: paired_bootstrap's percentile interval of a mean of n
# paired differences is close to mean +- Z95 * sd / sqrt(n) once n is in the hundreds.
Z95 = 1.959963984540054


def examples_to_clear(scores_a: np.ndarray, scores_b: np.ndarray, margin: float, scale: float = 100.0
                      ) -> int | None:
    """How many eval examples the paired 95% interval of quality(b) - quality(a) needs for its
    half-width to be `margin` (in the metric's unit), were the per-example differences [N] as
    spread on more data as on these: ceil((Z95 * sd * scale / margin)^2). None when margin <= 0
    (no size of split helps a point estimate already over the budget) or the differences do
    not vary (the interval is already a point).

    Why by hand: the sample size of a paired mean difference is one line of arithmetic;
    statsmodels' power solvers would be a dependency for it."""
    if margin <= 0:
        return None
    diff = np.asarray(scores_b, dtype=np.float64) - np.asarray(scores_a, dtype=np.float64)  # [N]
    sd = float(diff.std(ddof=1)) if diff.size > 1 else 0.0
    if sd == 0.0:
        return None
    return math.ceil((Z95 * sd * scale / margin) ** 2)
