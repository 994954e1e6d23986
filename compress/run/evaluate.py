"""After the stages: benchmark every variant, decide which one to ship, write the reports.

Called by the runner (compress/run/runner.py) with what the stages left; everything it reads
of the task (which metric, how the eval split is scored) goes through compress/tasks.
"""

from __future__ import annotations

import json
import time
from typing import Any

from compress.core.errors import CompressError, StageError
from compress.core.files import write_file
from compress.recipe.schema import BENCHMARKABLE, MODEL_ID


def _timing(stages_info: dict, bench, bench_seconds: float, total: float) -> dict:
    """report.json `timing`: where this run's time went (reused stages and cached
    measurements count 0): per stage, per benchmark phase and per measured variant."""
    spent = {sid: 0.0 if info.get("cached") else info["seconds"] for sid, info in stages_info.items()}
    stages = {sid: {"seconds": round(spent[sid], 1), "reused": bool(info.get("cached"))}
              for sid, info in stages_info.items()}
    stage_total = sum(spent.values())
    return {
        "seconds": round(total, 1),
        "stages": stages,
        "stages_seconds": round(stage_total, 1),
        "benchmark": {
            "seconds": round(bench_seconds, 1),
            "phases": {k: round(v, 1) for k, v in bench.phase_totals().items()},
            "variants": {k: {"seconds": round(bench.seconds(k), 1), "phases": {p: round(v, 2) for p, v in ph.items()}}
                         for k, ph in bench.variants.items()},
            "cached": list(bench.cached),
        },
        # data loading, model resolution, decision and reports
        "other_seconds": round(max(total - stage_total - bench_seconds, 0.0), 1),
    }


def _source_notes(model) -> list[str]:
    """What the model's source means for every figure: a GGUF file's weights were already
    quantized (Q4_1: 4-bit blocks), so the fp32 baseline is that grid dequantized, and a
    4-bit variant of it loses less than one of a pristine checkpoint would."""
    origin = str(getattr(model, "origin", "") or "")
    if "gguf" not in origin.lower():
        return []
    return [f"model: the baseline was dequantized from a GGUF file ({origin}); its weights already sit on that "
            f"file's quantization grid, so re-quantizing them to 4 bits looks kinder here than it would on a "
            f"pristine checkpoint"]


