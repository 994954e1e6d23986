"""report.json as typed records, and the variant table every rendering of it shares.

`Report` is report.json (rows and the decision are compress/decision/decide.py's records), written
by alias and without the fields never set, so its keys are the public format's (docs/benchmark.md,
"report.json"); `read_report` reads one back through the same records, and a file of another
shape is a one-line error. The renderers (compress/reports/render.py, html_report.py, junit.py,
model_card.py, compare.py) import from here, so none of them imports another.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from compress.decision.decide import Decision, Row
from compress.recipe.schema import BudgetSpec
from compress.serving.records import ServingReport
from compress.core.task import DEFAULT_TASK, Metric, TaskInfo, get_task

REPORT_JSON = "report.json"
# 1: the first format. 2: adds the top-level `task` block (the task and its metric); a
# report without it is a sequence-classification report. 3: causal LMs: a row's quality
# figure is keyed by the task's metric (`perplexity`; classification keeps `accuracy`), and
# rows carry an `lm` block (every eval, generation speed, $ per 1M tokens, the memory plan).
# 4: the decision's `stability` and `stability_resamples` (the decision replayed on
# resamples of the eval split). 5: a row's `examples_to_pass` (the eval split size at which
# the interval gate would pass a variant it rejects with its point estimate within budget).
# 6: a cascade row's `large_alone_usd_per_1k`, `cost_vs_large` and `cost_vs_large_paired`
# (its large member timed alone in the cascade's process, and the cost ratio). 7: the `serving`
# block (compress/serving/records.py: the load LoadGen drove at the served configurations and
# the capacity and cost plan) and a row's `usd_per_month` (its plan's $/month at the SLO).
# 8: a causal-LM row's `lm.roofline` (batch-1 decode and prefill against the machine's
# measured read bandwidth and fp32 matmul rate).
SCHEMA_VERSION = 8
SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)
QUALITY_KEY = "accuracy"  # the key Row.quality is written under for classification


class Manifest(BaseModel):
    """What a run was made of (manifest.json holds the same)."""

    model_config = ConfigDict(extra="forbid")

    recipe_file: str | None = None
    recipe: dict[str, Any] = {}
    versions: dict[str, Any]
    hardware: dict[str, Any]
    threads: int
    benchmark_method: int | None = None
    seeds: dict[str, Any] = {}
    data: dict[str, Any]
    model: dict[str, Any] | None = None
    started: str | None = None
    seconds: float | None = None


class Report(BaseModel):
    """report.json."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_version: int
    task: TaskInfo | None = None  # schema 2 on; absent: sequence classification
    recipe: str
    run_dir: str = ""
    devices: list[str]
    budget: BudgetSpec
    decision: Decision
    rows: list[Row]
    stages: dict[str, Any] = {}
    notes: list[str] = []
    manifest: Manifest
    timing: dict[str, Any] | None = None
    serving: ServingReport | None = None  # schema 7 on: the measured load and the cost plan

    @model_validator(mode="after")
    def _measured(self):
        for i, r in enumerate(self.rows):
            if r.ok and (r.quality is None or r.size_mb is None or r.latency_ms is None or not r.throughput):
                raise ValueError(f"rows[{i}]: a row marked ok lacks {self.metric.name}, size_mb, latency_ms or throughput")
            if r.delta is not None and r.delta_ci95 is None:
                raise ValueError(f"rows[{i}]: a row with a delta lacks delta_ci95")
            if r.usd_per_1k is not None and r.operating_point is None:
                raise ValueError(f"rows[{i}]: a row with usd_per_1k lacks operating_point.batch_size")
        return self

    @property
    def task_info(self) -> TaskInfo:
        return self.task if self.task is not None else get_task(DEFAULT_TASK).info()

    @property
    def metric(self) -> Metric:
        return self.task_info.metric

    def dump(self) -> dict[str, Any]:
        """The report as report.json's object (python values, NaN and infinities still in).
        The quality figure is keyed by the task's metric name (perplexity for causal LMs)."""
        out = self.model_dump(by_alias=True, exclude_unset=True)
        return _rekey(out, QUALITY_KEY, self.metric.name)

    @model_validator(mode="before")
    @classmethod
    def _read_quality_key(cls, data: Any) -> Any:
        """A causal-LM report keys its quality figure by the metric (`perplexity`): read it
        back into the rows' `quality` field."""
        if isinstance(data, dict) and isinstance(data.get("task"), dict):
            name = (data["task"].get("metric") or {}).get("name")
            if isinstance(name, str) and name != QUALITY_KEY:
                return _rekey(dict(data), name, QUALITY_KEY)
        return data


