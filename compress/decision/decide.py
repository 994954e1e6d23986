"""From measurements to a decision: quality deltas with paired bootstrap intervals, the
cost of each variant at its best operating point, the budget checks, and the pick.

Pure functions over typed records (Measurement in, Row and Decision out), so that
`compress report` and `compress gate` can rerun them from a saved report.json. The quality
figure is the task's metric (compress/tasks: accuracy for sequence classification); rows
keep it as `quality`, which report.json names after the metric (`accuracy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from compress.core.errors import EXIT_BUDGET, EXIT_OK
from compress.formats import RUNTIMES
from compress.tasks.causal_lm.records import MemoryPlan, Roofline
from compress.bench.measure import BatchFigures, Measurement, Percentiles, Record
from compress.recipe.schema import BenchmarkSpec, BudgetSpec, PriceSpec
from compress.core.stats import paired_bootstrap  # noqa: F401 - also read from here by eval scripts and tests
from compress.core.task import DEFAULT_TASK, Metric, get_task

if TYPE_CHECKING:  # pragma: no cover
    from compress.core.task import Task

# min_monthly_cost: the serving plan's $/month at the SLO (compress/serving/plan.py), for served variants only.
OBJECTIVE_KEY = {"min_cost": "usd_per_1k", "min_latency": "p95_ms", "min_size": "size_mb",
                 "min_monthly_cost": "usd_per_month"}


class Variant(Record):
    """What the runner knows of a benchmarked variant before it is measured."""

    id: str
    stage: str | None = None
    format: str
    source: str | None = None
    fingerprint: str | None = None
    not_smaller: str | None = None  # a compressing stage's own word that its output is no smaller
    refs: dict[str, str] | None = None  # the other variants it reads (a cascade's large member)


class Check(Record):
    """One budget check of a candidate: pass | fail | skipped (no such limit) | error (not measured)."""

    name: str
    status: Literal["pass", "fail", "skipped", "error"]
    message: str


class RuntimeComparison(Record):
    """An OpenVINO row against an onnxruntime sibling (same model, same precision)."""

    id: str
    runtime: str
    delta: float
    delta_ci95: tuple[float, float]
    speedup_b1: float
    paired: bool
    speedup_b1_rounds: list[float] | None = None
    throughput_ratio: dict[str, float] = {}


class Member(Record):
    id: str
    quality: float | None = Field(None, alias="accuracy")
    usd_per_1k: float | None = None


class EvalRow(Record):
    """One quality eval of a causal LM against the baseline's: perplexity's delta is its
    relative increase in percent; accuracies' and ROUGE's are points."""

    name: str
    metric: str
    value: float
    delta: float | None = None
    delta_ci95: tuple[float, float] | None = None
    secondary: dict[str, float] = {}
    secondary_delta: dict[str, float] = {}
    secondary_ci95: dict[str, tuple[float, float]] = {}
    items: int = 0
    protocol: str = ""


class LMRow(Record):
    """What a causal LM's row adds: per-eval quality, generation speed, cost per token, memory."""

    ttft_ms: dict[str, float]  # batch 1: p50, p95, p99, mean
    tpot_ms: dict[str, float]  # batch 1, per output token
    decode_tokens_per_s: dict[str, float]  # {batch size: output tokens/s}
    prefill_tokens_per_s: dict[str, float]
    usd_per_1m_tokens: float | None = None  # at the best decode throughput and the price per hour
    evals: list[EvalRow] = []
    memory_plan: MemoryPlan | None = None
    greedy_match: float | None = None  # share of timing prompts whose greedy continuation equals the baseline's
    peak_rss_mb: float | None = None
    roofline: Roofline | None = None


class Row(Variant):
    """One variant (its fields first, in report.json's order) on one device: its
    measurement's figures, the comparisons, the verdict."""

    runtime: str | None = None
    device: str
    ok: bool
    notes: list[str] = []
    error: str | None = None
    quality: float | None = Field(None, alias="accuracy")  # the task's metric
    macro_f1: float | None = None
    size_mb: float | None = None
    params: int | None = None
    memory_mb: float | None = None
    peak_memory_mb: float | None = None
    latency_ms: Percentiles | None = None  # batch 1: p50, p95, p99
    latency_rounds_p50: list[float] | None = None  # each round's p50; latency_ms merges them
    p95_ms: float | None = None
    throughput: dict[str, float] | None = None  # {batch size: sequences/s}
    batches: list[BatchFigures] | None = None
    operating_point: BatchFigures | None = None
    price: PriceSpec | None = None
    usd_per_1k: float | None = None
    effective_device: str | None = None
    load_seconds: float | None = None
    routed_share: float | None = None
    delta: float | None = None  # quality minus the baseline's, in the metric's unit
    delta_ci95: tuple[float, float] | None = None
    speedup_vs_baseline: float | None = None
    paired_vs_baseline: bool | None = None
    speedup_vs_input: float | None = None
    paired_vs_input: bool | None = None
    vs_runtime: list[RuntimeComparison] | None = None
    members: dict[str, Member | None] | None = None
    # A cascade: its large member's $/1K timed alone in the cascade's own process, passes
    # alternating with the cascade's, and the cascade's $/1K over it (over the large member's
    # own row when that figure is missing; `cost_vs_large_paired` says which).
    large_alone_usd_per_1k: float | None = None
    cost_vs_large: float | None = None
    cost_vs_large_paired: bool | None = None
    # Rejected by the interval gate (gate_on ci_lower) with its point estimate within the
    # budget: the eval split size at which the interval would clear the budget, were the
    # delta and its per-example spread the same there (stats.examples_to_clear).
    examples_to_pass: int | None = None
    # Served under load (the recipe's `serving:` block): the cheapest capacity plan's $/month at
    # the SLO for the recipe's traffic, reserved base and spot burst (report.json `serving.plan`).
    usd_per_month: float | None = None
    verdict: str | None = None
    reasons: list[str] = []
    checks: list[Check] | None = None
    lm: LMRow | None = None  # causal LMs
    # Per-example scores [N] on the eval split (the bootstrap's resampling unit), in memory
    # only: the tie-break compares tied variants with a paired interval (pick). Not written.
    # A tuple, not an array: rows compare with == (`r in passing`), private fields included.
    _scores: tuple[float, ...] | None = PrivateAttr(default=None)

    def figure(self, key: str) -> float | None:
        """An objective's figure (OBJECTIVE_KEY): usd_per_1k, p95_ms, size_mb or usd_per_month."""
        return getattr(self, key)


