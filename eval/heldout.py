"""Scores a finished run's variants on whole sentences the run never used, and says what the
recipe would have deployed had those been its eval split.

    python eval/heldout.py recipes/bert_sentiment.yaml [--artifacts artifacts] [--set KEY=VALUE ...]

The sentences are the recipe's `data.holdout.check` carve: whole sentences of the training
split that, with every phrase of them, were kept out of all training and calibration, and
that the run's own benchmark never scored. Each variant is scored the way the benchmark
scores the eval split (a fresh worker process, batch 1, one sentence at a time), the delta
to the baseline gets a paired bootstrap interval, and the recipe's decision rule runs again
on those figures with the run's own speed, cost and size measurements. It prints the
measurements and nothing else.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> int:
    """Exit 0; 2 with one line on stderr for input it cannot use (a run without report.json,
    a recipe that does not validate); 1 when the baseline cannot be scored."""
    from compress.core.errors import CompressError

    try:
        return _main()
    except CompressError as exc:
        if os.environ.get("COMPRESS_DEBUG", "") not in ("", "0"):
            raise
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return exc.exit_code


def intact(run_dir: Path, vid: str, model_id: str) -> str:
    """'' when variant `vid` of the run may be scored, else why not: its id names no folder
    of the run (an edited report.json: `../elsewhere`), or its folder lacks a valid
    completion marker or no longer matches it (rebuilt, corrupt or edited since the run).
    The recipe's own model (`model_id`) lives outside the run folder and has none."""
    from compress.data.artifacts import ArtifactStore
    from compress.recipe.schema import SAFE_ID

    if vid == model_id:
        return ""
    if not SAFE_ID.match(vid):
        return "its id names no folder of the run"
    if (run_dir / vid).is_symlink():
        return "its folder is a symbolic link"
    marker, why = ArtifactStore(run_dir).check(vid)
    return "" if marker is not None else why


def _main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pooled", action="store_true",
                    help="also decide on the dev and held-out sentences pooled: what an eval split of both would settle")
    args = ap.parse_args()

    from compress.bench.benchmark import run_worker, write_eval_file
    from compress.tasks.classification.data import Data
    from compress.decision.decide import Policy, decide, rescored, stability, stability_note
    from compress.bench.measure import BenchJob, JobOptions, Measurement
    from compress.recipe.schema import MODEL_ID, BenchmarkSpec, BudgetSpec, load_recipe
    from compress.reports.report_json import read_report
    from compress.core.task import get_task

    recipe = load_recipe(args.recipe, args.overrides)
    task = get_task(recipe.task)
    metric = task.metric
    run_dir = Path(args.artifacts) / recipe.name
    report = read_report(run_dir)
    data = Data(recipe.data, Path(args.recipe).resolve().parent)
    if data.holdout_check is None or len(data.holdout_check) == 0:
        print(f"{args.recipe}: data.holdout.check is 0: the recipe keeps no sentences back to check on")
        return 2
    check = copy.copy(data)
    check.eval = data.holdout_check
    check.eval_fingerprint = "holdout" + data.train_fingerprint[:9]
    _, targets = task.read_eval(task.eval_rows(check.eval))

    bench = BenchmarkSpec.model_validate(report.manifest.recipe["benchmark"])
    rows = [r for r in report.rows if r.device == args.device and r.ok]
    results: dict[str, Measurement] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        eval_file = write_eval_file(check, folder, recipe.task)
        for k, r in enumerate(rows):
            why = intact(run_dir, r.id, MODEL_ID)
            if why:  # scoring it would score something other than what the run measured
                print(f"{r.id}: not scored: {why}; run `compress run {args.recipe}` again")
                results[r.id] = Measurement(ok=False, error=f"not scored: {why}")
                continue
            job = BenchJob(
                format=r.format, path=str(run_dir / r.id) if r.id != MODEL_ID else report.manifest.model["path"],
                device=args.device, threads=bench.threads, batch_sizes=[1], max_length=bench.max_length,
                warmup=bench.warmup, max_latency_examples=1, latency_repeats=1, eval_file=str(eval_file),
                options=JobOptions(cuda_dtype=bench.cuda_dtype), task=recipe.task,
            )
            # The worker's files in `folder` are named by position, never by the id the report gives.
            results[r.id] = run_worker(job, folder, f"v{k}", "heldout", bench.threads)

    base_id = report.budget.baseline
    base = results.get(base_id)
    if not base or not base.ok:
        print(f"baseline '{base_id}' could not be scored: {base and base.error}")
        return 1
    base_scores = task.example_scores(np.array(base.predictions), targets)
    held = []
    for r in rows:
        m = results[r.id]
        if not m.ok:
            h = r.model_copy(update={"ok": False, "error": m.error})
        else:  # the held-out quality, delta and interval; its scores feed the tie-break (decision.pick)
            h = rescored(r, task.example_scores(np.array(m.predictions), targets), base_scores, task,
                         bench.bootstrap_samples)
        h.verdict, h.reasons = None, []
        held.append(h)
    policy = Policy(budget=BudgetSpec.model_validate(report.manifest.recipe["budget"]), benchmark=bench,
                    task=recipe.task)
    decision = decide(held, policy, [args.device])

    dev = {r.id: r for r in rows}
    short = (metric.label or metric.name).split()[0]
    print(f"held-out check: {len(targets)} whole sentences of the training split, never trained on, "
          f"calibrated on or scored by the run ({args.device}, {bench.threads} threads, batch 1)")
    head = (f"{'variant':<18}{'dev ' + short:>9}{'dev delta':>11}{'held ' + short:>10}{'held delta [95% CI]':>26}"
            f"{'speed-up':>10}{'MB':>8}  verdict on dev / held-out")
    print(head)
    for h in held:
        d = dev[h.id]
        ci = h.delta_ci95
        delta = "" if h.delta is None else f"{h.delta:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
        sp = d.speedup_vs_baseline
        print(f"{h.id:<18}{d.quality:>9.2f}{(d.delta or 0):>+11.2f}{h.quality if h.ok else float('nan'):>10.2f}"
              f"{delta:>26}{(f'{sp:.2f}x' if sp else '-'):>10}{d.size_mb:>8.1f}  {d.verdict} / {h.verdict}")
    print(f"deployed on dev: {report.decision.selected}; on the held-out sentences: {decision.selected}")
    # A cascade against its large member on both sets: what its target reads (a share
    # routed, within so many points of the large member at a fraction of its $/1K).
    by_id = {h.id: h for h in held}
    for d in rows:
        large_id = (d.refs or {}).get("large")
        if d.routed_share is None or large_id not in by_id:
            continue
        h, big, m = by_id[d.id], by_id[large_id], results[d.id]
        if not (h.ok and big.ok):
            continue
        routed = f", routing {m.routed_share:.0%} of them" if m.routed_share is not None else ""
        cost = (f"; its $/1K {d.cost_vs_large:.2f}x the large member's (the run's timing"
                f"{', paired' if d.cost_vs_large_paired else ''})") if d.cost_vs_large else ""
        print(f"  {d.id}: {h.quality:.2f} against '{large_id}' {big.quality:.2f} on the held-out sentences "
              f"({task.delta(h.quality, big.quality):+.2f} {metric.delta_unit}){routed}; "
              f"{d.quality:.2f} against {dev[large_id].quality:.2f} on dev, routing {d.routed_share:.0%}{cost}")
    # How settled each pick is: the decision replayed on resamples of each eval set.
    resamples = bench.stability_resamples
    held_shares = (stability(held, policy, [args.device], decision.selected, len(targets), resamples=resamples)
                   if resamples else None)
    for where, shares, selected, n_resamples, n in (
        ("dev", report.decision.stability, report.decision.selected, report.decision.stability_resamples,
         len(data.eval)),
        ("held-out", held_shares, decision.selected, resamples, len(targets)),
    ):
        if shares and n_resamples:
            print(f"  {where}: {stability_note(shares, selected, n_resamples, n)}")
    if args.pooled:
        _pooled(task, data, run_dir, args.device, held, policy, bench)
    return 0


