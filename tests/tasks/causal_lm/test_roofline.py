"""The roofline arithmetic against limits the test sets, and the limits measured for real (small)."""

from __future__ import annotations

import pytest

from compress.tasks.causal_lm import roofline as rl
from compress.tasks.causal_lm.records import GenFigures


def test_decode_and_prefill_fractions_are_bytes_and_flops_over_the_limits(monkeypatch):
    monkeypatch.setitem(rl._limits, 3, (10.0, 100.0))  # 10 GB/s, 100 GFLOP/s
    b1 = GenFigures(batch_size=1, prompt_tokens=100, new_tokens=50, ttft_ms=10, tpot_ms=10,
                    prefill_tokens_per_s=200.0, decode_tokens_per_s=50.0)
    r = rl.roofline(100_000_000, 50_000_000, 1000, b1, 3)
    per_token = 100_000_000 + 1000 * 125  # mean cached positions: 100 + 50 / 2
    assert r.bytes_per_token == per_token
    assert r.decode_fraction == pytest.approx(per_token * 50 / 10e9)
    assert r.decode_ceiling_tokens_per_s == pytest.approx(10e9 / per_token)
    assert r.prefill_fraction == pytest.approx(2 * 50_000_000 * 200 / 100e9)


def test_the_machine_limits_are_measured_once_a_process(monkeypatch):
    monkeypatch.delitem(rl._limits, 1, raising=False)
    gbps, gflops = rl.machine_limits(1, read_bytes=64 << 20, n=256, repeats=2)
    assert gbps > 0.1 and gflops > 0.1
    assert rl.machine_limits(1) == (gbps, gflops)  # cached: not measured again with the defaults
    monkeypatch.delitem(rl._limits, 1)