class BestFailed(Record):
    id: str
    quality: float | None = Field(None, alias="accuracy")
    delta: float | None = None
    p95_ms: float | None = None
    size_mb: float | None = None
    usd_per_1k: float | None = None
    reasons: list[str] = []


class PickShare(Record):
    """One outcome of the decision replayed on resamples of the eval split, and how often it came out."""

    selected: str | None  # None: no variant deployed
    share: float


class Decision(Record):
    device: str
    objective: str
    selected: str | None
    tied: list[str] = []
    tie_tolerance: float | None = None
    best_failed: BestFailed | None = None
    too_few_eval_examples: bool = False
    exit_code: int = EXIT_BUDGET
    notes: list[str] = []
    # The decision replayed on bootstrap resamples of the eval split (`stability`), most
    # frequent outcome first; absent where the task's metric is not the mean of per-example
    # scores (causal LMs: perplexity) or rows carry none.
    stability: list[PickShare] | None = None
    stability_resamples: int | None = None


class Policy(BaseModel):
    """What the decision reads of the recipe: the budget, the benchmark's prices and
    bootstrap settings, and the task."""

    model_config = ConfigDict(extra="forbid")

    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    benchmark: BenchmarkSpec = Field(default_factory=BenchmarkSpec)
    task: str = DEFAULT_TASK

    @property
    def metric(self) -> Metric:
        return get_task(self.task).metric


def operating_point(batches: list[BatchFigures], slo_ms: float | None) -> BatchFigures | None:
    """The cheapest operating point: the batch size with the best throughput (cost per
    inference is price / throughput) whose p95 batch latency meets the SLO; without an SLO,
    the best throughput. Ties go to the smaller batch (lower latency). None: no batch size
    meets the SLO."""
    ok = [b for b in batches if b.throughput > 0 and (slo_ms is None or (b.p95_ms is not None and b.p95_ms <= slo_ms))]
    return max(ok, key=lambda b: (b.throughput, -b.batch_size)) if ok else None


def usd_per_1k(usd_per_hour: float, throughput: float) -> float | None:
    """USD per 1,000 inferences on an instance billed per hour, running at `throughput`
    sequences per second all the time (None when nothing was measured)."""
    if throughput <= 0:
        return None
    return usd_per_hour / 3600.0 / throughput * 1000.0


def build_rows(
    variants: list[Variant | dict], results: dict[tuple[str, str], Measurement], targets: np.ndarray, policy: Policy
) -> list[Row]:
    """One row per variant and device. `targets` [N]: the eval split's (class ids)."""
    task = get_task(policy.task)
    metric = task.metric
    budget, bench = policy.budget, policy.benchmark
    base_id = budget.baseline
    metas = [Variant.model_validate(v) for v in variants]
    rows: list[Row] = []
    for device in dict.fromkeys(d for (_, d) in results):
        base = results.get((base_id, device))
        base_scores = _scores(task, base, targets) if base is not None and base.ok else None
        for v in metas:
            r = results.get((v.id, device))
            if r is None:
                continue
            row = Row(**v.dump(), runtime=RUNTIMES.get(v.format, v.format), device=device, ok=bool(r.ok),
                      notes=list(r.notes))
            if not r.ok:
                row.error = r.error or "unknown error"
                rows.append(row)
                continue
            assert r.latency_ms is not None and r.batches is not None and r.size_bytes is not None
            price = bench.prices.get(device)
            point = operating_point(r.batches, budget.latency_p95_ms)
            row.quality = r.quality
            row.macro_f1 = r.macro_f1
            row.size_mb = r.size_bytes / 1e6
            row.params = r.params
            row.memory_mb = (r.memory_bytes / 1e6) if r.memory_bytes else None
            row.peak_memory_mb = (r.peak_memory_bytes / 1e6) if r.peak_memory_bytes else None
            row.latency_ms = Percentiles(p50=r.latency_ms.p50, p95=r.latency_ms.p95, p99=r.latency_ms.p99)
            row.latency_rounds_p50 = r.latency_rounds_p50  # each round's p50; latency_ms merges them
            row.p95_ms = r.latency_ms.p95
            row.throughput = {str(b.batch_size): b.throughput for b in r.batches}
            row.batches = r.batches
            row.operating_point = point
            row.price = price
            row.usd_per_1k = usd_per_1k(price.usd_per_hour, point.throughput) if price and point else None
            row.effective_device = r.effective_device or device
            row.load_seconds = r.load_seconds
            by_batch = {b.batch_size: b.quality for b in r.batches if b.quality is not None}
            if len(set(by_batch.values())) > 1:
                # Dynamic quantization scales activations over the whole padded batch, so a
                # sentence's label can depend on its neighbours: say so, with every figure.
                shown = ", ".join(f"batch {b} {a:.2f}{metric.unit}" for b, a in sorted(by_batch.items()))
                row.notes.append(f"{metric.name} depends on the batch it runs in ({shown}); the table scores "
                                 f"batch 1, one request at a time")
            if r.routed_share is not None:  # a cascade: share sent on to its large model
                row.routed_share = r.routed_share
                alone = operating_point(r.large_alone, budget.latency_p95_ms) if r.large_alone else None
                if price and alone:
                    row.large_alone_usd_per_1k = usd_per_1k(price.usd_per_hour, alone.throughput)
                if not (v.refs or {}).get("large"):  # else compare_members says it with the figures
                    row.notes.append(f"{r.routed_share:.0%} of the eval inputs went on to the large model")
            if base_scores is not None and base is not None and r.quality is not None and base.quality is not None:
                scores = _scores(task, r, targets)
                row._scores = tuple(scores.tolist())
                row.delta = task.delta(r.quality, base.quality)
                row.delta_ci95 = task.interval(base_scores, scores, bench.bootstrap_samples)
            if r.lm is not None:
                row.lm = lm_row(r, base if base is not None and base.ok else None, row, bench.bootstrap_samples)
            rows.append(row)

    # Speed-ups against the baseline and against the variant's own input ("real gain").
    # Where the benchmark timed the variant alternately with the baseline (paired rounds),
    # the speed-up against the baseline is theirs, and the one against the input is the
    # quotient of the two variants' paired speed-ups: (base/variant) / (base/input).
    # Otherwise both are ratios of the separately measured p50s.
    by_key = {(r.id, r.device): r for r in rows if r.ok}
    paired = {(vid, d): m.paired_speedup.speedup for (vid, d), m in results.items()
              if m.ok and m.paired_speedup is not None and m.paired_speedup.reference == base_id}
    for r in rows:
        if not r.ok:
            continue
        key = (r.id, r.device)
        for name, ref_id in (("vs_baseline", base_id), ("vs_input", r.source)):
            ref = by_key.get((ref_id, r.device)) if ref_id is not None else None
            if not ref or ref is r:
                speedup = None
            elif key in paired and (ref_id == base_id or (ref_id, r.device) in paired):
                speedup = paired[key] / paired.get((ref_id, r.device), 1.0)
                setattr(r, "paired_" + name, True)
            else:
                speedup = ref.latency_ms.p50 / r.latency_ms.p50
            setattr(r, "speedup_" + name, speedup)
        s = r.speedup_vs_input
        if s is not None and s < 1.0:
            r.notes.append(f"not faster than its input '{r.source}' at batch 1 ({s:.2f}x)")
        if r.not_smaller:  # the stage's own word (e.g. distill on ALBERT's shared layers)
            r.notes.append(f"not smaller than its input '{r.source}': {r.not_smaller}")
        if r.effective_device not in (None, r.device):
            r.notes.append(f"runs on {r.effective_device} although benchmarked on {r.device} (fallback)")
    _compare_runtimes(task, metas, rows, results, targets, bench.bootstrap_samples, paired)
    compare_members(rows, metric)
    return rows