def _pooled(task, data, run_dir: Path, device: str, held: list, policy, bench) -> None:
    """The decision, and its stability, on the dev and held-out sentences together: each
    variant's dev scores (its measurement in the run's bench/ folder) followed by its held-out
    ones, the baseline's likewise, so that the pairing holds over both."""
    from compress.bench.benchmark import cached_measurement
    from compress.decision.decide import decide, rescored, stability, stability_note

    _, dev_targets = task.read_eval(task.eval_rows(data.eval))
    scores = {}  # id -> [N_dev + N_held]
    for h in held:
        m = cached_measurement(run_dir / "bench" / f"{h.id}.{device}.json", None)  # None: an edited file (broken checksum)
        if h.ok and m is not None and h._scores is not None:
            scores[h.id] = np.concatenate([task.example_scores(np.array(m.predictions), dev_targets), h._scores])
    base_scores = scores.get(policy.budget.baseline)
    if base_scores is None:
        print("pooled: the baseline's dev measurement is not in the run's bench/ folder")
        return
    pooled = [rescored(h, scores[h.id], base_scores, task, bench.bootstrap_samples) for h in held if h.id in scores]
    n = len(base_scores)
    decision = decide(pooled, policy, [device], eval_examples=n)
    print(f"pooled: {len(dev_targets)} dev and {n - len(dev_targets)} held-out sentences")
    for p in pooled:
        lo, hi = p.delta_ci95
        need = f" (passes on about {p.examples_to_pass:,} sentences, were the delta the same)" if p.examples_to_pass else ""
        print(f"  {p.id:<16}{p.quality:>7.2f}  {p.delta:+.2f} [{lo:+.2f}, {hi:+.2f}]  {p.verdict}{need}")
    print(f"deployed on the pooled sentences: {decision.selected}")
    resamples = bench.stability_resamples or 200
    shares = stability(pooled, policy, [device], decision.selected, n, resamples=resamples)
    if shares:
        print(f"  pooled: {stability_note(shares, decision.selected, resamples, n)}")


if __name__ == "__main__":
    sys.exit(main())
