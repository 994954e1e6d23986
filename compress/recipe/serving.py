"""The recipe's `serving:` block: how a variant is served (batching, replicas, threads, the
result cache, request limits), the load it is measured under, the traffic it is sized for
and the prices that turn instances into $/month. Pydantic only: validated with the recipe,
before any model loads."""

from __future__ import annotations

from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator,
                      model_validator)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --- the server (owned by the serve work) ---------------------------------------------


class AutoscalingSpec(_Strict):
    """Ray Serve's autoscaling on ongoing requests per replica, instead of a fixed count."""

    min_replicas: PositiveInt = Field(1, le=256, description="Fewest model replicas kept running.")
    max_replicas: PositiveInt = Field(2, le=256, description="Most model replicas started under load (each "
                                      "reserves `threads` CPUs: more than the machine has never start).")
    target_ongoing_requests: PositiveFloat = Field(
        8.0, le=10_000, description="Ongoing requests (texts queued or in a batch) per replica that autoscaling "
        "aims at: above it replicas are added, below it removed.")

    @model_validator(mode="after")
    def _order(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self


class ServerSpec(_Strict):
    """How `compress serve` runs the variant on Ray Serve. The defaults suit a 2-core machine."""

    host: str = Field("127.0.0.1", min_length=1, max_length=255,
                      description="Address the HTTP server listens on; 0.0.0.0 to accept other machines.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port; 0 picks a free one (printed at start).")
    max_batch_size: PositiveInt = Field(
        8, le=1024, description="Most texts one model call takes (Ray Serve's @serve.batch, counted in texts: "
        "a request's texts may share a batch with other requests'); 1 serves unbatched.")
    batch_wait_timeout_s: PositiveFloat = Field(
        0.005, le=10, description="Longest a text waits for a batch to fill before the model runs what it has.")
    num_replicas: PositiveInt = Field(1, le=256, description="Model replicas (processes), each with its own "
                                      "copy of the model; not with `autoscaling`.")
    autoscaling: AutoscalingSpec | None = Field(None, description="Scale the model replicas on ongoing requests "
                                                 "(instead of `num_replicas`).")
    threads: PositiveInt = Field(1, le=256, description="Intra-op threads of the runtime in each model replica "
                                 "(torch, ONNX Runtime, OpenVINO); each replica reserves as many Ray CPUs.")
    topology: Literal["one_hop", "front_and_model"] = Field(
        "one_hop", description="`one_hop`: the HTTP front (request checks, the cache, metrics) and the model in "
        "one replica, so a request crosses one process boundary; `front_and_model`: the front in replicas of "
        "its own (`ingress_replicas`), the model in others, a second hop per request.")
    ingress_replicas: PositiveInt = Field(1, le=64, description="Replicas of the HTTP front with topology "
                                          "`front_and_model` (request checks, the cache, metrics); it does no model work.")
    max_ongoing_requests: PositiveInt = Field(
        64, le=100_000, description="Model calls a model replica takes at once (queued for a batch or in one); "
        "at least max_batch_size, or batches never fill.")
    max_length: PositiveInt = Field(128, le=8192, description="Tokens a text is cut to, as in the benchmark.")
    drain_timeout_s: PositiveFloat = Field(
        10.0, le=600, description="On SIGTERM or Ctrl-C, the longest the server waits for requests in flight.")

    @model_validator(mode="after")
    def _consistent(self):
        if self.max_ongoing_requests < self.max_batch_size:
            raise ValueError(f"max_ongoing_requests ({self.max_ongoing_requests}) is below max_batch_size "
                             f"({self.max_batch_size}): a batch could never fill; raise it")
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("give either num_replicas or autoscaling, not both")
        return self


class CacheSpec(_Strict):
    """The result cache in front of the model: texts already answered are not run again."""

    kind: Literal["none", "memory", "redis"] = Field(
        "memory", description="`memory`: a bounded LRU in each HTTP front replica; `redis`: a Redis server "
        "that every replica shares (`url`); `none`: no cache.")
    url: str | None = Field(None, max_length=2048, description="The Redis server of kind `redis`: "
                            "redis://HOST:PORT/DB, rediss:// (TLS) or unix:///PATH.")
    ttl_s: PositiveFloat = Field(3600.0, le=30 * 86400, description="How long an answer stays cached.")
    max_entries: PositiveInt = Field(100_000, le=100_000_000, description="Most answers the `memory` cache "
                                     "holds; the least recently used go first.")
    timeout_s: PositiveFloat = Field(0.25, le=30, description="Longest a Redis call may take before the request "
                                     "goes on without the cache.")
    retry_s: PositiveFloat = Field(5.0, le=3600, description="After a Redis failure, how long the server runs "
                                   "without the cache before it tries Redis again.")

    @model_validator(mode="after")
    def _url(self):
        if self.kind == "redis" and not self.url:
            raise ValueError("kind redis needs serving.cache.url (e.g. redis://127.0.0.1:6379/0)")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"serving.cache.url '{self.url[:100]}' is not a Redis URL; give redis://HOST:PORT/DB, "
                             f"rediss:// or unix:///PATH")
        return self