def _scores(task: "Task", m: Measurement, targets: np.ndarray) -> np.ndarray:
    """The task's per-example scores [N] of a measurement (the bootstrap's resampling unit)."""
    return task.measurement_scores(m, targets)


def lm_row(m: Measurement, base: Measurement | None, row: Row, samples: int) -> LMRow:
    """A causal LM's figures for its row: every eval against the baseline's (perplexity as a
    relative increase in percent, accuracies and ROUGE in points, each with its paired
    bootstrap interval), generation speed per batch size, $ per 1M output tokens, the
    memory plan, and how often its greedy continuations match the baseline's."""
    assert m.lm is not None
    theirs = {e.name: e for e in base.lm.evals} if base is not None and base.lm is not None else {}
    evals = []
    for e in m.lm.evals:
        b = theirs.get(e.name)
        er = EvalRow(name=e.name, metric=e.metric, value=e.value, secondary=dict(e.secondary), items=e.items,
                     protocol=e.protocol)
        if b is not None and len(b.scores) == len(e.scores) and e.scores:
            mine, ref = np.asarray(e.scores), np.asarray(b.scores)
            if e.metric == "perplexity":  # per-window mean NLL: the ratio of perplexities is exp(mean difference)
                er.delta = 100.0 * (e.value / b.value - 1.0)
                er.delta_ci95 = get_task("causal-lm").interval(ref, mine, samples)
            else:  # per-item 0/1 or F1 in [0, 1]: differences in points
                er.delta = e.value - b.value
                er.delta_ci95 = get_task("causal-lm").points_interval(ref, mine, samples)
            for name, values in e.secondary_scores.items():
                ref2 = b.secondary_scores.get(name)
                if ref2 is not None and len(ref2) == len(values) and name in e.secondary and name in b.secondary:
                    er.secondary_delta[name] = e.secondary[name] - b.secondary[name]
                    er.secondary_ci95[name] = get_task("causal-lm").points_interval(ref2, values, samples)
        evals.append(er)
    gens = {str(g.batch_size): g for g in m.lm.generation}
    out = LMRow(
        ttft_ms=m.lm.ttft_ms, tpot_ms=m.lm.tpot_ms,
        decode_tokens_per_s={k: g.decode_tokens_per_s for k, g in gens.items()},
        prefill_tokens_per_s={k: g.prefill_tokens_per_s for k, g in gens.items()},
        evals=evals, memory_plan=m.lm.memory_plan,
        peak_rss_mb=m.lm.peak_rss_bytes / 1e6 if m.lm.peak_rss_bytes else None, roofline=m.lm.roofline,
    )
    if row.usd_per_1k is not None:  # throughput is output tokens/s: $ per 1K tokens, times 1000
        out.usd_per_1m_tokens = row.usd_per_1k * 1000.0
    if base is not None and base.lm is not None and base.lm.greedy_tokens and m.lm.greedy_tokens:
        pairs = list(zip(base.lm.greedy_tokens, m.lm.greedy_tokens))
        out.greedy_match = sum(a == b for a, b in pairs) / len(pairs)
    if m.lm.memory_plan is not None:
        spills = [t.name for t in m.lm.memory_plan.tiers if t.spills]
        if spills:
            row.notes.append(f"weights plus one full-context sequence do not fit {', '.join(spills)}: it would offload")
    return out


# Stages that change a model's runtime or graph but not what it computes (up to rounding),
# and those that quantize it: a variant's lineage through them says which variants of the
# other runtime are the same model at the same precision.
_CONVERSIONS = {"export_onnx", "optimize_onnx", "export_openvino"}
_QUANTIZATIONS = {"quantize_onnx", "quantize_openvino"}