def _rekey(report: dict, old: str, new: str) -> dict:
    """Renames the quality key of every row, member and the best failed variant."""
    if old == new:
        return report

    def one(d: Any) -> Any:
        if not isinstance(d, dict) or old not in d:
            return d
        return {(new if k == old else k): v for k, v in d.items()}

    report["rows"] = [one(r) for r in report.get("rows", [])]
    for r in report["rows"]:
        if isinstance(r, dict) and isinstance(r.get("members"), dict):
            r["members"] = {k: one(m) for k, m in r["members"].items()}
    if isinstance(report.get("decision"), dict):
        report["decision"] = dict(report["decision"])
        report["decision"]["best_failed"] = one(report["decision"].get("best_failed"))
    return report


def as_report(report: "Report | dict") -> Report:
    """A report record from a report.json-shaped object (or the record itself)."""
    return report if isinstance(report, Report) else Report.model_validate(report)

def _num(v, fmt: str, dash: str = "-") -> str:
    return dash if v is None else format(v, fmt)


def delta_cell(r: Row) -> str:
    if r.delta is None or r.delta_ci95 is None:
        return "-"
    lo, hi = r.delta_ci95
    return f"{r.delta:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def money(v: float | None, digits: int = 3) -> str:
    """A cost with `digits` significant digits in plain notation (0.0000452, 0.0123, 1.23,
    1,234): a fixed number of decimals prints a small cost as 0.0000. None: '-'."""
    if v is None:
        return "-"
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:.{max(0, digits - 1 - math.floor(math.log10(abs(v))))}f}"


def cost_cell(r: Row) -> str:
    if r.usd_per_1k is None or r.operating_point is None:
        return "-"
    return f"${r.usd_per_1k:.5f} @b{r.operating_point.batch_size}"


def _format(r: Row) -> str:
    """The format and, where the format's name does not say it, the runtime that ran it:
    `onnx (onnxruntime)`, `hf (torch)`, `openvino`. (Reports from before rows named their
    runtime show the format alone.)"""
    return r.format if r.runtime in (None, r.format) else f"{r.format} ({r.runtime})"


def _lm_eval(r: Row, name: str) -> str:
    e = next((e for e in r.lm.evals if e.name == name), None) if r.lm else None
    if e is None:
        return "-"
    return f"{e.value:.1f}" + (f" ({e.delta:+.1f})" if e.delta is not None else "")


def _roof(r) -> str:
    """Batch-1 decode as a share of the bandwidth roofline / prefill of the fp32 matmul peak."""
    return "-" if r is None else f"{100 * r.decode_fraction:.0f} / {100 * r.prefill_fraction:.0f}"


