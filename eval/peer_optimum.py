"""Peer comparison: a compress run's chosen variant against what Optimum alone gives.

    python eval/peer_optimum.py artifacts/bert_sentiment [VARIANT] [--threads N] [--latency-examples N]

The peer starts from the same baseline folder and does what Optimum's documentation
shows: export with ORTModelForSequenceClassification, then ORTQuantizer dynamic INT8 with
the AutoQuantizationConfig preset of this CPU. Both are measured in this one process on
the same eval sentences (the run's benchmark eval file), with the same thread count, on
pre-tokenised inputs at batch 1 (latency) and scored on every sentence (accuracy), with a
paired bootstrap 95% interval of the accuracy difference (both score the same sentences).
Public APIs only; it prints its measurements and the ratios, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="run folder of a compress recipe (e.g. artifacts/bert_sentiment)")
    p.add_argument("variant", nargs="?", help="variant id (default: the report's selected variant)")
    p.add_argument("--threads", type=int, help="CPU threads (default: the run's benchmark threads)")
    p.add_argument("--latency-examples", type=int, default=300, help="eval sentences timed one by one")
    p.add_argument("--warmup", type=int, default=10)
    return p.parse_args()


def main() -> int:
    args = _args()
    run_dir = args.run_dir.resolve()
    report = json.loads((run_dir / "report.json").read_text())
    variant = args.variant or report["decision"]["selected"]
    if not variant:
        print(f"{run_dir}: the report selected no variant; name one", file=sys.stderr)
        return 2
    threads = args.threads or int(report["manifest"]["threads"])
    # Thread pools are fixed before any runtime starts (as the benchmark worker does).
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

    import numpy as np
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import AutoQuantizationConfig, ORTModelForSequenceClassification, ORTQuantizer

    from compress.decision.decide import paired_bootstrap
    from compress.formats import load_predictor
    from compress.stages.quantize_onnx import cpu_preset

    torch.set_num_threads(threads)
    base_id = report["budget"]["baseline"]
    marker = json.loads((run_dir / variant / "_complete.json").read_text())
    eval_files = sorted((run_dir / "bench").glob("eval-*.jsonl"), key=lambda p: p.stat().st_mtime)
    rows = [json.loads(line) for line in eval_files[-1].read_text().splitlines() if line]
    texts = [r["text"] for r in rows]
    labels = np.array([r["label"] for r in rows])
    max_length = int(report["manifest"]["recipe"]["benchmark"]["max_length"])

    ours = load_predictor(marker["format"], run_dir / variant, "cpu", threads)

    preset, why = cpu_preset()
    with tempfile.TemporaryDirectory(prefix="peer-optimum-") as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        exported = ORTModelForSequenceClassification.from_pretrained(run_dir / base_id, export=True)
        exported.save_pretrained(Path(tmp) / "fp32")
        quantizer = ORTQuantizer.from_pretrained(Path(tmp) / "fp32")
        quantizer.quantize(getattr(AutoQuantizationConfig, preset)(is_static=False), Path(tmp) / "int8")
        peer = ORTModelForSequenceClassification.from_pretrained(
            Path(tmp) / "int8", file_name="model_quantized.onnx", session_options=opts, provider="CPUExecutionProvider",
        )
        peer_size = sum(f.stat().st_size for f in (Path(tmp) / "int8").glob("*.onnx"))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(run_dir / base_id)
        peer_inputs = {i.name for i in peer.model.get_inputs()}

        def peer_call(batch):
            return peer(**{k: v for k, v in batch.items() if k in peer_inputs}).logits

        def our_call(batch):
            return ours({k: v for k, v in batch.items() if ours.input_names is None or k in ours.input_names})

        names = [f"compress:{variant}", f"optimum:{preset} dynamic INT8"]
        # Each side tokenizes with its own tokenizer (a trimmed vocabulary maps words to other ids).
        results = _measure([(our_call, ours.tokenizer), (peer_call, tok)], texts, labels, max_length,
                           args.latency_examples, args.warmup)
        results = dict(zip(names, results))
        for name, size in zip(names, (ours.size_bytes(), peer_size)):
            results[name]["size_mb"] = size / 1e6

    print(f"threads {threads}; preset {preset} ({why}); {len(texts)} eval sentences; "
          f"latency over {args.latency_examples} at batch 1")
    print(f"{'variant':<40} {'accuracy':>9} {'size MB':>9} {'p50 ms':>8} {'p95 ms':>8}")
    for name, r in results.items():
        print(f"{name:<40} {r['accuracy']:>9.2f} {r['size_mb']:>9.1f} {r['p50']:>8.2f} {r['p95']:>8.2f}")
    a, b = results.values()
    print(f"{'ratio compress / optimum':<40} {a['accuracy'] - b['accuracy']:>+9.2f} {a['size_mb'] / b['size_mb']:>9.2f} "
          f"{a['p50'] / b['p50']:>8.2f} {a['p95'] / b['p95']:>8.2f}   (accuracy as a difference in points)")
    # Both sides scored the same sentences, so the accuracy difference is judged on the
    # pairs: only the sentences the two get differently move it.
    lo, hi = paired_bootstrap(b["correct"], a["correct"], samples=10_000)  # acc(a) - acc(b)
    only_a, only_b = int((a["correct"] & ~b["correct"]).sum()), int((~a["correct"] & b["correct"]).sum())
    print(f"accuracy difference {a['accuracy'] - b['accuracy']:+.2f} points, paired bootstrap 95% interval "
          f"[{lo:+.2f}, {hi:+.2f}]; sentences only compress gets right: {only_a}, only optimum: {only_b}")
    return 0


def _measure(calls, texts, labels, max_length, n_latency, warmup) -> list[dict]:
    """Accuracy of each (call, tokenizer) on every sentence; then batch-1 latency with the
    calls taking turns of PAIR_BLOCK sentences, the order swapped every turn, as the
    benchmark's paired rounds do, so that load from other processes falls on both alike.
    Tokenization is done beforehand and not timed, as in the benchmark."""
    import numpy as np

    from compress.bench.worker import PAIR_BLOCK

    def batch(tok, i):
        enc = tok([texts[i]], truncation=True, max_length=max_length, return_tensors="np")
        return {k: v.astype(np.int64) for k, v in enc.items()}

    batches = [[batch(tok, i) for i in range(len(texts))] for _, tok in calls]
    out = []
    for (call, _), mine in zip(calls, batches):
        preds = np.array([int(np.asarray(call(b)).argmax(-1)[0]) for b in mine])
        out.append({"accuracy": float((preds == labels).mean() * 100), "correct": preds == labels})
    idx = np.linspace(0, len(texts) - 1, min(n_latency, len(texts))).round().astype(int)
    for i in idx[:warmup]:
        for (call, _), mine in zip(calls, batches):
            call(mine[i])
    times: list[list[float]] = [[] for _ in calls]
    for turn, start in enumerate(range(0, len(idx), PAIR_BLOCK)):
        order = range(len(calls)) if turn % 2 == 0 else reversed(range(len(calls)))
        for j in order:
            call, mine = calls[j][0], batches[j]
            for i in idx[start:start + PAIR_BLOCK]:
                t0 = time.perf_counter()
                call(mine[i])
                times[j].append((time.perf_counter() - t0) * 1000)
    for r, t in zip(out, times):
        r["p50"], r["p95"] = float(np.percentile(t, 50)), float(np.percentile(t, 95))
    return out


if __name__ == "__main__":
    sys.exit(main())