def _lineage(vid: str, by_id: dict[str, Variant]) -> tuple[str | None, bool] | None:
    """(the model the variant was converted from, whether it was quantized on the way), for
    an ONNX or OpenVINO variant; None for any other."""
    v = by_id.get(vid)
    if v is None or v.format not in ("onnx", "openvino"):
        return None
    quantized = False
    source = None
    while v is not None and v.format in ("onnx", "openvino"):
        if v.stage not in _CONVERSIONS | _QUANTIZATIONS:
            return None  # a stage this comparison does not know
        quantized = quantized or v.stage in _QUANTIZATIONS
        source = v.source
        v = by_id.get(source) if source is not None else None
    return source, quantized


def _compare_runtimes(task: "Task", variants: list[Variant], rows: list[Row], results: dict[tuple[str, str], Measurement],
                      targets: np.ndarray, samples: int, paired: dict) -> None:
    """Compares every OpenVINO row with its onnxruntime siblings on the same device: the
    variants converted from the same model and quantized (or not) the same way (e.g. OpenVINO
    INT8 of the baseline and onnxruntime INT8 of the baseline). Adds `vs_runtime` to the row,
    and a note: the quality difference with its paired bootstrap interval, the batch-1
    speed ratio (from the paired rounds, as speed-ups against the input are: the quotient of
    the two variants' paired speed-ups, with its range over the rounds) and the throughput
    ratio at the largest batch size."""
    metric = task.metric
    by_id = {v.id: v for v in variants}
    lineage = {v.id: _lineage(v.id, by_id) for v in variants}
    by_key = {(r.id, r.device): r for r in rows if r.ok}
    for r in rows:
        if not r.ok or r.format != "openvino" or lineage.get(r.id) is None:
            continue
        siblings = [o for o in rows if o.ok and o.device == r.device and o.format == "onnx"
                    and lineage.get(o.id) == lineage[r.id]]
        for o in siblings:
            mine, theirs = results[(r.id, r.device)], results[(o.id, o.device)]
            key, other = (r.id, r.device), (o.id, o.device)
            entry = RuntimeComparison(
                id=o.id, runtime=o.runtime or o.format, delta=r.quality - o.quality,
                delta_ci95=task.interval(_scores(task, theirs, targets), _scores(task, mine, targets), samples),
                speedup_b1=0.0, paired=False,
            )
            if key in paired and other in paired:
                entry.speedup_b1 = paired[key] / paired[other]
                entry.paired = True
                a, b = (results[k].paired_speedup.rounds for k in (key, other))
                if len(a) == len(b) and a:  # round i of both: timed in the same benchmark round
                    entry.speedup_b1_rounds = [x / y for x, y in zip(a, b)]
            else:
                entry.speedup_b1 = by_key[other].latency_ms.p50 / r.latency_ms.p50
                entry.paired = False
            entry.throughput_ratio = {bs: t / o.throughput[bs] for bs, t in r.throughput.items()
                                      if o.throughput.get(bs)}
            r.vs_runtime = [*(r.vs_runtime or []), entry]
            lo, hi = entry.delta_ci95
            text = (f"vs {o.runtime} '{o.id}' (same model, same precision): {metric.name} "
                    f"{entry.delta:+.2f} {metric.delta_unit} [{lo:+.2f}, {hi:+.2f}]; batch 1 {entry.speedup_b1:.2f}x as fast")
            rounds = entry.speedup_b1_rounds
            if rounds:
                text += (f" (paired rounds {min(rounds):.2f}x to {max(rounds):.2f}x)" if len(rounds) > 1
                         else " (one paired round)")
            elif not entry.paired:
                text += " (separate p50s)"
            sizes = sorted(entry.throughput_ratio, key=int)
            if sizes and sizes[-1] != "1":
                text += f"; batch {sizes[-1]} throughput {entry.throughput_ratio[sizes[-1]]:.2f}x"
            r.notes.append(text)


def compare_members(rows: list[Row], metric: Metric | None = None) -> None:
    """A cascade's row against its two members' rows on the same device, in place: the
    share of eval inputs routed to the large member, and quality and $/1K beside each
    member's (`members`, and a note). The small member is the row's `source`, the large
    one its `refs.large`."""
    metric = metric or get_task().metric
    by_key = {(r.id, r.device): r for r in rows if r.ok}
    for r in rows:
        large_id = (r.refs or {}).get("large")
        if not r.ok or r.routed_share is None or not large_id:
            continue
        members = {role: by_key.get((vid, r.device)) for role, vid in (("small", r.source), ("large", large_id))}
        r.members = {role: None if m is None else Member(id=m.id, quality=m.quality, usd_per_1k=m.usd_per_1k)
                     for role, m in members.items()}
        small, large = members["small"], members["large"]
        fig = [f"{r.routed_share:.0%} of the eval inputs went on to '{large_id}'"]
        if small and large:
            fig.append(f"{metric.name} {r.quality:.2f} against {small.quality:.2f} ('{small.id}') and "
                       f"{large.quality:.2f} ('{large.id}')")
            costs = (r.usd_per_1k, small.usd_per_1k, large.usd_per_1k)
            if None not in costs:
                # The ratio that the cascade's cost target reads: over its large member timed
                # in the same minutes where measured, so a slower spell of the machine moves both
                # alike; else over that member's own row.
                r.cost_vs_large_paired = bool(r.large_alone_usd_per_1k)
                r.cost_vs_large = costs[0] / (r.large_alone_usd_per_1k or costs[2])
                ratio = f"{r.cost_vs_large:.2f}x the large member's"
                if r.cost_vs_large_paired:
                    ratio += (f" timed alone in the cascade's process, passes alternating; "
                              f"{costs[0] / costs[2]:.2f}x its own row's")
                fig.append(f"$/1K {costs[0]:.5f} against {costs[1]:.5f} and {costs[2]:.5f} ({ratio})")
        r.notes.append("; ".join(fig))


