"""The requests a load sends, explicit and reproducible: Zipf draws over a pool of distinct
eval texts (seeded), or a request log replayed line after line.

A traffic is a stream: request k is always the same text, however the stream is read, so
every configuration receives the same requests and a run's share of repeated texts can be
counted exactly (`duplicate_share`) and compared with what the model implies
(`expected_duplicate_share`) and with the server's cache hit rate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compress.core.errors import DataError
from compress.recipe.serving import TrafficSpec
from compress.serving.records import TrafficInfo

CHUNK = 4096  # draws per seeded block: request k's text depends on (seed, k) alone


def zipf_probabilities(pool: int, exponent: float) -> np.ndarray:
    """P(rank r) proportional to 1 / r**exponent, r = 1..pool: [pool] float64, summing to 1."""
    w = 1.0 / np.arange(1, pool + 1, dtype=np.float64) ** exponent
    return w / w.sum()


def expected_duplicate_share(p: np.ndarray, n: int) -> float:
    """The expected share of n independent requests (text i with probability p[i]) whose
    text was asked before: 1 - E[distinct texts] / n, E[distinct] = sum_i 1 - (1 - p_i)**n."""
    if n <= 0:
        return 0.0
    distinct = float(np.sum(-np.expm1(n * np.log1p(-np.minimum(p, 1.0 - 1e-16)))))
    return 1.0 - distinct / n


def duplicate_share(ids) -> float:
    """The share of requests whose text was asked before (1 - distinct / requests)."""
    ids = list(ids)
    return 1.0 - len(set(ids)) / len(ids) if ids else 0.0


@dataclass
class Traffic:
    """A request stream over `texts` (its distinct texts): `ids(start, n)` gives the text
    ids of requests start..start+n-1."""

    texts: list[str]
    kind: str  # "zipf" | "log"
    probabilities: np.ndarray | None = None  # zipf: [len(texts)]
    seed: int = 0
    exponent: float | None = None
    order: list[int] | None = None  # log: the text id of every line, in order
    log: str | None = None
    log_mean_qps: float | None = None
    log_peak_qps: float | None = None
    _cdf: np.ndarray | None = field(default=None, repr=False)
    _chunks: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def ids(self, start: int, n: int) -> list[int]:
        if self.kind == "log":
            assert self.order is not None
            m = len(self.order)
            return [self.order[(start + i) % m] for i in range(n)]  # a log shorter than the load wraps around
        out: list[int] = []
        k = start
        while len(out) < n:
            c, off = divmod(k, CHUNK)
            take = min(CHUNK - off, n - len(out))
            out.extend(self._chunk(c)[off:off + take].tolist())
            k += take
        return out

    def _chunk(self, c: int) -> np.ndarray:
        if c not in self._chunks:
            if self._cdf is None:
                assert self.probabilities is not None
                self._cdf = np.cumsum(self.probabilities)
                self._cdf[-1] = 1.0
            u = np.random.default_rng([self.seed, c]).random(CHUNK)
            self._chunks[c] = np.minimum(np.searchsorted(self._cdf, u, side="right"), len(self.texts) - 1)
        return self._chunks[c]

    def expected_duplicate_share(self, n: int) -> float | None:
        """The model's duplicate share over n requests (zipf); None for a log (counted instead)."""
        if self.probabilities is None:
            return None
        return expected_duplicate_share(self.probabilities, n)

    def info(self, requests: int, sent: float | None = None) -> TrafficInfo:
        return TrafficInfo(
            kind=self.kind, distinct_texts=len(self.texts), exponent=self.exponent,
            seed=self.seed if self.kind == "zipf" else None, log=self.log,
            log_requests=len(self.order) if self.order is not None else None,
            log_mean_qps=self.log_mean_qps, log_peak_qps=self.log_peak_qps, requests=requests,
            duplicate_share_theory=self.expected_duplicate_share(requests) if requests else None,
            duplicate_share_sent=sent,
        )

    def describe(self, requests: int) -> str:
        """One line: what the traffic is and the duplicate share it implies."""
        if self.kind == "zipf":
            share = self.expected_duplicate_share(requests)
            return (f"traffic: Zipf (exponent {self.exponent:g}) over {len(self.texts)} distinct eval texts, seed "
                    f"{self.seed}: over {requests} requests {share:.1%} of them repeat a text asked before")
        share = duplicate_share(self.ids(0, requests))
        return (f"traffic: the request log {self.log} ({len(self.order or [])} requests, {len(self.texts)} distinct "
                f"texts) replayed line after line (each run's lines in LoadGen's order): over {requests} requests {share:.1%} repeat a text asked before")


def zipf_traffic(texts: list[str], pool: int, exponent: float, seed: int) -> Traffic:
    """`pool` distinct texts of `texts` in a seeded order, ranked as drawn."""
    distinct = list(dict.fromkeys(t for t in texts if t.strip()))
    if not distinct:
        raise DataError("the eval split has no text to send; check data.text names the text column")
    order = np.random.default_rng(seed).permutation(len(distinct))[:pool]
    chosen = [distinct[i] for i in order]
    return Traffic(texts=chosen, kind="zipf", probabilities=zipf_probabilities(len(chosen), exponent), seed=seed,
                   exponent=exponent)


def log_traffic(path: Path) -> Traffic:
    """A request log: JSON Lines of {"timestamp": seconds, "text": "..."}, replayed line after
    line: each LoadGen run sends the next lines, once each, in LoadGen's seeded order at its
    Poisson arrivals (the timestamps give the log's own rates, reported beside the figures)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise DataError(f"{path}: no such request log; fix serving.traffic.log") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the request log ({exc.__class__.__name__})") from exc
    stamps: list[float] = []
    texts: list[str] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {i}: not JSON; write one {{\"timestamp\": ..., \"text\": ...}} a line") from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str) or not rec["text"].strip():
            raise DataError(f"{path}: line {i}: needs a non-empty \"text\" string")
        t = rec.get("timestamp")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise DataError(f"{path}: line {i}: needs a numeric \"timestamp\" (seconds)")
        stamps.append(float(t))
        texts.append(rec["text"])
    if not texts:
        raise DataError(f"{path}: the request log is empty")
    if any(b < a for a, b in zip(stamps, stamps[1:])):
        raise DataError(f"{path}: timestamps go backwards; sort the log by timestamp")
    index: dict[str, int] = {}
    order = [index.setdefault(t, len(index)) for t in texts]
    mean, peak = log_rates(stamps)
    return Traffic(texts=list(index), kind="log", order=order, log=str(path), log_mean_qps=mean, log_peak_qps=peak)


def log_rates(stamps: list[float]) -> tuple[float | None, float | None]:
    """(mean, peak) requests per second of a log: the peak over windows of a tenth of its
    span (one second at least, a minute at most)."""
    span = stamps[-1] - stamps[0] if stamps else 0.0
    if len(stamps) < 2 or span <= 0:
        return None, None
    window = min(60.0, max(1.0, span / 10.0))
    a = np.asarray(stamps)
    counts = np.searchsorted(a, a + window, side="left") - np.arange(len(a))
    return (len(a) - 1) / span, float(counts.max()) / window


def traffic_from_spec(spec: TrafficSpec, texts: list[str], base_dir: Path) -> Traffic:
    """The recipe's traffic: its log (relative to the recipe) or Zipf draws over `texts`."""
    if spec.log is not None:
        path = Path(spec.log)
        return log_traffic(path if path.is_absolute() else base_dir / path)
    z = spec.zipf
    return zipf_traffic(texts, z.pool, z.exponent, z.seed)
