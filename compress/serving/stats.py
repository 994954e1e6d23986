"""What a served variant counts, and how the counts of its replicas become one figure.

Every replica (HTTP front and model alike) keeps its own cumulative `Counts` since it started
and sends the whole record, not a delta, to one `StatsBoard` actor every FLUSH_S seconds when
it changed (and a front replica right before it answers /metrics). The board keeps the latest
record of each replica and sums them, so a lost or repeated flush neither loses nor doubles a
count, and a replica that left (scaled down) still counts what it served. The figures are
therefore exact up to FLUSH_S old for the other replicas; `Server.snapshot()` waits that long.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

FLUSH_S = 0.1
# Bucket upper bounds: seconds for the request latency, texts for the model's batch size.
LATENCY_BOUNDS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Histogram(_Record):
    """Observations per bucket: counts[i] are those <= bounds[i] and > bounds[i-1]; the last
    count (len(bounds) + 1 in all) those above every bound."""

    bounds: list[float]
    counts: list[int]
    sum: float = 0.0

    @classmethod
    def empty(cls, bounds) -> "Histogram":
        return cls(bounds=list(bounds), counts=[0] * (len(bounds) + 1))

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float, n: int = 1) -> None:
        i = next((k for k, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += n
        self.sum += value * n

    def add(self, other: "Histogram") -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.sum += other.sum

    def quantile(self, q: float) -> float | None:
        """The bucket bound the q-th observation falls under (None when empty, inf above all)."""
        total = self.count
        if not total:
            return None
        rank, seen = q * total, 0
        for bound, c in zip([*self.bounds, math.inf], self.counts):
            seen += c
            if seen >= rank:
                return bound
        return math.inf


class Counts(_Record):
    """One replica's counts since it started (the front fills the request and cache fields,
    the model replica the batch and cascade ones)."""

    requests: dict[int, int] = Field(default_factory=dict)  # HTTP status -> requests answered
    latency: Histogram = Field(default_factory=lambda: Histogram.empty(LATENCY_BOUNDS_S))  # seconds per request
    texts: int = 0  # texts answered (cached ones included)
    batch_sizes: dict[int, int] = Field(default_factory=dict)  # texts in one model call -> calls
    cache_hits: int = 0
    cache_misses: int = 0
    cache_errors: int = 0  # cache calls that failed (the request went on without the cache)
    cascade_rows: int = 0  # texts a cascade's small member read
    cascade_routed: int = 0  # of those, the texts it sent on to the large member
    in_flight: int = 0  # requests the front is answering now (a gauge, not a count)

    def add(self, other: "Counts") -> None:
        for mine, theirs in ((self.requests, other.requests), (self.batch_sizes, other.batch_sizes)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.latency.add(other.latency)
        for name in ("texts", "cache_hits", "cache_misses", "cache_errors", "cascade_rows", "cascade_routed",
                     "in_flight"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Batching(_Record):
    """The model's batching, applied by every replica at runtime (set_max_batch_size and
    set_batch_wait_timeout_s of its @serve.batch queue; the fronts cut requests to it)."""

    max_batch_size: int
    batch_wait_timeout_s: float


class Orders(_Record):
    """What the board answers a replica's report with."""

    draining: bool
    batching: Batching


class ServerStats(_Record):
    """A served variant's figures, summed over its replicas (see the module docstring)."""

    variant: str
    requests: dict[int, int]  # HTTP status -> requests
    latency: Histogram  # seconds per request, as the HTTP front saw it
    texts: int
    batch_sizes: dict[int, int]  # texts in one model call -> model calls
    cache_hits: int
    cache_misses: int
    cache_errors: int
    cache: str  # "memory", "redis", "none"
    cache_up: bool | None  # whether the cache answered its last call; None without a cache
    routed_share: float | None  # share of texts a cascade sent to its large member; None: not a cascade (or no text yet)
    replicas: int  # model replicas running now
    in_flight: int  # requests being answered now

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def mean_batch_size(self) -> float | None:
        calls = sum(self.batch_sizes.values())
        return sum(k * v for k, v in self.batch_sizes.items()) / calls if calls else None