@dataclass
class _Deciding:
    """What every step of decide() reads: the policy resolved for this run's devices, and the
    notes the steps add to the decision."""

    policy: Policy
    device: str
    notes: list[str]
    intervals: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def start(cls, policy: Policy, available_devices: list[str]) -> "_Deciding":
        device, notes = policy.budget.device, []
        if device not in available_devices:
            notes.append(f"budget.device {device} was not benchmarked here; deciding on cpu")
            device = "cpu"
        return cls(policy, device, notes)

    @property
    def budget(self) -> BudgetSpec:
        return self.policy.budget

    @property
    def metric(self) -> Metric:
        return self.policy.metric

    @property
    def task(self) -> "Task":
        return get_task(self.policy.task)

    @property
    def key(self) -> str:
        return OBJECTIVE_KEY[self.budget.objective]

    @property
    def causal(self) -> bool:  # costs per 1M output tokens, not per 1K inferences
        return self.policy.task == "causal-lm"

    def what(self, key: str) -> str:
        return "$/1M tokens" if self.causal and key == "usd_per_1k" else _NAME[key]

    def fmt(self, key: str, value: float) -> str:
        return _fmt(key, value, self.causal)

    def baseline(self, rows: list[Row]) -> Row | None:
        return next((r for r in rows if r.id == self.budget.baseline and r.device == self.device and r.ok), None)

    def interval(self, a: Row, b: Row) -> tuple[float, float]:
        """The paired 95% interval of a's quality minus b's, over the same eval examples:
        bootstrapped once per pair (pick and then the tied losers' reasons ask for it)."""
        pair = (id(a), id(b))
        if pair not in self.intervals:
            self.intervals[pair] = self.task.interval(np.asarray(b._scores), np.asarray(a._scores),
                                                      self.policy.benchmark.bootstrap_samples)
        return self.intervals[pair]


def decide(rows: list[Row], policy: Policy, available_devices: list[str], eval_examples: int | None = None) -> Decision:
    """Marks every row of the deciding device with a verdict and reasons; returns the decision.
    `eval_examples`: the eval split's size; under budget.min_eval_examples no variant is
    deployed (exit 3): a handful of sentences cannot tell a variant within budget from one
    that is not (one sentence of one is a 0-point delta with the interval [0, 0])."""
    d = _Deciding.start(policy, available_devices)
    candidates, passing = _check_candidates(rows, d)
    # Paired intervals only where every passing row kept its per-example scores.
    compare = d.interval if passing and all(r._scores is not None for r in passing) else None
    selected, tied, tolerance = pick(passing, d.key, d.budget, d.metric, compare)
    _mark_verdicts(candidates, passing, selected, tied, tolerance, d, compare)
    selected, tied, thin = _hold_back_if_thin(selected, tied, eval_examples, d)
    _note_ties(selected, tied, tolerance, d, compare)
    _note_no_gain(rows, selected, d)
    best_failed = _closest_failure(candidates, selected, thin, d)
    return Decision(
        device=d.device,
        objective=d.budget.objective,
        selected=selected.id if selected else None,
        tied=[r.id for r in tied],
        tie_tolerance=tolerance,
        best_failed=best_failed,
        too_few_eval_examples=thin,
        exit_code=EXIT_OK if selected else EXIT_BUDGET,
        notes=d.notes,
    )


def _check_candidates(rows: list[Row], d: _Deciding) -> tuple[list[Row], list[Row]]:
    """Step 1: rows of other devices are reported and the baseline is the baseline; every
    other row of the deciding device gets its budget checks and reasons. Returns (the
    candidates, those within budget)."""
    # The baseline's scores size the eval split a rejected variant would need (interval gate only).
    base = d.baseline(rows) if d.budget.gate_on == "ci_lower" else None
    candidates, passing = [], []
    for r in rows:
        if r.device != d.device:
            r.verdict, r.reasons = "reported", []
            continue
        if r.id == d.budget.baseline:
            r.verdict, r.reasons = ("baseline", []) if r.ok else ("failed", [r.error or ""])
            continue
        r.checks = budget_checks(r, d.budget, d.metric)
        _interval_hint(r, base, d.task, d.budget.quality_limit(d.metric.name))
        if not r.ok:
            reasons = [f"benchmark failed: {r.error}"]
        else:
            reasons = [c.message for c in r.checks if c.status == "fail"]
            if r.figure(d.key) is None and d.key == "usd_per_month":
                reasons.append("no usd_per_month figure: not served under load (the serving block serves the "
                               "min_cost pick and the run's cascade)")
            elif r.figure(d.key) is None:
                reasons.append(f"no {d.key} figure (no price for {d.device}?)")
        r.reasons = reasons
        candidates.append(r)
        if not reasons:
            passing.append(r)
    return candidates, passing


def _tie_reason(selected: Row, r: Row, tied: list[Row], d: _Deciding,
                compare: "Callable[[Row, Row], tuple[float, float]] | None") -> str:
    """Why `selected` beat the tied variant r: quality beyond chance, or size."""
    metric, task = d.metric, d.task
    q = f"{selected.quality:.2f}{metric.unit} vs {r.quality:.2f}{metric.unit}"
    if compare is None:  # no per-example scores: the point figures decided
        if metric.is_better(selected.quality, r.quality):
            return f"{metric.better_words} ({q})"
        return f"smaller ({selected.size_mb:.1f} MB vs {r.size_mb:.1f} MB)"
    lo, hi = compare(selected, r)
    delta = f"{task.delta(selected.quality, r.quality):+.2f} {metric.delta_unit} [{lo:+.2f}, {hi:+.2f}]"
    if metric.beats((lo, hi)):
        return f"{metric.better_words} beyond chance ({q}, {delta})"
    beater = next((o for o in tied if o is not r and metric.beats(compare(o, r))), None)
    if beater is not None:
        blo, bhi = compare(beater, r)
        return (f"the smallest of the tied variants that none beats on {metric.name} beyond chance ('{beater.id}' "
                f"beats this one: {task.delta(beater.quality, r.quality):+.2f} {metric.delta_unit} "
                f"[{blo:+.2f}, {bhi:+.2f}])")
    size = (f"smaller ({selected.size_mb:.1f} MB vs {r.size_mb:.1f} MB)" if selected.size_mb < r.size_mb
            else f"as small ({selected.size_mb:.1f} MB)")
    return f"{size}, and the {metric.name} difference is within chance ({q}, {delta})"


