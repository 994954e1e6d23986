"""The typed records of a measured load and of the capacity plan made from it: what
`compress load` writes (serving/serving.json, report.json's `serving` block) and what the
decision and the reports read. Pydantic only, so the decision layer and the reports can
import them without loading LoadGen, Ray or a model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

ConfigName = Literal["reference", "unbatched", "batched", "batched_cache", "cascade"]
Lever = Literal["variant", "batching", "cache", "cascade", "pricing"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TrafficInfo(Record):
    """The requests the load sent: how they were drawn, and how often a text repeats."""

    kind: Literal["zipf", "log"]
    distinct_texts: int  # texts in the pool (zipf) or in the log
    exponent: float | None = None
    seed: int | None = None
    log: str | None = None
    log_requests: int | None = None
    log_mean_qps: float | None = None  # the log's own rates, from its timestamps
    log_peak_qps: float | None = None
    # The share of requests whose text was asked before, over `requests` requests: from the
    # model's probabilities (zipf) and as counted on the requests sent to the first configuration.
    requests: int = 0
    duplicate_share_theory: float | None = None
    duplicate_share_sent: float | None = None


class LoadRun(Record):
    """One LoadGen run of the server scenario at one offered load."""

    target_qps: float
    valid: bool  # LoadGen's VALID, and no request failed
    loadgen_valid: bool
    invalid_reason: str | None = None
    queries: int
    failed: int = 0  # HTTP errors and timeouts (LoadGen counts them as answered)
    overlatency: int = 0  # queries over the SLO (LoadGen's count)
    scheduled_qps: float | None = None
    completed_qps: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    goodput_qps: float | None = None  # answered requests within the SLO per second of the run
    seconds: float
    cpu_utilisation: float | None = None  # server processes' CPU time over the run's wall time x cores
    log_dir: str  # relative to the run folder: mlperf_log_summary.txt and mlperf_log_detail.txt


class Search(Record):
    """The bracket-then-bisect search for the highest VALID QPS: the offered loads in the
    order they were tried."""

    tried: list[tuple[float, bool]]
    max_valid_qps: float | None  # None: even the lowest load tried was not valid
    lowest_invalid_qps: float | None  # None: the highest load tried was valid (capacity not reached)


class ServerFigures(Record):
    """The server's own counters over a configuration's runs (its snapshot, after minus before)."""

    requests: dict[str, int] = {}  # by HTTP status
    batch_sizes: dict[int, int] = {}  # batch size -> batches run
    mean_batch_size: float | None = None
    padding_waste: float | None = None  # share of padded token positions in the batches run, where known
    cache_hits: int | None = None
    cache_misses: int | None = None
    cache_hit_rate: float | None = None
    routed_share: float | None = None  # cascade: share sent on to the large member
    replicas: int | None = None


class ConfigFigures(Record):
    """One configuration served and measured: its search, its curve and the server's counters."""

    name: ConfigName
    variant: str
    fingerprint: str | None = None
    max_batch_size: int | None = None
    cache: bool = False
    runs: list[LoadRun] = []
    search: Search | None = None
    max_valid_qps: float | None = None
    knee_qps: float | None = None  # the highest load whose p99 stays within twice the lowest load's
    goodput_qps: float | None = None  # at the highest valid load
    cpu_utilisation: float | None = None  # at the highest valid load
    server: ServerFigures | None = None
    duplicate_share_sent: float | None = None  # of the requests this configuration received
    seconds: float = 0.0
    error: str | None = None  # served or measured it could not be (the rest still are)
    notes: list[str] = []


class PlanRow(Record):
    """The instances one configuration needs at the SLO for the traffic, and their cost."""

    config: ConfigName
    variant: str
    max_valid_qps: float
    instances_peak: int
    instances_base: int  # for the off-peak rate, all day: reserved
    instances_burst: int  # the rest, during the peak hours: spot
    on_demand_usd_month: float  # base all day and burst at the peak, both on demand
    mixed_usd_month: float  # base reserved, burst on spot


class WaterfallStep(Record):
    """What one lever saved, in $/month, from the configuration before it."""

    lever: str  # a Lever, or several joined by " + " where the configurations between have no plan
    before: str  # the configuration (or pricing) it starts from
    after: str
    usd_month_before: float
    usd_month_after: float
    saved_usd_month: float  # negative: the lever costs more here
    pulled: bool = True  # False: it would cost more, so the chain goes on without it