class LimitSpec(_Strict):
    """Requests beyond these are answered 4xx before they reach the model."""

    max_body_bytes: PositiveInt = Field(1 << 20, le=1 << 30, description="Largest request body, in bytes (413).")
    max_texts: PositiveInt = Field(256, le=100_000, description="Most texts in one request (413).")
    max_text_chars: PositiveInt = Field(10_000, le=10_000_000, description="Longest text, in characters (413); "
                                        "the model reads only its first max_length tokens.")


# --- the load, the traffic and the prices (owned by the load work) ---------------------


CONFIGURATIONS = ("reference", "unbatched", "batched", "batched_cache", "cascade")


class LoadSpec(_Strict):
    """MLPerf LoadGen's server scenario against the served endpoint: Poisson arrivals at a
    target QPS; a run is VALID when the `percentile` latency meets `slo_ms` over enough
    queries (LoadGen's rule, early stopping included). The highest VALID QPS is searched:
    doubled from `start_qps` until a run fails, then bisected, `max_runs` runs at most."""

    slo_ms: PositiveFloat = Field(200.0, description="Latency SLO of one request (HTTP, end to end), in ms.")
    percentile: float = Field(0.99, gt=0.5, lt=1.0, description="The latency percentile the SLO is on (LoadGen's "
                              "server_target_latency_percentile). At 0.99 LoadGen's early-stopping rule needs "
                              "459 queries or more in a run before it can be VALID; runs are lengthened to that.")
    min_duration_s: PositiveFloat = Field(5.0, description="LoadGen's min_duration: the shortest scheduled run.")
    min_queries: PositiveInt = Field(64, description="LoadGen's min_query_count (raised to what early stopping "
                                     "needs at `percentile`). At 0.99 a run of 459 queries is VALID only with none "
                                     "over the SLO; 662 lets one pass, 838 two (LoadGen's early-stopping rule).")
    max_run_s: PositiveFloat = Field(60.0, description="The longest a run may be scheduled: the search offers no "
                                     "load so low that the queries a run needs would take longer.")
    start_qps: PositiveFloat = Field(8.0, description="The first offered load of the search.")
    max_qps: PositiveFloat = Field(4096.0, description="The search offers no more than this.")
    growth: float = Field(2.0, gt=1.0, description="Factor between offered loads while bracketing.")
    resolution: float = Field(0.15, gt=0.0, description="Bisection stops once the invalid bound is within this "
                              "fraction of the valid one.")
    max_runs: PositiveInt = Field(6, description="LoadGen runs per configuration, bracketing and bisection together.")
    concurrency: PositiveInt = Field(64, description="Open HTTP connections of the load generator.")
    timeout_s: PositiveFloat = Field(10.0, description="A request unanswered this long counts as failed (a run "
                                     "with a failed request is not valid).")
    seed: NonNegativeInt = Field(0, description="LoadGen's schedule and sample-order seeds (each run adds its number).")
    configurations: list[Literal["reference", "unbatched", "batched", "batched_cache", "cascade"]] = Field(
        default_factory=lambda: list(CONFIGURATIONS),
        description="What is served and measured, one after another on the same traffic: `reference` (the "
        "baseline's ONNX export, unbatched, when the run has one), `unbatched` (the variant, max batch 1, no cache), "
        "`batched`, `batched_cache`, `cascade` (the run's cascade, batched and cached, when it has one).")

    @field_validator("configurations")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("name one configuration or more")
        if len(set(v)) != len(v):
            raise ValueError("a configuration is named twice")
        return v


