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
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from compress.benchmark import _run_worker, write_eval_file
    from compress.data import Data
    from compress.decision import decide, paired_bootstrap
    from compress.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    run_dir = Path(args.artifacts) / recipe.name
    report = json.loads((run_dir / "report.json").read_text())
    data = Data(recipe.data, Path(args.recipe).resolve().parent)
    if data.holdout_check is None or len(data.holdout_check) == 0:
        print(f"{args.recipe}: data.holdout.check is 0: the recipe keeps no sentences back to check on")
        return 2
    check = copy.copy(data)
    check.eval = data.holdout_check
    check.eval_fingerprint = "holdout" + data.train_fingerprint[:9]
    labels = np.asarray(check.eval.labels)

    bench = report["manifest"]["recipe"]["benchmark"]
    rows = [r for r in report["rows"] if r["device"] == args.device and r.get("ok")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        eval_file = write_eval_file(check, folder)
        for r in rows:
            job = {
                "format": r["format"], "path": str(run_dir / r["id"]) if r["id"] != "model" else report["manifest"]["model"]["path"],
                "device": args.device, "threads": bench["threads"], "batch_sizes": [1],
                "max_length": bench["max_length"], "warmup": bench["warmup"], "max_latency_examples": 1,
                "latency_repeats": 1, "eval_file": str(eval_file), "options": {"cuda_dtype": bench["cuda_dtype"]},
            }
            results[r["id"]] = _run_worker(job, folder, r["id"], args.device, bench["threads"])

    base_id = report["budget"]["baseline"]
    base = results.get(base_id)
    if not base or not base.get("ok"):
        print(f"baseline '{base_id}' could not be scored: {base and base.get('error')}")
        return 1
    base_correct = np.array(base["predictions"]) == labels
    samples = int(bench["bootstrap_samples"])
    held = []
    for r in rows:
        m = results[r["id"]]
        h = copy.deepcopy(r)
        for k in ("verdict", "reasons"):
            h.pop(k, None)
        if not m.get("ok"):
            h.update(ok=False, error=m.get("error"))
        else:
            correct = np.array(m["predictions"]) == labels
            h["accuracy"] = m["accuracy"]
            h["delta"] = m["accuracy"] - base["accuracy"]
            h["delta_ci95"] = list(paired_bootstrap(base_correct, correct, samples))
        held.append(h)
    decision = decide(held, report["manifest"]["recipe"], [args.device])

    dev = {r["id"]: r for r in rows}
    print(f"held-out check: {len(labels)} whole sentences of the training split, never trained on, "
          f"calibrated on or scored by the run ({args.device}, {bench['threads']} threads, batch 1)")
    head = f"{'variant':<18}{'dev acc':>9}{'dev delta':>11}{'held acc':>10}{'held delta [95% CI]':>26}{'speed-up':>10}{'MB':>8}  verdict on dev / held-out"
    print(head)
    for h in held:
        d = dev[h["id"]]
        ci = h.get("delta_ci95")
        delta = "" if h.get("delta") is None else f"{h['delta']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
        sp = d.get("speedup_vs_baseline")
        print(f"{h['id']:<18}{d['accuracy']:>9.2f}{(d.get('delta') or 0):>+11.2f}{h.get('accuracy', float('nan')):>10.2f}"
              f"{delta:>26}{(f'{sp:.2f}x' if sp else '-'):>10}{d['size_mb']:>8.1f}  {d.get('verdict')} / {h.get('verdict')}")
    print(f"deployed on dev: {report['decision'].get('selected')}; on the held-out sentences: {decision.get('selected')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