class PricingInfo(Record):
    instance: str
    on_demand_usd_per_hour: float
    on_demand_source: str
    reserved_discount: float
    reserved_source: str
    spot_discount: float
    spot_source: str
    hours_per_month: float


class CostPlan(Record):
    """The capacity and cost plan for the recipe's traffic at the SLO."""

    peak_qps: float
    mean_qps: float
    offpeak_qps: float
    peak_hours_per_day: float
    pricing: PricingInfo
    rows: list[PlanRow] = []
    waterfall: list[WaterfallStep] = []
    start_usd_month: float | None = None  # the waterfall's first bar: the unbatched baseline on demand
    end_usd_month: float | None = None
    notes: list[str] = []


class ServingReport(Record):
    """report.json's `serving` block (and serving/serving.json): the load and the plan."""

    slo_ms: float
    percentile: float
    variant: str  # the variant served (its configurations: unbatched, batched, batched_cache)
    traffic: TrafficInfo
    configs: list[ConfigFigures] = []
    plan: CostPlan | None = None
    machine: str = ""  # the machine the load ran on: one instance
    seconds: float = 0.0
    notes: list[str] = []

    def config(self, name: str) -> ConfigFigures | None:
        return next((c for c in self.configs if c.name == name), None)

    def monthly_cost(self, variant: str) -> float | None:
        """The cheapest plan for a served variant ($/month, reserved base and spot burst)."""
        if self.plan is None:
            return None
        costs = [r.mixed_usd_month for r in self.plan.rows if r.variant == variant]
        return min(costs) if costs else None


# --- a causal LM under load: llama-server, LoadGen with token latencies -------------------

LmConfigName = Literal["unbatched", "batched"]


class TokenRun(Record):
    """One LoadGen server-scenario run with token latencies at one offered load: each query
    one streamed completion of `max_tokens` tokens."""

    target_qps: float
    valid: bool  # LoadGen's VALID (TTFT and TPOT within their SLOs), and no request failed
    loadgen_valid: bool
    invalid_reason: str | None = None
    queries: int
    failed: int = 0  # HTTP errors, timeouts and short answers (LoadGen counts them as answered)
    scheduled_qps: float | None = None
    completed_qps: float | None = None
    output_tokens_per_s: float | None = None  # LoadGen's completed tokens per second
    ttft_p50_ms: float | None = None
    ttft_at_percentile_ms: float | None = None  # at the SLOs' percentile: what LoadGen judges
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_at_percentile_ms: float | None = None
    tpot_p99_ms: float | None = None
    latency_p50_ms: float | None = None  # the whole request
    latency_p99_ms: float | None = None
    early_stopping_ttft: str | None = None
    early_stopping_tpot: str | None = None
    mean_prompt_tokens: float | None = None  # as llama-server tokenized them
    mean_output_tokens: float | None = None
    seconds: float
    cpu_utilisation: float | None = None  # llama-server's CPU time over the run's wall time x cores
    log_dir: str  # mlperf_log_summary.txt and mlperf_log_detail.txt, relative to the run folder


class LmConfigFigures(Record):
    """One llama-server configuration searched: its runs and its figures at the highest valid load."""

    name: LmConfigName
    parallel: int  # llama-server slots
    runs: list[TokenRun] = []
    search: Search | None = None
    max_valid_qps: float | None = None
    output_tokens_per_s: float | None = None  # at the highest valid load
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    usd_per_1m_output_tokens: float | None = None  # one instance at the highest valid load, on demand
    alone_latency_ms: float | None = None  # one request with the server otherwise idle (the warm-up)
    seconds: float = 0.0
    error: str | None = None
    notes: list[str] = []


class LmServingReport(Record):
    """serving_lm/serving_lm.json: a causal LM's GGUF variant under load, a request at a time
    and batched continuously."""

    variant: str
    gguf: str
    engine: str  # llama-server's --version line
    ttft_ms: float
    tpot_ms: float
    percentile: float
    max_tokens: int
    prompts: int
    prompt_source: str
    threads: int
    ctx_per_slot: int
    instance: str
    usd_per_hour: float
    price_source: str
    machine: str = ""
    configs: list[LmConfigFigures] = []
    batching_gain: float | None = None  # batched over unbatched highest valid QPS
    seconds: float = 0.0
    notes: list[str] = []

    def config(self, name: str) -> LmConfigFigures | None:
        return next((c for c in self.configs if c.name == name), None)
