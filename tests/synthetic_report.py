"""Synthetic benchmark measurements and reports for testing the decision and the reports
without training or timing anything."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from compress.decision.decide import Policy, build_rows, decide
from compress.bench.measure import Measurement


def batches(p50: float, p95: float, throughput: float, sizes=(1, 8, 32)) -> list[dict]:
    """A latency/throughput curve: larger batches take longer and process more per second."""
    out = []
    for i, bs in enumerate(sizes):
        scale = bs ** 0.6
        out.append({"batch_size": bs, "throughput": throughput * (1 + i), "p50_ms": p50 * scale,
                    "p95_ms": p95 * scale, "p99_ms": p95 * scale * 1.1, "padding_waste": 0.1 * i})
    return out


def measurement(predictions, labels, p50=5.0, p95=6.0, throughput=200.0, size_mb=100.0, **extra) -> dict:
    """A worker's result as its JSON object (tests edit it as such); `typed` makes it a Measurement."""
    predictions = np.asarray(predictions)
    acc = float((predictions == labels).mean() * 100)
    return {
        "ok": True, "accuracy": acc, "macro_f1": acc, "size_bytes": size_mb * 1e6, "params": 1000,
        "memory_bytes": size_mb * 1e6, "predictions": predictions.tolist(),
        "latency_ms": {"p50": p50, "p95": p95, "p99": p95 * 1.1, "mean": p50, "n": 50},
        "batches": batches(p50, p95, throughput), "notes": [], "effective_device": "cpu", **extra,
    }


def flip(labels: np.ndarray, n_wrong: int, seed: int = 0) -> np.ndarray:
    """Predictions equal to the labels except n_wrong random ones."""
    rng = np.random.default_rng(seed)
    pred = labels.copy()
    idx = rng.choice(len(labels), size=n_wrong, replace=False)
    pred[idx] = 1 - pred[idx]
    return pred


def typed(results: dict) -> dict:
    """{key: measurement JSON} -> {key: Measurement}."""
    return {k: Measurement.model_validate(v) for k, v in results.items()}


def recipe_dict(**budget) -> Policy:
    """The decision's view of a recipe: its budget (the recipe's defaults, baseline 'baseline',
    min_cost, cpu, ..., with `budget` over them) and a benchmark block with a cpu price."""
    b = {**Policy().budget.model_dump(), **budget}  # every key set: a report holds them all
    return Policy.model_validate({"budget": b, "benchmark": {
        "prices": {"cpu": {"instance": "c6i.xlarge", "usd_per_hour": 0.17}},
        "bootstrap_samples": 300, "batch_sizes": [1, 8, 32]}})


def variants(*ids: str) -> list[dict]:
    return [{"id": i, "stage": "finetune" if i == "baseline" else "x", "format": "hf",
             "source": None if i == "baseline" else "baseline", "fingerprint": "f" * 16} for i in ids]


def make_report(results: dict[str, dict], labels: np.ndarray, recipe: Policy | None = None,
                cpu_model: str = "Test CPU", name: str = "synthetic", meta: list[dict] | None = None) -> dict:
    """report.json's object (schema 1: no task block) from {variant id: measurement} on the cpu;
    `meta`: the variants' records (default: `variants(*results)`)."""
    from compress.reports.render import Report

    recipe = recipe or recipe_dict()
    res = typed({(vid, "cpu"): copy.deepcopy(r) for vid, r in results.items()})
    rows = build_rows(meta or variants(*results), res, labels, recipe)
    decision = decide(rows, recipe, ["cpu"])
    return Report.model_validate({
        "schema_version": 1, "recipe": name, "run_dir": "", "devices": ["cpu"], "budget": recipe.budget.model_dump(),
        "decision": decision.dump(), "rows": [r.dump() for r in rows], "stages": {}, "notes": [],
        "manifest": {
            "recipe": {"benchmark": recipe.benchmark.model_dump(mode="json")}, "versions": {"compress": "0", "torch": "0"},
            "hardware": {"cpu": {"model": cpu_model}}, "threads": 1, "seeds": {},
            "data": {"eval_examples": len(labels), "eval_fingerprint": "e" * 64},
        },
    }).dump()


def write_run(folder: Path, report: dict, results: dict[str, dict], labels: np.ndarray) -> Path:
    """A run folder as the runner leaves it: reports plus the benchmark measurements (sealed,
    as the runner caches them) and eval file."""
    from compress.data.artifacts import sealed
    from compress.reports.render import write_reports

    folder.mkdir(parents=True, exist_ok=True)
    bench = folder / "bench"
    bench.mkdir(exist_ok=True)
    fp = report["manifest"]["data"]["eval_fingerprint"]
    (bench / f"eval-{fp[:16]}.jsonl").write_text(
        "".join(json.dumps({"text": f"s{i}", "label": int(y)}) + "\n" for i, y in enumerate(labels)))
    for vid, r in results.items():
        (bench / f"{vid}.cpu.json").write_text(json.dumps(sealed(r)))
    report = {**report, "run_dir": str(folder)}
    write_reports(report, folder)
    return folder
