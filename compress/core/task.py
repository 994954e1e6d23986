"""Tasks: what a variant is asked, and how its answers are scored and timed.

The benchmark worker, the decision and the reports know a task only through this
interface; an implementation (compress/tasks/classification/task.py) lives with the other
techniques (it reads a predictor's outputs), and is imported on first use from the
catalogue below, so reading a recipe imports no framework.

A task owns:
- its data columns (what the eval file holds per example) and how a batch is built from
  the tokenized examples;
- the workload: what one timed call runs (sequence classification: one forward pass per
  batch; a causal LM would time a generation: time to first token, then per token);
- its quality metric (name, direction, unit), its secondary metrics, and the per-example
  score the paired bootstrap resamples (correct 0/1 per sentence for classification; the
  per-sequence negative log-likelihood for perplexity, whose interval would then be taken
  on exp(mean) rather than on the mean).

Figures are kept in the metric's own unit (points of accuracy); a `delta` is always
variant minus baseline, and `Metric.drop` turns it into "how much worse" whatever the
direction.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

# task name -> "module:attribute" of its Task object, imported on first use.
TASKS: dict[str, str] = {
    "sequence-classification": "compress.tasks.classification.task:TASK",
    "causal-lm": "compress.tasks.causal_lm.task:TASK",
}
DEFAULT_TASK = "sequence-classification"


class Metric(BaseModel):
    """A figure a task reports: `name` is how reports and report.json name it (`accuracy`),
    `label` its column heading, `unit` what its numbers are in (`%`: points)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    direction: Literal["higher", "lower"]
    unit: str = ""
    label: str = ""
    delta_unit: str = ""  # what a difference of two figures is counted in ("points")
    better: str = ""  # how reasons say a row is better on it ("more accurate"); default "better on NAME"
    best: str = ""  # and the best of several ("most accurate"); default "best on NAME"

    def is_better(self, a: float, b: float) -> bool:
        """Whether figure a is strictly better than figure b."""
        return a > b if self.higher_is_better else a < b

    def key(self, value: float) -> float:
        """A sort key: larger is better, whatever the direction."""
        return value if self.higher_is_better else -value

    @property
    def better_words(self) -> str:
        return self.better or f"better on {self.name}"

    @property
    def best_words(self) -> str:
        return self.best or f"best on {self.name}"

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher"

    def drop(self, delta: float) -> float:
        """How much worse a variant is than the baseline, in the metric's unit, for a
        delta of variant minus baseline (negative: better). `+ 0.0`: no "-0.00"."""
        return (-delta if self.higher_is_better else delta) + 0.0

    def beats(self, ci: tuple[float, float] | list[float]) -> bool:
        """Whether the interval of a difference (a minus b, in the delta unit) says that a is
        better than b beyond chance: it lies wholly on a's better side of zero."""
        return ci[0] > 0 if self.higher_is_better else ci[1] < 0

    def worst_bound(self, ci: tuple[float, float] | list[float]) -> tuple[float, str]:
        """The end of a delta's interval on the losing side, and its name ('lower', 'upper')."""
        return (ci[0], "lower") if self.higher_is_better else (ci[1], "upper")


class TaskInfo(BaseModel):
    """What report.json says of the task (its `task` block): enough for a reader to label
    and order the figures without importing the task."""

    model_config = ConfigDict(extra="forbid")

    name: str
    metric: Metric
    secondary: list[Metric] = []
    throughput_unit: str = "seq/s"