def benchmark_and_decide(recipe, artifacts, data, model, run_dir, stages_info, log, started, t_start, threads,
                         data_notes=()) -> dict[str, Any]:
    """Measures the benchmarkable variants, builds the rows and the decision, writes
    report.json (with report.md, junit.xml, report.html), the model cards and manifest.json.
    Returns report.json's object."""
    from compress.core import manifest
    from compress.bench.benchmark import METHOD, BenchTiming, run_benchmarks
    from compress.decision.decide import Policy, Variant, build_rows, decide, stability, stability_note
    from compress.reports.model_card import write_model_cards
    from compress.recipe.schema import BudgetSpec
    from compress.reports.render import write_reports
    from compress.reports.report_json import SCHEMA_VERSION, Manifest, Report
    from compress.core.task import get_task

    task = get_task(recipe.task)
    base = recipe.budget.baseline
    variants = [a for a in artifacts.values() if a.format in BENCHMARKABLE and (a.id != MODEL_ID or base == MODEL_ID)]
    hw = manifest.hardware()
    vers = manifest.versions()
    sizes = recipe.lm.timing.batch_sizes if recipe.lm is not None else recipe.benchmark.batch_sizes
    log(f"benchmark: {len(variants)} variants, {threads} threads, batch sizes {sizes}")
    bench_timing = BenchTiming()
    t_bench = time.perf_counter()
    bench_spec = recipe.benchmark.model_copy(update={"threads": threads})
    results, bench_notes = run_benchmarks(
        variants, bench_spec, data, run_dir / "bench",
        manifest.machine_key(hw, vers), log, reference=base, trust_remote_code=recipe.model.trust_remote_code,
        timing=bench_timing, task=recipe.task, lm=recipe.lm,
    )
    bench_seconds = time.perf_counter() - t_bench
    measured = [results[(base, d)] for d in ("cpu", *recipe.benchmark.devices) if (base, d) in results]
    if not any(m.ok for m in measured):
        err = next((r.error for (vid, _), r in results.items() if vid == base), None) or "not measured"
        raise StageError(f"budget.baseline '{base}' could not be benchmarked ({err}); nothing to compare against")

    resolved = recipe.resolved()
    resolved["benchmark"]["threads"] = threads
    meta = []
    for a in variants:
        spec = None if a.id == MODEL_ID else recipe.stage(a.id)
        v = Variant(
            id=a.id, stage=spec.uses if spec else MODEL_ID, format=a.format,
            source=spec.source if spec else None, fingerprint=a.fingerprint[:16],
            # A compressing stage's own word that its output is no smaller (distill on ALBERT).
            not_smaller=(a.result or {}).get("not_smaller"),
        )
        if spec and spec.config.refs():  # the other variants it reads (a cascade's large member)
            v.refs = spec.config.refs()
        meta.append(v)
    policy = Policy(budget=recipe.budget, benchmark=bench_spec, task=recipe.task)
    # targets [N] as the worker scores them: the eval split through the task's own columns
    _, targets = task.read_eval(task.eval_rows(data.eval))
    rows = build_rows(meta, results, targets, policy)
    devices = list(dict.fromkeys(d for (_, d) in results))
    eval_examples = None if recipe.is_causal else len(data.eval)
    serving, serving_seconds = None, 0.0
    if recipe.serving is not None and not recipe.is_causal:
        from compress.run.load import attach, measure_and_plan, redecide, served_variants, stand_in_policy

        # The variant to serve is the decision's; min_monthly_cost needs the load first, so $/1K stands in.
        decision = decide(rows, stand_in_policy(policy), devices, eval_examples=eval_examples)
        if decision.selected is None:
            log("load: no variant selected, so none is served under load")
        else:
            t_load = time.perf_counter()
            try:
                serving = measure_and_plan(recipe, run_dir, data.eval.texts,
                                           served_variants(recipe, decision.selected, rows), log)
                attach(rows, serving, decision.device)
            except CompressError as exc:  # the run's other figures still make their reports
                log(f"load: not measured: {exc}")
                bench_notes.append(f"serving: not measured under load: {exc}")
            serving_seconds = time.perf_counter() - t_load
        if recipe.budget.objective == "min_monthly_cost":
            decision = redecide(rows, policy, devices, eval_examples)
    else:
        decision = decide(rows, policy, devices, eval_examples=eval_examples)
    if bench_spec.stability_resamples:
        t_stab = time.perf_counter()
        shares = stability(rows, policy, devices, decision.selected, eval_examples,
                           resamples=bench_spec.stability_resamples)
        if shares is not None:  # None: no per-example scores, or a metric that is not their mean
            decision.stability, decision.stability_resamples = shares, bench_spec.stability_resamples
            decision.notes.append(stability_note(shares, decision.selected, bench_spec.stability_resamples,
                                                 len(targets)))
            log(f"  decision replayed on {bench_spec.stability_resamples} resamples of the eval split "
                f"in {time.perf_counter() - t_stab:.1f}s")
    seeds = {"data": recipe.seed, **{s.id: getattr(s.config, "seed", None) for s in recipe.stages if hasattr(s.config, "seed")}}
    report = Report(
        schema_version=SCHEMA_VERSION,
        task=task.info(),
        recipe=recipe.name,
        run_dir=str(run_dir),
        devices=devices,
        budget=BudgetSpec.model_validate(resolved["budget"]),  # every key set: report.json holds them all
        decision=decision,
        rows=rows,
        stages={
            sid: {**info, "result": {k: v for k, v in artifacts[sid].result.items() if k != "format"}}
            for sid, info in stages_info.items()
        },
        notes=list(data_notes) + data.notes + _source_notes(model) + bench_notes + (["trust_remote_code is on: model code from the hub was allowed to run"]
                                if recipe.model.trust_remote_code else []),
        manifest=Manifest(
            recipe_file=str(recipe.path) if recipe.path else None,
            recipe=resolved,
            versions=vers,
            hardware=hw,
            threads=threads,
            benchmark_method=METHOD,
            seeds=seeds,
            data=data.describe(),
            model={"source": recipe.model.source, "path": str(model.path), "origin": model.origin,
                   "format": model.format, "fingerprint": model.fingerprint},
            started=started.isoformat(timespec="seconds"),
            seconds=round(time.perf_counter() - t_start, 1),
        ),
    )
    report.timing = _timing(stages_info, bench_timing, bench_seconds, time.perf_counter() - t_start)
    if serving is not None:
        report.serving = serving
        report.timing["serving_seconds"] = round(serving_seconds, 1)  # within other_seconds
    write_reports(report, run_dir)
    write_model_cards(report, run_dir)
    write_file(run_dir / "manifest.json", json.dumps(report.manifest.model_dump(exclude_unset=True), indent=1,
                                                     default=str))
    return report.dump()
