"""What HTTP and Ray Serve cost a request at low load: the served p50 of one text per request,
sent one after another, against the same variant called in this process at batch 1.

    python eval/serving_overhead.py artifacts/bert_sentiment [--variant ID] [--requests 300]

Prints one line per configuration: p50 / p95 in ms and the difference to the in-process p50.
Run it with nothing else on the machine: it measures milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def _pcts(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return statistics.median(ms), ms[int(0.95 * (len(ms) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--variant", default=None)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import requests

    from compress.recipe.serving import ServingSpec
    from compress.serving.server import ray_session, resolve, start
    from compress.techniques.classify import load_classifier

    variant, folder, _, _ = resolve(args.run_dir, args.variant)
    texts = [line.split("\t")[0] for line in (Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "sst2"
                                             / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    texts = (texts * (args.requests // len(texts) + 1))[: args.requests]

    clf = load_classifier(folder, threads=args.threads)
    for t in texts[:20]:
        clf([t])
    inproc = []
    for t in texts:
        t0 = time.perf_counter()
        clf([t])
        inproc.append((time.perf_counter() - t0) * 1e3)
    base50, base95 = _pcts(inproc)
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
            p50, p95 = _pcts(served)
            print(f"{variant}: served {name}: p50 {p50:.2f} ms (+{p50 - base50:.2f} over in-process), p95 {p95:.2f} ms")


if __name__ == "__main__":
    main()