def _mark_verdicts(candidates: list[Row], passing: list[Row], selected: Row | None, tied: list[Row],
                   tolerance: float, d: _Deciding, compare) -> None:
    """Step 2: selected, within budget (with why the selected one won) or rejected."""
    key = d.key
    for r in candidates:
        if r is selected:
            r.verdict = "selected"
        elif r in passing:
            assert selected is not None
            r.verdict = "within budget"
            if r in tied:
                why = _tie_reason(selected, r, tied, d, compare)
                if r is tied[0]:
                    r.reasons = [f"within budget and the best {d.what(key)} ({d.fmt(key, r.figure(key))}), but "
                                 f"'{selected.id}' is within {tolerance:.0%} of it and {why}"]
                else:
                    r.reasons = [f"within budget at {d.fmt(key, r.figure(key))}, within {tolerance:.0%} of the best "
                                 f"({d.fmt(key, tied[0].figure(key))}), but '{selected.id}' is {why}"]
            else:
                r.reasons = [f"within budget, but {d.fmt(key, r.figure(key))} vs {d.fmt(key, selected.figure(key))} "
                             f"for '{selected.id}'"]
        else:
            r.verdict = "rejected"


def _hold_back_if_thin(selected: Row | None, tied: list[Row], eval_examples: int | None,
                       d: _Deciding) -> tuple[Row | None, list[Row], bool]:
    """Step 3: under budget.min_eval_examples the pick is not deployed. Returns (selected,
    tied, whether the evidence was too thin)."""
    minimum = int(d.budget.min_eval_examples or 0)
    thin = selected is not None and eval_examples is not None and eval_examples < minimum
    if not thin:
        return selected, tied, False
    assert selected is not None
    d.notes.append(
        f"the evidence is too thin: the eval split has {eval_examples} sentence{'s' if eval_examples != 1 else ''}, "
        f"fewer than budget.min_eval_examples ({minimum}), so '{selected.id}' is not deployed; give a larger "
        f"eval split, or set budget.min_eval_examples lower to accept it"
    )
    selected.verdict = "within budget"
    selected.reasons = [f"within budget, but not deployed: {eval_examples} eval sentences are fewer than "
                        f"budget.min_eval_examples ({minimum})"]
    return None, [], True


def _note_ties(selected: Row | None, tied: list[Row], tolerance: float, d: _Deciding, compare) -> None:
    """Step 4: a note naming the variants tied on the objective and how the tie was broken."""
    if len(tied) <= 1:
        return
    assert selected is not None
    best, metric = tied[0], d.metric  # tied is ordered by the objective
    names = ", ".join(f"'{r.id}'" for r in tied)
    d.notes.append(
        f"{names} are within {tolerance:.0%} of the best {d.what(d.key)} ({d.fmt(d.key, best.figure(d.key))}, "
        f"'{best.id}'), closer than timings repeat between runs (budget.tie_tolerance): "
        + (f"the {metric.best_words} of them, '{selected.id}', is deployed" if compare is None else
           f"of those that none of them beats on {metric.name} beyond chance (a paired 95% interval that "
           f"excludes zero), the smallest, '{selected.id}', is deployed")
    )


def _note_no_gain(rows: list[Row], selected: Row | None, d: _Deciding) -> None:
    """Step 5: within budget is not the same as better. A variant can keep the quality and
    still cost more than the model it replaces (4-bit on a CPU dequantizes every matmul), or
    be no smaller than its input (shared layers): the selection stays (it answers "which
    compressed variant"), and the decision says so."""
    if selected is None:
        return
    key, base = d.key, d.baseline(rows)
    if base is not None and base.figure(key) is not None and selected.figure(key) >= base.figure(key):
        d.notes.append(
            f"'{selected.id}' is the best compressed variant within budget, but the baseline is no worse "
            f"on {d.budget.objective} ({d.fmt(key, selected.figure(key))} vs {d.fmt(key, base.figure(key))}): "
            "keeping the baseline is as good a choice here"
        )
    if selected.not_smaller:
        d.notes.append(f"'{selected.id}' is deployed, but it is not smaller than its input "
                       f"'{selected.source}': {selected.not_smaller}")


def _closest_failure(candidates: list[Row], selected: Row | None, thin: bool, d: _Deciding) -> BestFailed | None:
    """Step 6: with nothing deployed, the closest variant and why it failed."""
    if selected is not None:
        return None
    scored = [r for r in candidates if r.ok and r.delta is not None]
    if not scored:
        if not thin:
            d.notes.append("no compressed variant could be measured")
        return None
    metric = d.metric
    best = max(scored, key=lambda r: metric.key(r.delta))
    d.notes.append(
        f"no compressed variant is within budget; the closest is '{best.id}' "
        f"({best.delta:+.2f} {metric.delta_unit}: {'; '.join(best.reasons)})"
    )
    return BestFailed(id=best.id, quality=best.quality, delta=best.delta, p95_ms=best.p95_ms,
                      size_mb=best.size_mb, usd_per_1k=best.usd_per_1k, reasons=best.reasons)


def _interval_hint(r: Row, base: Row | None, task: "Task", max_drop: float) -> None:
    """A row the interval gate rejects while its point estimate is within the budget: how
    large an eval split would narrow the interval enough, were the delta and its per-example
    spread the same on more data (`examples_to_pass`, and a clause on the failed check and
    reason, which decide() builds from the checks after this). What "a larger eval split"
    means for this variant: whether the budget is a matter of more data or out of reach of
    any. `base`: None outside the interval gate."""
    if r.examples_to_pass is not None:  # a row decided before (a replay's copy): only set when it applies,
        r.examples_to_pass = None       # so report.json keeps omitting it elsewhere
    check = next((c for c in r.checks or [] if c.name == check_names(task.metric)[0]), None)
    if (check is None or check.status != "fail" or base is None or r.delta is None
            or r._scores is None or base._scores is None):
        return
    n = task.examples_to_clear(np.asarray(base._scores), np.asarray(r._scores), max_drop - task.metric.drop(r.delta))
    if n is None:
        return
    r.examples_to_pass = n
    check.message += (f" (the point, {r.delta:+.2f}, is within it: an eval split of about {n:,} examples, "
                      f"against {len(base._scores):,} here, would narrow the interval enough, were the delta the same there)")