class Task:
    """The interface every task implements. Arrays: `outputs` [N, ...] per example as the
    predictor returns them (classification: logits [N, C]); `targets` [N] (class ids)."""

    name: str
    metric: Metric
    secondary: tuple[Metric, ...] = ()
    columns: tuple[str, ...] = ()  # the keys of one eval-file row
    workload: str = ""  # what one timed call runs, in words (docs/benchmark.md and `compress stages` say it)
    throughput_unit: str = "seq/s"

    def info(self) -> TaskInfo:
        """report.json's `task` block; every field set, so that it is written in full."""
        return TaskInfo.model_validate({"name": self.name, "metric": self.metric.model_dump(),
                                        "secondary": [m.model_dump() for m in self.secondary],
                                        "throughput_unit": self.throughput_unit})

    # --- data
    def eval_rows(self, split: Any) -> list[dict]:  # pragma: no cover - interface
        """The eval split as rows of the eval file the worker reads (JSON objects)."""
        raise NotImplementedError

    def read_eval(self, rows: list[dict]) -> tuple[Any, "np.ndarray"]:  # pragma: no cover - interface
        """(inputs, targets [N]) from the eval file's rows."""
        raise NotImplementedError

    def select(self, inputs: Any, idx: list[int]) -> Any:  # pragma: no cover - interface
        """The inputs of the examples `idx`, in that order."""
        raise NotImplementedError

    def encode(self, predictor: Any, inputs: Any, max_length: int) -> Any:  # pragma: no cover - interface
        """The inputs tokenized for one predictor (each variant has its own tokenizer)."""
        raise NotImplementedError

    def batch(self, encoded: Any, idx: list[int]) -> dict[str, "np.ndarray"]:  # pragma: no cover - interface
        """The examples `idx` of the encoded inputs as one padded batch: arrays [B, T]."""
        raise NotImplementedError

    def size(self, encoded: Any, i: int) -> int:  # pragma: no cover - interface
        """Tokens of example i (length-sorted batches and padding waste)."""
        raise NotImplementedError

    # --- the workload
    def run(self, predictor: Any, batch: dict[str, "np.ndarray"]) -> "np.ndarray":  # pragma: no cover - interface
        """One timed call: the predictor's outputs [B, ...] for a batch."""
        raise NotImplementedError

    # --- scoring
    def check(self, outputs: "np.ndarray") -> None:  # pragma: no cover - interface
        """Raises ValueError for outputs that must fail the variant rather than be scored."""
        raise NotImplementedError

    def predictions(self, outputs: "np.ndarray") -> "np.ndarray":  # pragma: no cover - interface
        """What is kept per example (bench/<id>.<device>.json `predictions`) from outputs [N, ...]."""
        raise NotImplementedError

    def quality(self, predictions: "np.ndarray", targets: "np.ndarray") -> float:  # pragma: no cover - interface
        """The metric over the whole eval split, in its unit."""
        raise NotImplementedError

    def secondary_scores(self, predictions: "np.ndarray", targets: "np.ndarray") -> dict[str, float]:  # pragma: no cover
        """{secondary metric name: value}."""
        raise NotImplementedError

    def example_scores(self, predictions: "np.ndarray", targets: "np.ndarray") -> "np.ndarray":  # pragma: no cover
        """Per-example scores [N] whose mean, times `scale`, is the metric: the unit the paired
        bootstrap resamples."""
        raise NotImplementedError

    scale: float = 1.0  # metric = mean(example_scores) * scale (100: a share in points)
    # False where the metric is not that mean (perplexity: exp of the mean NLL): figures that
    # recompute the metric from resampled scores (decision.stability) are then not made.
    metric_is_mean: bool = True

    # --- comparing with the baseline
    def delta(self, value: float, base: float) -> float:
        """A variant's figure against the baseline's, in the metric's delta unit."""
        return value - base

    def measurement_scores(self, measurement: Any, targets: "np.ndarray") -> "np.ndarray":
        """The per-example scores [N] of a measurement (compress.bench.measure.Measurement): the
        unit the paired bootstrap resamples."""
        import numpy as np

        return self.example_scores(np.array(measurement.predictions), targets)

    def interval(self, base_scores: "np.ndarray", scores: "np.ndarray", samples: int, seed: int = 0
                 ) -> tuple[float, float]:
        """The 95% paired bootstrap interval of `delta` (the same examples resampled for both)."""
        from compress.core.stats import paired_bootstrap

        return paired_bootstrap(base_scores, scores, samples, seed=seed, scale=self.scale)

    def examples_to_clear(self, base_scores: "np.ndarray", scores: "np.ndarray", margin: float) -> int | None:
        """The eval split size at which `interval` would be +-`margin` wide (stats.examples_to_clear);
        None where the metric is not the mean of the scores, which the formula assumes."""
        from compress.core.stats import examples_to_clear

        return examples_to_clear(base_scores, scores, margin, scale=self.scale) if self.metric_is_mean else None


def get_task(name: str = DEFAULT_TASK) -> Task:
    if name not in TASKS:
        raise KeyError(f"unknown task '{name}'; valid: {', '.join(sorted(TASKS))}")
    module, attr = TASKS[name].split(":")
    return getattr(importlib.import_module(module), attr)