class StatsBoard:
    """The one place the replicas' counts meet (a Ray actor with no CPU of its own)."""

    def __init__(self, variant: str, cache: str, cascade: bool, batching: Batching):
        self.variant, self.cache, self.cascade, self.batching = variant, cache, cascade, batching
        self.counts: dict[str, Counts] = {}  # replica id -> its latest cumulative counts
        self.models: set[str] = set()  # model replicas running
        self.cache_up: dict[str, bool] = {}  # front replica id -> its cache answered last time
        self.draining = False  # stop() began: the fronts refuse new predictions

    def drain(self) -> None:
        self.draining = True

    def set_batching(self, batching: Batching) -> None:
        self.batching = batching

    def orders(self) -> Orders:
        return Orders(draining=self.draining, batching=self.batching)

    def join(self, replica: str) -> None:
        self.models.add(replica)

    def leave(self, replica: str) -> None:
        self.models.discard(replica)

    def report(self, replica: str, counts: Counts | None, cache_up: bool | None = None) -> Orders:
        """Keeps a replica's latest counts (None: no news); answers with the orders."""
        if counts is not None:
            self.counts[replica] = counts
        if cache_up is not None:
            self.cache_up[replica] = cache_up
        return self.orders()

    def total(self) -> ServerStats:
        total = Counts()
        for c in self.counts.values():
            total.add(c)
        share = None
        if self.cascade:
            share = total.cascade_routed / total.cascade_rows if total.cascade_rows else None
        up = None if self.cache == "none" else all(self.cache_up.values()) if self.cache_up else True
        return ServerStats(variant=self.variant, requests=total.requests, latency=total.latency, texts=total.texts,
                           batch_sizes=total.batch_sizes, cache_hits=total.cache_hits, cache_misses=total.cache_misses,
                           cache_errors=total.cache_errors, cache=self.cache, cache_up=up, routed_share=share,
                           replicas=len(self.models), in_flight=total.in_flight)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _histogram(lines: list[str], name: str, help_: str, hist: Histogram, labels: str) -> None:
    lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
    seen = 0
    for bound, c in zip([*hist.bounds, math.inf], hist.counts):
        seen += c
        le = "+Inf" if bound == math.inf else format(bound, "g")
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {seen}')
    lines += [f"{name}_sum{{{labels}}} {hist.sum!r}", f"{name}_count{{{labels}}} {seen}"]


def prometheus(stats: ServerStats) -> str:
    """The Prometheus text exposition (format 0.0.4) of a served variant's figures."""
    v = f'variant="{_label(stats.variant)}"'
    lines = ["# HELP compress_requests_total HTTP requests answered, by status code.",
             "# TYPE compress_requests_total counter"]
    for status, n in sorted(stats.requests.items()):
        lines.append(f'compress_requests_total{{{v},status="{status}"}} {n}')
    _histogram(lines, "compress_request_latency_seconds", "Time from a request's arrival at the HTTP front to its answer.",
               stats.latency, v)
    batches = Histogram.empty(BATCH_BOUNDS)
    for size, calls in stats.batch_sizes.items():
        batches.observe(size, calls)
    _histogram(lines, "compress_batch_size", "Texts per model call (Ray Serve's @serve.batch).", batches, v)
    lines += ["# HELP compress_texts_total Texts answered (cached ones included).", "# TYPE compress_texts_total counter",
              f"compress_texts_total{{{v}}} {stats.texts}"]
    for name, n, help_ in (("hits", stats.cache_hits, "Texts answered from the result cache."),
                           ("misses", stats.cache_misses, "Texts the result cache did not hold (sent to the model)."),
                           ("errors", stats.cache_errors, "Cache calls that failed; the request went on without it.")):
        lines += [f"# HELP compress_cache_{name}_total {help_}", f"# TYPE compress_cache_{name}_total counter",
                  f'compress_cache_{name}_total{{{v},cache="{stats.cache}"}} {n}']
    if stats.cache_up is not None:
        lines += ["# HELP compress_cache_up Whether the result cache answered its last call.",
                  "# TYPE compress_cache_up gauge", f'compress_cache_up{{{v},cache="{stats.cache}"}} {int(stats.cache_up)}']
    if stats.routed_share is not None:
        lines += ["# HELP compress_cascade_routed_share Share of texts the cascade sent on to its large member.",
                  "# TYPE compress_cascade_routed_share gauge",
                  f"compress_cascade_routed_share{{{v}}} {stats.routed_share!r}"]
    lines += ["# HELP compress_replicas Model replicas running.", "# TYPE compress_replicas gauge",
              f"compress_replicas{{{v}}} {stats.replicas}"]
    return "\n".join(lines) + "\n"
