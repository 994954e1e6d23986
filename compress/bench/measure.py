"""The benchmark's typed records: the job a worker process is given (written by
compress/bench/benchmark.py with model_dump_json, read by compress/bench/worker.py with
model_validate_json) and what it returns (a Measurement, or the timings of a later round).

Measurements are also the benchmark cache (bench/<id>.<device>.json, sealed): a cached
file is read back through `Measurement`, so a file of another shape (a renamed key, a
missing figure) is measured again, never a KeyError further on.

Serialised with `dump()`: by alias and without the fields that were never set, so a
measurement's JSON has exactly the keys its producer gave it. Code reads the task's quality
figure as `quality`; its JSON key is `accuracy`, the name bench/*.json and report.json
(schema 1 and 2) give it. A task whose metric is not accuracy (perplexity) is to write it
under a key of its own, with a new schema_version and benchmark.METHOD.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from compress.tasks.causal_lm.records import LMFigures, LMSpec
from compress.core.task import DEFAULT_TASK


class Record(BaseModel):
    """A typed record of the benchmark, the decision and the reports: unknown keys refused;
    written by alias and without the fields never set, so a record's JSON keeps exactly the
    keys it always had (a null where a figure is missing, no key where a kind of record has
    none)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        """The record as its JSON object (python values), keys as they are written."""
        return self.model_dump(by_alias=True, exclude_unset=True)

    def dump_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_unset=True)

    def unset(self, name: str) -> None:
        """Leaves field `name` out of the record's JSON again (a figure folded into others)."""
        setattr(self, name, None)
        self.__pydantic_fields_set__.discard(name)


class JobOptions(Record):
    cuda_dtype: str = "fp32"
    trust_remote_code: bool = False


class PairRef(Record):
    """The reference a later round times alternately with the variant (the baseline)."""

    format: str
    path: str
    options: JobOptions = Field(default_factory=JobOptions)


class BenchJob(Record):
    """One worker process's job: a variant, a device and the benchmark settings."""

    format: str
    path: str
    device: str
    threads: int
    batch_sizes: list[int]
    max_length: int
    warmup: int
    max_latency_examples: int | None = None
    latency_repeats: int = 1
    eval_file: str
    options: JobOptions = Field(default_factory=JobOptions)
    task: str = DEFAULT_TASK
    lm: LMSpec | None = None  # causal LMs: what the variant is scored and timed on
    # A later round: the batch-1 timings alone, alternately with `pair` when given.
    latency_only: bool = False
    pair: PairRef | None = None
    # Progress lines only (not part of the cache key): who is measured, how often to say so.
    label: str = ""
    progress_seconds: float = 30.0

    def cache_identity(self) -> dict[str, Any]:
        """What of the job enters the measurement's cache key: every setting that changes a
        figure (not where the files are, nor how progress is shown). The default task is left
        out, so that measurements cached before jobs named their task stay valid."""
        out = self.model_dump(include={"format", "device", "threads", "batch_sizes", "max_length", "warmup",
                                       "max_latency_examples", "latency_repeats", "options"})
        if self.task != DEFAULT_TASK:
            out["task"] = self.task
        if self.lm is not None:
            out["lm"] = self.lm.model_dump(mode="json")
        return out


class Percentiles(Record):
    """Latencies in ms: p50, p95, p99, their mean and count."""

    p50: float
    p95: float
    p99: float
    mean: float | None = None
    n: int | None = None


class BatchFigures(Record):
    """One batch size's pass over the eval split."""

    batch_size: int
    throughput: float  # sequences per second
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    padding_waste: float | None = None
    quality: float | None = Field(None, alias="accuracy")  # over the whole eval split, as this batch size runs it
    routed_share: float | None = None  # a cascade: share of the inputs sent on to its large member


class PairedSpeedup(Record):
    reference: str
    rounds: list[float] = []
    speedup: float


class Measurement(Record):
    """One variant on one device. `ok` False: `error` says why, and no figure is set."""

    ok: bool
    error: str | None = None
    device: str | None = None
    threads: int | None = None
    load_seconds: float | None = None
    size_bytes: int | float | None = None
    params: int | None = None
    memory_bytes: int | float | None = None
    peak_memory_bytes: int | float | None = None
    quality: float | None = Field(None, alias="accuracy")  # the task's metric (classification: accuracy, %)
    macro_f1: float | None = None
    predictions: list[int] | None = None  # per eval example, for paired comparisons
    latency_ms: Percentiles | None = None  # batch 1
    sentence_ms: list[float] | None = None  # [n_lat] batch-1 latency per timed sentence, until rounds are merged
    batches: list[BatchFigures] | None = None
    notes: list[str] = []
    effective_device: str | None = None
    routed_share: float | None = None
    # A cascade: its large member alone, timed in the same process, each batch size's passes
    # alternating with the cascade's (batch sizes above 1).
    large_alone: list[BatchFigures] | None = None
    phase_seconds: dict[str, float] = {}  # where the measurement's time went (report.json `timing`)
    wall_seconds: float | None = None  # process start included
    latency_rounds_p50: list[float] | None = None  # each round's batch-1 p50
    paired_speedup: PairedSpeedup | None = None
    key: str | None = None  # the cache key it was measured under
    lm: LMFigures | None = None  # causal LMs: every eval, generation timings per batch size, the memory plan


class RoundTimes(Record):
    """A later round's worker: batch-1 timings per sentence of the selection, and the
    reference's when paired."""

    ok: bool
    error: str | None = None
    sentence_ms: list[float] = []
    pair_sentence_ms: list[float] | None = None
    phase_seconds: dict[str, float] = {}
    wall_seconds: float | None = None
