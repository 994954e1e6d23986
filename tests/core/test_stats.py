import numpy as np
import pytest

from compress.core.stats import Z95, examples_to_clear, paired_bootstrap


def test_examples_to_clear_is_the_size_at_which_the_interval_is_the_margin_wide():
    a = np.ones(1000)
    b = np.ones(1000)
    b[:100] = 0  # 10% of the examples lost: differences of sd 0.3 (ddof 1: 0.30015)
    n = examples_to_clear(a, b, margin=2.0)
    assert n == int(np.ceil((Z95 * np.std(b - a, ddof=1) * 100 / 2.0) ** 2))  # 87 examples
    # The bootstrap agrees: on about that many examples with 10% lost, its interval is about
    # 2 points either side of the centre.
    size = int(round(n / 10)) * 10
    small_a, small_b = np.ones(size), np.ones(size)
    small_b[::10] = 0
    lo, hi = paired_bootstrap(small_a, small_b, 4000)
    assert (hi - lo) / 2 == pytest.approx(2.0, rel=0.1)
    assert examples_to_clear(a, b, margin=1.0) == pytest.approx(4 * n, rel=0.01)  # half the margin: 4x the data


def test_no_size_when_the_point_is_already_over_or_the_differences_do_not_vary():
    a, b = np.ones(50), np.ones(50)
    b[:5] = 0
    assert examples_to_clear(a, b, margin=0.0) is None
    assert examples_to_clear(a, b, margin=-0.5) is None
    assert examples_to_clear(a, a, margin=1.0) is None  # identical answers: the interval is [0, 0]