def rescored(row: Row, scores: np.ndarray, base_scores: np.ndarray, task: "Task", samples: int,
             seed: int = 0) -> Row:
    """A copy of `row` scored on other per-example scores [N] (a resample of the eval split,
    another eval set), against the baseline's on the same examples [N]: its quality, its delta
    and the delta's paired interval recomputed, timings, sizes and costs kept. A shallow copy:
    decide() assigns verdicts, reasons and checks, it appends to none of them."""
    quality = float(np.mean(scores, dtype=np.float64) * task.scale)
    update: dict = {"quality": quality}
    if row.delta is not None:
        update["delta"] = task.delta(quality, float(np.mean(base_scores, dtype=np.float64) * task.scale))
        update["delta_ci95"] = task.interval(base_scores, scores, samples, seed=seed)
    copy = row.model_copy(update=update)
    copy._scores = tuple(np.asarray(scores).tolist())
    return copy


def stability(rows: list[Row], policy: Policy, available_devices: list[str], selected: str | None,
              eval_examples: int | None = None, resamples: int = 200, seed: int = 0) -> list[PickShare] | None:
    """How often `decide` deploys each variant when the eval split is redrawn: each of
    `resamples` bootstrap resamples draws N examples with replacement (the same ones for every
    variant: paired), recomputes every row's quality, delta and interval from its per-example
    scores (`rescored`), and reruns `decide` on those copies. Timings, sizes and costs stay as
    measured: this is the noise of the eval split alone, the part that new data from the same
    source moves. Returns each outcome's share, the most frequent first (a tie in share goes
    to `selected`, the decision on the real split); None where a row of the deciding device
    has no per-example scores, the task's metric is not their mean (causal LMs: perplexity),
    or there is no baseline to compare with.

    Why by hand: no library replays a multi-criteria decision under a bootstrap; the
    resampling is stats.paired_bootstrap's, one level up (each resample's intervals are
    bootstrapped again, with fewer samples: they decide the gate, not a reported figure)."""
    from collections import Counter

    task = get_task(policy.task)
    device = policy.budget.device if policy.budget.device in available_devices else "cpu"
    scored = [r for r in rows if r.device == device and r.ok]
    base = next((r for r in scored if r.id == policy.budget.baseline), None)
    if not task.metric_is_mean or base is None or any(r._scores is None or r.quality is None for r in scored):
        return None
    S = np.asarray([r._scores for r in scored], dtype=np.float64)  # [V, N] per-example scores
    n = S.shape[1]
    bi = scored.index(base)
    inner = policy.model_copy(update={"benchmark": policy.benchmark.model_copy(
        update={"bootstrap_samples": min(policy.benchmark.bootstrap_samples, 400)})})
    rng = np.random.default_rng(seed)
    outcomes: Counter = Counter()
    for b in range(resamples):
        Sb = S[:, rng.integers(0, n, size=n)]  # [V, N]: one resample of the eval split, shared by every row
        copies = [rescored(r, Sb[i], Sb[bi], task, inner.benchmark.bootstrap_samples, seed=b)
                  for i, r in enumerate(scored)]
        outcomes[decide(copies, inner, available_devices, eval_examples).selected] += 1
    ranked = sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0] != selected))
    return [PickShare(selected=k, share=v / resamples) for k, v in ranked]


def stability_note(shares: list[PickShare], selected: str | None, resamples: int, examples: int) -> str:
    """The decision note that says how settled the pick is."""
    def name(vid: str | None) -> str:
        return "no variant" if vid is None else f"'{vid}'"

    parts = ", ".join(f"{name(s.selected)} in {s.share:.0%}" for s in shares[:4])
    if len(shares) > 4:
        parts += f", {len(shares) - 4} other outcome{'s' if len(shares) > 5 else ''} in the rest"
    mine = next((s.share for s in shares if s.selected == selected), 0.0)
    text = (f"stability: replayed on {resamples} resamples of the {examples} eval examples (timings as measured), "
            f"the decision deploys {parts}")
    if mine < 0.9:
        text += (f"; {name(selected)} is not settled by this eval split, so new data from the same source may "
                 f"deploy another: a larger eval split settles it")
    return text


def pick(passing: list[Row], key: str, budget: BudgetSpec, metric: Metric | None = None,
         compare: "Callable[[Row, Row], tuple[float, float]] | None" = None
         ) -> tuple[Row | None, list[Row], float]:
    """The variant to deploy among those within budget: (selected, the ones tied with the best
    on the objective, the tolerance that tied them).

    Timed figures ($/1K, p95) move between runs of the same recipe by more than the gaps
    between close variants (a 2-core cloud VM gave $/1K ratios of the same two variants
    0.72x in one run and 1.12x in the next), so picking the strict minimum flips the
    decision from run to run. Variants within `budget.tie_tolerance` of the best figure
    count as equal. Quality then decides only where it tells the variants apart beyond
    chance: a tied variant that another tied one beats (`compare(a, b)`: the paired 95%
    interval of a's quality minus b's, wholly on a's better side of zero) drops out, and the
    smallest of the rest is deployed, then the better figure. Point estimates a sentence or
    two apart reorder on other data from the same source; an interval that excludes zero
    rarely does, and sizes are exact, so the pick holds on new data as well as between runs.
    Without `compare` (rows with no per-example scores), the better point quality, then the
    smaller size. Sizes are exact, so min_size takes no tolerance."""
    metric = metric or get_task().metric
    if not passing:
        return None, [], 0.0
    tolerance = 0.0 if key == "size_mb" else float(budget.tie_tolerance)
    best = min(r.figure(key) for r in passing)
    tied = sorted((r for r in passing if r.figure(key) <= best * (1.0 + tolerance)),
                  key=lambda r: (r.figure(key), r.p95_ms))
    if compare is None:
        selected = max(tied, key=lambda r: (metric.key(r.quality), -r.size_mb, -r.figure(key), -r.p95_ms))
        return selected, tied, tolerance
    beaten = {id(r) for r in tied if any(o is not r and metric.beats(compare(o, r)) for o in tied)}
    pool = [r for r in tied if id(r) not in beaten] or tied  # `or`: a cycle of "beats" (never seen) keeps them all
    selected = min(pool, key=lambda r: (r.size_mb, r.figure(key), r.p95_ms))
    return selected, tied, tolerance