def lm_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Causal LMs: perplexity and its relative increase, the task evals (points against the
    baseline in brackets), size, time to first token and per output token at batch 1, the
    best decode rate and its batch, $ per 1M output tokens, the tiers it fits."""
    names = list(dict.fromkeys(e.name for r in report.rows if r.lm for e in r.lm.evals if e.name != "perplexity"))
    heads = ["variant", "format", "device", "ppl", "delta % [95% CI]", *names, "MB", "TTFT ms", "ms/token",
             "tok/s b1", "% roofline", "best tok/s", "$/1M tok", "fits", "verdict"]
    out = []
    for r in report.rows:
        fmt, verdict = _format(r), r.verdict or ""
        if not r.ok or r.lm is None:
            out.append([r.id, fmt, r.device, *["-"] * (len(heads) - 4), verdict])
            continue
        lm = r.lm
        best_b, best = max(lm.decode_tokens_per_s.items(), key=lambda kv: kv[1])
        plan = lm.memory_plan
        fits = ", ".join(t.name for t in plan.tiers if not t.spills) if plan else "-"
        out.append([
            r.id, fmt, r.device, f"{r.quality:.3f}", delta_cell(r), *[_lm_eval(r, n) for n in names],
            f"{r.size_mb:.1f}", _num(lm.ttft_ms.get("p50"), ".1f"), _num(lm.tpot_ms.get("p50"), ".2f"),
            _num(lm.decode_tokens_per_s.get("1"), ".1f"), _roof(lm.roofline), f"{best:.1f} @b{best_b}",
            _num(lm.usd_per_1m_tokens, ".4f", "-").join(("$", "")) if lm.usd_per_1m_tokens is not None else "-",
            fits or "none", verdict,
        ])
    return heads, out


def table_rows(report: "Report | dict") -> list[list[str]]:
    report = as_report(report)
    if report.task_info.name == "causal-lm":
        return lm_table(report)[1]
    out = []
    for r in report.rows:
        fmt = _format(r)
        verdict = r.verdict or ""
        if not r.ok:
            out.append([r.id, fmt, r.device, "-", "-", "-", "-", "-", "-", "-", verdict])
            continue
        lat = r.latency_ms
        tput = max(r.throughput.values())
        out.append([
            r.id, fmt, r.device, f"{r.quality:.2f}", delta_cell(r), f"{r.size_mb:.1f}",
            f"{lat.p50:.2f} / {lat.p95:.2f} / {lat.p99:.2f}",
            _num(r.speedup_vs_baseline, ".2f") + "x" if r.speedup_vs_baseline else "-",
            f"{tput:,.0f}", cost_cell(r), verdict,
        ])
    return out


def headers(report: Report) -> list[str]:
    """The table's column headings: the quality columns are named after the task's metric."""
    m, info = report.metric, report.task_info
    if info.name == "causal-lm":
        return lm_table(report)[0]
    delta = f"delta {'pts' if m.delta_unit == 'points' else m.delta_unit} [95% CI]".replace("  ", " ")
    return ["variant", "format", "device", m.label or m.name, delta, "MB", "p50/p95/p99 ms",
            "speed-up", info.throughput_unit, "$/1K", "verdict"]


def read_report(path: Path) -> Report:
    from compress.core.errors import CompressError

    path = path / REPORT_JSON if path.is_dir() else path
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CompressError(f"{path}: no such report; run `compress run RECIPE` first")
    except IsADirectoryError:
        raise CompressError(f"{path}: is a folder, not a report.json")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CompressError(f"{path}: not a valid report.json")
    except OSError as exc:
        raise CompressError(f"{path}: cannot read it ({exc.strerror or exc.__class__.__name__})")
    version = report.get("schema_version") if isinstance(report, dict) else None
    if type(version) is not int or version not in SCHEMA_VERSIONS or "rows" not in report:
        raise CompressError(f"{path}: not a compress report (schema_version {' or '.join(map(str, SCHEMA_VERSIONS))})")
    # compress writes null where a figure is not finite (render.finite_json): a NaN or an
    # infinity (1e999 reads as one) was put there by hand or by another tool, and every
    # comparison against it is false, so a gate would pass or fail on nothing.
    where = non_finite(report)
    if where is not None:
        raise CompressError(f"{path}: {where} is not a finite number (NaN or infinite); compress never writes one: "
                            f"re-run `compress run` to write the report again")
    newer = newer_than(report, version)
    if newer is not None:
        key, first = newer
        raise CompressError(f"{path}: schema_version {version} does not match its content: {key} first appears in "
                            f"schema {first}; re-run `compress run` to write the report again")
    try:
        return Report.model_validate(report)
    except ValidationError as err:
        raise CompressError(f"{path}: malformed report.json: {_first_problem(err)}; re-run `compress run` to write "
                            f"it again") from err
    except RecursionError as exc:
        raise CompressError(f"{path}: malformed report.json: nested too deeply; re-run `compress run` to write "
                            f"it again") from exc


def non_finite(obj: Any) -> str | None:
    """Where (`rows.1.latency_ms.p50`) the first NaN or infinity in a JSON value is, or None."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:  # not recursive: a deeply nested file must not overflow the stack here
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "the report"
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}.{i}" if where else str(i), v) for i, v in reversed(list(enumerate(value))))
    return None


# The first schema_version of each key a report may hold (see SCHEMA_VERSION): a report
# that claims an older version than its content is edited or forged, and would be read
# under rules it was not written by (a schema 1 report is sequence classification).
_ROW_KEYS = {"lm": 3, "perplexity": 3, "examples_to_pass": 5, "large_alone_usd_per_1k": 6, "cost_vs_large": 6,
             "cost_vs_large_paired": 6}
_DECISION_KEYS = {"stability": 4, "stability_resamples": 4}


def newer_than(report: dict, version: int) -> tuple[str, int] | None:
    """(key, the schema it first appears in) of the first key in `report` newer than
    `version`, or None."""
    found: list[tuple[str, int]] = []
    if "task" in report:
        task = report["task"]
        causal = isinstance(task, dict) and task.get("name") == "causal-lm"
        found.append(("task (causal-lm)", 3) if causal else ("task", 2))
    decision = report.get("decision")
    if isinstance(decision, dict):
        found += [(f"decision.{k}", v) for k, v in _DECISION_KEYS.items() if k in decision]
        best = decision.get("best_failed")
        if isinstance(best, dict):
            found += [(f"decision.best_failed.{k}", v) for k, v in _ROW_KEYS.items() if k in best]
    rows = report.get("rows")
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if isinstance(row, dict):
            found += [(f"rows.{i}.{k}", v) for k, v in _ROW_KEYS.items() if k in row]
            if isinstance(row.get("lm"), dict) and row["lm"].get("roofline") is not None:
                found.append((f"rows.{i}.lm.roofline", 8))
    return next(((k, v) for k, v in found if v > version), None)


def _first_problem(err: ValidationError) -> str:
    """The first problem pydantic found, as `where: what` on one line."""
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"])
    msg = str(e["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}"[:300] if where else msg[:300]
