"""How close a causal-LM variant runs to this machine's limits: its batch-1 decode rate against
the memory-bandwidth roofline, and its prefill against the fp32 matrix-multiply peak.

At batch 1 every decode step reads every weight once and the KV cache of the row so far, and
does about 2 FLOPs per weight: far too little arithmetic per byte to be compute-bound on a CPU,
so the decode rate's ceiling is (read bandwidth) / (bytes read per token). The prefill of a
long prompt multiplies every weight by many tokens at once, so its ceiling is the machine's
FLOP rate. Both limits are measured here, in the benchmark's own process and thread count,
because no library reports them for the machine at hand.

Counted per token: the weights as stored (size on disk: a quantized file is read in its packed
form; an untied token table is counted although a step reads one row of it, a small over-count)
plus K and V of every cached position; FLOPs 2 per weight (attention's own products left out:
at these prompt lengths they are a few percent of the matrix work).
"""

from __future__ import annotations

import time

from compress.tasks.causal_lm.records import GenFigures, Roofline

_limits: dict[int, tuple[float, float]] = {}  # threads -> (read GB/s, fp32 GFLOP/s), measured once a process


def _best(f, repeats: int) -> float:
    f()  # first touch: page faults and kernel selection out of the timing
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def machine_limits(threads: int, read_bytes: int = 1 << 30, n: int = 2048, repeats: int = 5) -> tuple[float, float]:
    """(read bandwidth GB/s, fp32 matmul GFLOP/s) with `threads` threads: the fastest of
    `repeats` sums over a `read_bytes` array (larger than every cache) and of n x n matmuls."""
    if threads in _limits:
        return _limits[threads]
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        big = torch.ones(read_bytes // 4, dtype=torch.float32)
        gbps = read_bytes / _best(lambda: big.sum(), repeats) / 1e9
        del big
        a, b = torch.randn(n, n), torch.randn(n, n)
        gflops = 2 * n ** 3 / _best(lambda: torch.mm(a, b), repeats) / 1e9
    finally:
        torch.set_num_threads(old)
    _limits[threads] = (gbps, gflops)
    return gbps, gflops


def roofline(weights_bytes: int, params: int, kv_bytes_per_token: int, batch1: GenFigures, threads: int) -> Roofline:
    """The variant's batch-1 figures against the limits (see the module docstring)."""
    gbps, gflops = machine_limits(threads)
    context = batch1.prompt_tokens + batch1.new_tokens / 2  # mean cached positions over the decode steps
    per_token = weights_bytes + kv_bytes_per_token * context
    decode = per_token * batch1.decode_tokens_per_s / (gbps * 1e9)
    prefill = 2 * params * batch1.prefill_tokens_per_s / (gflops * 1e9)
    return Roofline(read_gb_s=gbps, fp32_gflop_s=gflops, bytes_per_token=int(per_token), decode_fraction=decode,
                    decode_ceiling_tokens_per_s=gbps * 1e9 / per_token, prefill_fraction=prefill)
