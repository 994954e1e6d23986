"""What HTTP and Ray Serve cost a request at low load: the served p50 of one text per request,
sent one after another, against the same variant called in this process at batch 1.

    python eval/serving_overhead.py artifacts/bert_sentiment [--recipe recipes/bert_sentiment.yaml]
        [--variant ID] [--requests 300]

Prints one line per configuration: p50 / p95 in ms and the difference to the in-process p50.
Run it with nothing else on the machine: it measures milliseconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--recipe", type=Path, default=Path("recipes/bert_sentiment.yaml"),
                    help="The run's recipe: its eval split's texts are sent.")
    ap.add_argument("--variant", default=None)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import requests

    from compress.bench.worker import percentiles
    from compress.recipe.schema import load_recipe
    from compress.recipe.serving import ServingSpec
    from compress.tasks.classification.data import Data
    from compress.serving.server import ray_session, resolve, start
    from compress.techniques.classify import load_classifier

    variant, folder, _, _ = resolve(args.run_dir, args.variant)
    recipe = load_recipe(args.recipe)
    texts = Data(recipe.data, recipe.base_dir).eval.texts
    texts = (texts * (args.requests // len(texts) + 1))[: args.requests]

    clf = load_classifier(folder, threads=args.threads)
    for t in texts[:20]:
        clf([t])
    inproc = []
    for t in texts:
        t0 = time.perf_counter()
        clf([t])
        inproc.append((time.perf_counter() - t0) * 1e3)
    base = percentiles(inproc)
    base50, base95 = base.p50, base.p95
    print(f"{variant}: in-process batch 1, {args.threads} thread(s): p50 {base50:.2f} ms, p95 {base95:.2f} ms")
    del clf

    configs = [("one_hop, unbatched", {"topology": "one_hop", "max_batch_size": 1}),
               ("front_and_model, unbatched", {"topology": "front_and_model", "max_batch_size": 1}),
               ("one_hop, batched (8, 5 ms wait)", {"topology": "one_hop", "max_batch_size": 8,
                                                    "batch_wait_timeout_s": 0.005})]
    with ray_session():
        for name, server in configs:
            spec = ServingSpec.model_validate({"server": {**server, "threads": args.threads}, "cache": {"kind": "none"}})
            s = start(args.run_dir, spec, variant=variant)
            try:
                with requests.Session() as http:
                    for t in texts[:20]:
                        http.post(f"{s.url}/predict", json={"texts": [t]}, timeout=30).raise_for_status()
                    served = []
                    for t in texts:
                        t0 = time.perf_counter()
                        http.post(f"{s.url}/predict", json={"texts": [t]}, timeout=30).raise_for_status()
                        served.append((time.perf_counter() - t0) * 1e3)
            finally:
                s.stop()
            got = percentiles(served)
            p50, p95 = got.p50, got.p95
            print(f"{variant}: served {name}: p50 {p50:.2f} ms (+{p50 - base50:.2f} over in-process), p95 {p95:.2f} ms")


if __name__ == "__main__":
    main()