class ZipfSpec(_Strict):
    """Requests drawn from a pool of distinct eval texts, the text of rank r with weight 1/r**exponent."""

    pool: PositiveInt = Field(500, description="Distinct texts (the eval split's, in a seeded order; fewer when it has fewer).")
    exponent: float = Field(1.0, ge=0.0, le=4.0, description="Zipf exponent: 0 draws uniformly, larger repeats the top texts more.")
    seed: NonNegativeInt = Field(0, description="Seed of the pool's order and of the draws.")


class TrafficSpec(_Strict):
    """The traffic the plan is sized for, and the requests the load sends: Zipf draws over
    eval texts, or a request log replayed line after line."""

    peak_qps: PositiveFloat = Field(100.0, description="Requests per second at the daily peak.")
    mean_qps: PositiveFloat = Field(40.0, description="Requests per second over the whole day.")
    peak_hours_per_day: float = Field(6.0, gt=0.0, le=24.0, description="Hours a day at the peak; the rest of the "
                                      "day runs at the rate that makes the mean.")
    zipf: ZipfSpec = Field(default_factory=ZipfSpec, description="The repetition model of the requests.")
    log: str | None = Field(None, description="A request log to replay instead (JSON Lines, one "
                            "`{\"timestamp\": seconds, \"text\": ...}` a line), relative to the recipe.")

    @model_validator(mode="after")
    def _consistent(self):
        if self.log is not None and "zipf" in self.model_fields_set:
            raise ValueError("give `log` or `zipf`, not both")
        if self.mean_qps > self.peak_qps:
            raise ValueError(f"mean_qps {self.mean_qps:g} exceeds peak_qps {self.peak_qps:g}; the mean is at most the peak")
        if self.peak_qps * self.peak_hours_per_day > self.mean_qps * 24.0 * (1 + 1e-9):
            raise ValueError(f"peak_qps {self.peak_qps:g} for {self.peak_hours_per_day:g} h already exceeds a daily "
                             f"mean of {self.mean_qps:g}; raise mean_qps or shorten peak_hours_per_day")
        return self

    @property
    def offpeak_qps(self) -> float:
        """The rate outside the peak hours that makes the daily mean."""
        h = self.peak_hours_per_day
        if h >= 24.0:
            return self.peak_qps
        return max(0.0, (24.0 * self.mean_qps - self.peak_qps * h) / (24.0 - h))


class Price(_Strict):
    usd_per_hour: PositiveFloat = Field(description="USD per instance-hour.")
    source: str = Field(min_length=1, description="Where the price comes from (printed with the plan).")


class Discount(_Strict):
    discount: float = Field(ge=0.0, lt=1.0, description="Fraction off the on-demand price.")
    source: str = Field(min_length=1, description="Where the discount comes from (printed with the plan).")


class PricingSpec(_Strict):
    """What an instance costs: on demand, reserved (the base load, all day) and spot (the
    burst above it, during the peak hours). One instance is the machine the load ran on."""

    instance: str = Field("c6i.large", description="The instance type the prices are for (2 vCPU, as the measuring machine should be).")
    on_demand: Price = Field(default_factory=lambda: Price(
        usd_per_hour=0.085, source="AWS EC2 on-demand list price, c6i.large Linux, us-east-1; verify before relying on it"))
    reserved: Discount = Field(default_factory=lambda: Discount(
        discount=0.37, source="AWS EC2 1-year standard reserved instance, no upfront, against on demand; verify"))
    spot: Discount = Field(default_factory=lambda: Discount(
        discount=0.60, source="AWS EC2 spot price history, typical saving for c6i in us-east-1; it varies by the hour"))
    hours_per_month: PositiveFloat = Field(730.0, description="Hours billed in a month (8760 / 12).")


