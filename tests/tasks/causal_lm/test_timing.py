"""Generation timings: the clock around the greedy loop, on a stub whose prefill and decode
times are known, and sane records on a tiny random Llama."""

from __future__ import annotations

import numpy as np
import pytest

from compress.formats.causal import greedy, left_pad
from compress.tasks.causal_lm.timing import peak_rss_bytes, percentiles, time_generation
from compress.tasks.causal_lm.records import TimingSpec
from tests.lm_fixtures import Phases, StubLM, tiny_causal


def test_known_prefill_and_step_times():
    pred = StubLM(script=[20, 21, 22, 23, 24, 25], prefill_s=0.03, step_s=0.01)
    prompts = [[1, 11, 12], [1, 13], [1, 14, 15, 16, 17]]
    spec = TimingSpec(prompts=3, new_tokens=4, batch_sizes=[2], max_prompt_tokens=3)
    ph = Phases()
    figs, ttft, tpot, toks = time_generation(pred, prompts, spec, (2,), ph)
    assert 30 <= ttft["p50"] < 60 and 10 <= tpot["mean"] < 25
    assert toks == [[20, 21, 22, 23]] * 3  # no eos within 4 tokens
    one, two = figs
    assert (one.batch_size, one.runs, one.new_tokens) == (1, 3, 4)
    assert one.prompt_tokens == pytest.approx(8 / 3)  # the last prompt cut to its last 3 tokens
    assert one.decode_tokens_per_s == pytest.approx(1000 / one.tpot_ms, rel=1e-6)
    assert two.batch_size == 2 and two.prompt_tokens == pytest.approx(2.5)  # prompts 1 and 2, real tokens only
    assert two.decode_tokens_per_s == pytest.approx(2 * 1000 / two.tpot_ms, rel=1e-6)  # every row's token counts
    assert two.prefill_tokens_per_s == pytest.approx(5 / (two.ttft_ms / 1000), rel=1e-6)
    assert ph.steps["generation (batch 1)"] == 3 and ph.steps["generation (batch 2)"] == 2


def test_batch_one_stops_at_eos_and_larger_batches_do_not():
    pred = StubLM(script=[20, 2], step_s=0.0)  # one token then eos
    figs, _, tpot, toks = time_generation(pred, [[1, 5]], TimingSpec(new_tokens=6, batch_sizes=[3]), (2,), Phases())
    assert toks == [[20, 2]]  # up to and including eos
    assert tpot["p50"] >= 0 and figs[1].batch_size == 3 and figs[1].new_tokens == 6


def test_percentiles_and_rss():
    p = percentiles([1.0, 2.0, 3.0, 4.0])
    assert p["p50"] == 2.5 and p["mean"] == 2.5 and p["p99"] <= 4.0
    assert percentiles([]) == {}
    assert peak_rss_bytes() > 10 * 2**20  # this process holds at least numpy


def test_tiny_llama(tmp_path):
    from compress.formats.causal import load_hf

    pred = load_hf(tiny_causal(tmp_path / "m"), "cpu", 1, {})
    tok = pred.tokenizer
    prompts = [tok("the cat sat on the mat")["input_ids"], tok("a dog ran")["input_ids"]]
    figs, ttft, tpot, toks = time_generation(pred, prompts, TimingSpec(new_tokens=5, batch_sizes=[1, 2]), (2,),
                                             Phases())
    assert [f.batch_size for f in figs] == [1, 2]
    assert all(f.ttft_ms > 0 and f.tpot_ms > 0 and f.decode_tokens_per_s > 0 for f in figs)
    assert set(ttft) == {"p50", "p95", "p99", "mean"}
    # The timed continuations are the plain greedy ones.
    for p, got in zip(prompts, toks):
        ids, mask = left_pad([p], 0)
        want = greedy(pred, ids, mask, 5, (2,)).tolist()[0]
        assert got == want[: len(got)] and len(got) >= 1
    assert np.isfinite([f.prefill_tokens_per_s for f in figs]).all()
