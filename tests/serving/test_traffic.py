"""compress.serving.traffic: the request stream is reproducible, and the share of repeated
texts it sends is what the Zipf model says it is."""

import json

import numpy as np
import pytest

from compress.core.errors import DataError
from compress.recipe.serving import TrafficSpec
from compress.serving.traffic import (CHUNK, duplicate_share, expected_duplicate_share, log_rates, log_traffic,
                                      traffic_from_spec, zipf_probabilities, zipf_traffic)

TEXTS = [f"sentence number {i}" for i in range(1000)]


def test_the_expected_duplicate_share_is_the_classic_occupancy_formula():
    # Uniform over K texts: E[distinct] = K (1 - (1 - 1/K)^n).
    k, n = 50, 120
    p = np.full(k, 1.0 / k)
    assert expected_duplicate_share(p, n) == pytest.approx(1 - k * (1 - (1 - 1 / k) ** n) / n, rel=1e-12)
    assert expected_duplicate_share(p, 1) == pytest.approx(0.0, abs=1e-12)  # one request repeats nothing
    assert expected_duplicate_share(np.array([1.0]), 10) == pytest.approx(0.9)  # one text: all but the first repeat


@pytest.mark.parametrize("exponent", [0.0, 1.0, 1.6])
def test_the_drawn_stream_repeats_texts_as_often_as_the_model_says(exponent):
    t = zipf_traffic(TEXTS, pool=300, exponent=exponent, seed=3)
    n = 3000
    expected = t.expected_duplicate_share(n)
    # Over several independent streams (other seeds) the mean share is the expectation.
    shares = [duplicate_share(zipf_traffic(TEXTS, 300, exponent, seed).ids(0, n)) for seed in range(8)]
    assert np.mean(shares) == pytest.approx(expected, abs=0.006)
    assert abs(duplicate_share(t.ids(0, n)) - expected) < 0.02


def test_a_steeper_zipf_repeats_more():
    shares = [zipf_traffic(TEXTS, 300, e, 0).expected_duplicate_share(300) for e in (0.0, 0.8, 1.2, 2.0)]
    assert shares == sorted(shares) and shares[-1] - shares[0] > 0.3


def test_the_stream_is_the_same_however_it_is_read_and_seeded():
    t = zipf_traffic(TEXTS, 200, 1.1, seed=5)
    whole = t.ids(0, 3 * CHUNK + 17)
    parts = t.ids(0, 100) + t.ids(100, CHUNK) + t.ids(100 + CHUNK, 2 * CHUNK + 17 - 100)
    assert parts == whole
    again = zipf_traffic(TEXTS, 200, 1.1, seed=5)
    assert again.texts == t.texts and again.ids(CHUNK - 3, 10) == whole[CHUNK - 3:CHUNK + 7]
    other = zipf_traffic(TEXTS, 200, 1.1, seed=6)
    assert other.ids(0, 500) != whole[:500]
    assert len(set(t.texts)) == 200 and set(t.texts) <= set(TEXTS)


def test_the_pool_is_the_distinct_texts_when_the_split_has_fewer():
    t = zipf_traffic(["a", "b", "a", " ", "c"], pool=10, exponent=1.0, seed=0)
    assert sorted(t.texts) == ["a", "b", "c"]
    assert zipf_probabilities(3, 1.0) == pytest.approx(np.array([1, 1 / 2, 1 / 3]) / (11 / 6))
    with pytest.raises(DataError):
        zipf_traffic(["", "  "], 10, 1.0, 0)


def _log(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_request_log_is_replayed_line_after_line_and_wraps_around(tmp_path):
    rows = [{"timestamp": i * 0.5, "text": t} for i, t in enumerate(["x", "y", "x", "z", "x"])]
    t = log_traffic(_log(tmp_path / "log.jsonl", rows))
    sent = [t.texts[i] for i in t.ids(0, 7)]
    assert sent == ["x", "y", "x", "z", "x", "x", "y"]
    assert duplicate_share(t.ids(0, 5)) == pytest.approx(2 / 5)
    assert t.expected_duplicate_share(5) is None  # a log's share is counted, not modelled
    assert t.log_mean_qps == pytest.approx(2.0)
    assert "replayed line after line" in t.describe(5) and "40.0%" in t.describe(5)
    spec = TrafficSpec(log="log.jsonl")
    assert traffic_from_spec(spec, TEXTS, tmp_path).kind == "log"


def test_log_rates_find_the_peak():
    stamps = [float(i) for i in range(600)] + [600 + i / 10 for i in range(600)]  # 1/s for 10 min, then 10/s for 1
    mean, peak = log_rates(stamps)
    assert mean == pytest.approx(1199 / 659.9)
    assert peak == pytest.approx(10.0)  # the busiest minute
    assert log_rates([5.0]) == (None, None)


@pytest.mark.parametrize("line, problem", [
    ("not json", "line 2: not JSON"),
    (json.dumps({"timestamp": 1.0}), "line 2: needs a non-empty \"text\""),
    (json.dumps({"timestamp": "soon", "text": "a"}), "line 2: needs a numeric \"timestamp\""),
    (json.dumps({"timestamp": -5.0, "text": "a"}), "timestamps go backwards"),
])
def test_a_bad_log_line_is_named(tmp_path, line, problem):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"timestamp": 0.0, "text": "first"}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError) as exc:
        log_traffic(path)
    assert problem in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(DataError, match="no such request log"):
        log_traffic(tmp_path / "missing.jsonl")