class ServingSpec(_Strict):
    server: ServerSpec = Field(default_factory=ServerSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    limits: LimitSpec = Field(default_factory=LimitSpec)
    load: LoadSpec = Field(default_factory=LoadSpec)
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    pricing: PricingSpec = Field(default_factory=PricingSpec)


# --- a causal LM under load (llama-server, continuous batching) -----------------------


LM_CONFIGURATIONS = ("unbatched", "batched")


class LmServingSpec(_Strict):
    """A causal-LM recipe's `serving_lm:` block: the GGUF variant behind llama.cpp's
    llama-server, once with `parallel` slots batched continuously (`batched`) and once with
    one slot, a request at a time (`unbatched`), each driven by MLPerf LoadGen's server
    scenario with token latencies. A run is VALID when the `percentile` time to first token
    and time per output token meet `ttft_ms` and `tpot_ms` over enough queries (LoadGen's
    rule, early stopping included). The highest VALID QPS is searched per configuration. The
    defaults keep the whole measurement to a few minutes on a 2-core CPU."""

    ttft_ms: PositiveFloat = Field(2000.0, le=600_000, description="SLO on the time to first token (prefill and "
                                   "queueing), in ms, at `percentile` (LoadGen's ttft_latency).")
    tpot_ms: PositiveFloat = Field(200.0, le=60_000, description="SLO on the time per output token after the first, "
                                   "in ms, at `percentile` (LoadGen's tpot_latency).")
    percentile: Literal[0.9, 0.95, 0.97, 0.99, 0.999] = Field(
        0.9, description="The percentile both SLOs are on (one LoadGen logs). At 0.9 LoadGen's early stopping needs "
        "44 queries in a run with none over (459 at 0.99): runs are lengthened to that, and p99 is reported beside it.")
    parallel: PositiveInt = Field(4, ge=2, le=256, description="llama-server slots (`--parallel`) of the batched "
                                  "configuration: requests decoded together, continuously batched.")
    ctx_per_slot: PositiveInt = Field(1024, ge=64, le=131_072, description="KV-cache tokens per slot (prompt and "
                                      "output); llama-server gets parallel x this (`--ctx-size`).")
    threads: PositiveInt | None = Field(None, le=256, description="llama-server's threads (`--threads`); "
                                        "None: the CPUs this process may use.")
    max_tokens: PositiveInt = Field(32, ge=2, le=4096, description="Output tokens of every request (`n_predict`, "
                                    "eos ignored), so every request's token count is the same.")
    prompts: PositiveInt = Field(32, le=10_000, description="Distinct prompts (the recipe's timing dialogues, chat "
                                 "templated by llama-server), drawn by LoadGen in its seeded order.")
    min_duration_s: PositiveFloat = Field(10.0, le=3600, description="LoadGen's min_duration: the shortest scheduled run.")
    min_queries: PositiveInt = Field(32, le=100_000, description="LoadGen's min_query_count (raised to what early "
                                     "stopping needs at `percentile`).")
    max_run_s: PositiveFloat = Field(90.0, le=3600, description="The longest a run may be scheduled: no load so low "
                                     "that the queries a run needs would take longer is offered.")
    start_qps: PositiveFloat | None = Field(None, description="The first offered load of the search; None: from "
                                            "the warm-up (the slots' count over one request's latency, halved).")
    max_qps: PositiveFloat = Field(1000.0, description="The search offers no more than this.")
    growth: float = Field(2.0, gt=1.0, le=16.0, description="Factor between offered loads while bracketing.")
    resolution: float = Field(0.25, gt=0.0, description="Bisection stops once the invalid bound is within this "
                              "fraction of the valid one.")
    max_runs: PositiveInt = Field(4, le=64, description="LoadGen runs per configuration, bracketing and bisection together.")
    timeout_s: PositiveFloat = Field(120.0, le=3600, description="A request unanswered this long counts as failed.")
    seed: NonNegativeInt = Field(0, description="LoadGen's schedule and sample-order seeds (each run adds its number).")
    configurations: list[Literal["unbatched", "batched"]] = Field(
        default_factory=lambda: list(LM_CONFIGURATIONS),
        description="What is measured, one after another: `unbatched` (one slot: a request at a time, the "
        "reference), `batched` (`parallel` slots, continuous batching).")
    pricing: PricingSpec = Field(default_factory=PricingSpec, description="The instance the $ per 1M output "
                                 "tokens at the SLO is priced on (its on-demand price; one instance is this machine).")

    @field_validator("configurations")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("name one configuration or more")
        if len(set(v)) != len(v):
            raise ValueError("a configuration is named twice")
        return v

    @property
    def percentile_point(self) -> float:
        """`percentile` as LoadGen's log names it (0.9 -> 90.0)."""
        return round(self.percentile * 100.0, 2)