def check_names(metric: Metric) -> tuple[str, str, str]:
    """The budget checks, as junit.xml names its test cases."""
    return (f"{metric.name} budget", "latency SLO", "size limit")


CHECKS = check_names(get_task().metric)


def quality_check(r: Row, max_drop: float, gate_on: str, metric: Metric) -> Check:
    """The quality gate of one row: its drop against the baseline (on the point estimate, or
    on the losing end of its 95% interval with gate_on `ci_lower`) within `max_drop`, in the
    metric's unit. The one gate for the decision's budget checks and `compress gate`."""
    name = check_names(metric)[0]
    if r.delta is None or r.delta_ci95 is None:
        return Check(name=name, status="fail",
                     message=f"no {metric.name} delta: the baseline was not measured on {r.device}")
    if gate_on == "ci_lower":
        value, side = metric.worst_bound(r.delta_ci95)
        what = f"{side} 95% bound of the {metric.name} delta"
    else:
        value, what = r.delta, f"{metric.name} drop"
    drop = metric.drop(value)
    unit = metric.delta_unit
    if drop > max_drop:
        return Check(name=name, status="fail", message=f"{what} {drop:.2f} {unit} exceeds the budget of {max_drop:.2f}")
    return Check(name=name, status="pass", message=f"{what} {drop:.2f} {unit} is within the budget of {max_drop:.2f}")


def budget_checks(r: Row, budget: BudgetSpec, metric: Metric | None = None) -> list[Check]:
    """The budget checks of one candidate row, each with status pass | fail | skipped (the
    budget sets no such limit) | error (not measured). decide() turns the failures into
    reasons; junit.py reports every check as a test case."""
    metric = metric or get_task().metric
    names = check_names(metric)
    if not r.ok:
        msg = f"benchmark failed: {r.error}"
        return [Check(name=n, status="error", message=msg) for n in names]
    out = [quality_check(r, budget.quality_limit(metric.name), budget.gate_on, metric)]
    slo = budget.latency_p95_ms
    if slo is None:
        out.append(Check(name=names[1], status="skipped", message="no latency SLO set (budget.latency_p95_ms)"))
    elif r.p95_ms > slo:
        out.append(Check(name=names[1], status="fail",
                         message=f"p95 latency {r.p95_ms:.2f} ms exceeds the SLO of {slo:.2f} ms"))
    elif r.operating_point is None:
        out.append(Check(name=names[1], status="fail", message="no batch size meets the latency SLO"))
    else:
        out.append(Check(name=names[1], status="pass",
                         message=f"p95 latency {r.p95_ms:.2f} ms meets the SLO of {slo:.2f} ms "
                         f"(cheapest batch size within it: {r.operating_point.batch_size})"))
    max_mb = budget.max_size_mb
    if max_mb is None:
        out.append(Check(name=names[2], status="skipped", message="no size limit set (budget.max_size_mb)"))
    elif r.size_mb > max_mb:
        out.append(Check(name=names[2], status="fail",
                         message=f"size {r.size_mb:.1f} MB exceeds the limit of {max_mb:.1f} MB"))
    else:
        out.append(Check(name=names[2], status="pass",
                         message=f"size {r.size_mb:.1f} MB is within the limit of {max_mb:.1f} MB"))
    if r.lm is not None and budget.max_task_drop is not None:
        out.append(task_check(r, budget.max_task_drop, budget.gate_on))
    return out


TASK_CHECK = "task accuracy budget"


def task_check(r: Row, max_drop: float, gate_on: str) -> Check:
    """Causal LMs: every multiple-choice set's accuracy within `max_drop` points of the
    baseline's (on the point, or on the lower end of its interval with gate_on `ci_lower`)."""
    assert r.lm is not None
    sets = [e for e in r.lm.evals if e.metric == "acc"]
    if not sets:
        return Check(name=TASK_CHECK, status="skipped", message="no multiple-choice set scored (lm.multiple_choice)")
    bad, said = [], []
    for e in sets:
        if e.delta is None or e.delta_ci95 is None:
            return Check(name=TASK_CHECK, status="fail", message=f"{e.name}: no delta (the baseline was not scored)")
        drop = -(e.delta_ci95[0] if gate_on == "ci_lower" else e.delta) + 0.0
        said.append(f"{e.name} {drop:.2f}")
        if drop > max_drop:
            bad.append(f"{e.name} {drop:.2f}")
    what = "lower 95% bound of the accuracy drop" if gate_on == "ci_lower" else "accuracy drop"
    if bad:
        return Check(name=TASK_CHECK, status="fail",
                     message=f"{what} ({', '.join(bad)} points) exceeds the budget of {max_drop:.2f}")
    return Check(name=TASK_CHECK, status="pass",
                 message=f"{what} ({', '.join(said)} points) is within the budget of {max_drop:.2f}")


_NAME = {"usd_per_1k": "$/1K", "p95_ms": "p95 latency", "size_mb": "size", "usd_per_month": "$/month at the SLO"}


def _fmt(key: str, value: float, causal: bool = False) -> str:
    if causal and key == "usd_per_1k":  # a causal LM's throughput is output tokens/s
        return f"${value * 1000:.4f}/1M tokens"
    return {"usd_per_1k": f"${value:.5f}/1K", "p95_ms": f"p95 {value:.2f} ms", "size_mb": f"{value:.1f} MB",
            "usd_per_month": f"${value:,.0f}/month"}[key]
