"""Measures one variant on one device, in a fresh process (`python -m compress.bench_worker
SPEC.json OUT.json`), so every variant starts from the same state: nothing cached from
another model, the thread count fixed before the framework starts, and the artifact
reloaded from disk exactly as a deployment would.

What is timed is the model call on a pre-tokenised, padded batch (tokenisation is the
same for every variant and left out), with device synchronisation where it applies.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _pad(enc: dict, idx: list[int], pad_id: int) -> dict[str, np.ndarray]:
    """Pads the examples `idx` to the longest of them: arrays [B, T] int64."""
    width = max(len(enc["input_ids"][i]) for i in idx)
    out = {}
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        if key not in enc:
            continue
        fill = pad_id if key == "input_ids" else 0
        arr = np.full((len(idx), width), fill, dtype=np.int64)
        for row, i in enumerate(idx):
            seq = enc[key][i]
            arr[row, : len(seq)] = seq
        out[key] = arr
    return out


def _percentiles(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {
        "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": int(a.size),
    }


def measure(spec: dict) -> dict:
    from sklearn.metrics import accuracy_score, f1_score

    from compress.formats import load_predictor
    from compress.train import length_sorted_batches

    threads = int(spec["threads"])
    if spec["format"] != "onnx":
        import torch

        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    pred = load_predictor(spec["format"], Path(spec["path"]), spec["device"], threads, spec.get("options", {}))
    load_s = time.perf_counter() - t0

    rows = [json.loads(line) for line in Path(spec["eval_file"]).read_text().splitlines() if line]
    texts = [r["text"] for r in rows]
    pairs = [r["pair"] for r in rows] if rows and "pair" in rows[0] else None
    labels = np.array([r["label"] for r in rows])
    tok = pred.tokenizer
    enc = tok(texts, pairs, truncation=True, max_length=int(spec["max_length"]))
    enc = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if pred.input_names is not None:  # an ONNX graph may not take every tokenizer output
        enc = {k: v for k, v in enc.items() if k in pred.input_names}
    lengths = np.array([len(x) for x in enc["input_ids"]])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    warmup = int(spec["warmup"])

    def timed_pass(batches: list[list[int]]) -> tuple[list[float], np.ndarray | None]:
        padded = [_pad(enc, b, pad_id) for b in batches]
        for b in padded[: max(warmup, 1)]:  # warm-up: allocators, kernels, caches
            pred(b)
        pred.sync()
        # A predictor that routes inputs (a cascade) counts what it routed: start the
        # count after the warm-up so that it covers exactly the timed inputs.
        if hasattr(pred, "reset_counts"):
            pred.reset_counts()
        times, outs = [], []
        for b in padded:
            start = time.perf_counter()
            logits = pred(b)
            pred.sync()
            times.append((time.perf_counter() - start) * 1000.0)
            outs.append(logits)
        return times, outs

    # Batch 1: latency percentiles over real eval sentences (an evenly spaced selection).
    n_lat = min(len(rows), int(spec.get("max_latency_examples") or len(rows)))
    lat_idx = np.linspace(0, len(rows) - 1, n_lat).round().astype(int).tolist()
    passes = [timed_pass([[i] for i in lat_idx]) for _ in range(int(spec.get("latency_repeats", 1)))]
    lat_ms = np.median(np.array([t for t, _ in passes]), axis=0).tolist()  # [n_lat]: per sentence, the median pass
    if spec.get("latency_only"):  # a later benchmark round (compress.benchmark): the timings alone
        return {"ok": True, "sentence_ms": lat_ms}
    latency = _percentiles(lat_ms)

    # Accuracy is scored at batch 1, one request at a time as a latency-bound service runs:
    # a sentence's label then never depends on its neighbours (dynamic quantization scales
    # activations over the whole padded batch). The latency passes scored the selection;
    # the other sentences run once more, untimed. Logits [N, C].
    logits = np.zeros((len(rows), passes[0][1][0].shape[-1]), dtype=np.float32)
    logits[lat_idx] = np.concatenate(passes[0][1])
    rest = sorted(set(range(len(rows))) - set(lat_idx))
    routed_share = getattr(pred, "routed_share", None)  # a cascade: share sent to its large model
    if rest:
        logits[rest] = np.concatenate(timed_pass([[i] for i in rest])[1])
        if routed_share is not None:  # over the selection, then over the rest: weigh by rows
            routed_share = (routed_share * len(lat_idx) + pred.routed_share * len(rest)) / len(rows)
    predictions = logits.argmax(-1)
    accuracy = float(accuracy_score(labels, predictions) * 100)

    batches_out = []
    for bs in sorted(set(int(b) for b in spec["batch_sizes"]) | {1}):
        if bs == 1:
            times, n, waste, acc = lat_ms, n_lat, 0.0, accuracy
        else:
            batches = length_sorted_batches(lengths, bs)
            times, outs = timed_pass(batches)
            n = len(rows)
            real = sum(int(lengths[b].sum()) for b in batches)
            waste = 1.0 - real / sum(int(lengths[b].max()) * len(b) for b in batches)
            batch_logits = np.zeros_like(logits)
            for b, o in zip(batches, outs):
                batch_logits[b] = o
            acc = float(accuracy_score(labels, batch_logits.argmax(-1)) * 100)
        p = _percentiles(times)
        entry = {
            "batch_size": bs, "throughput": n / (sum(times) / 1000.0),
            "p50_ms": p["p50"], "p95_ms": p["p95"], "p99_ms": p["p99"], "padding_waste": waste,
            "accuracy": acc,  # over the whole eval split, as this batch size runs it
        }
        if routed_share is not None:
            entry["routed_share"] = routed_share if bs == 1 else pred.routed_share
        batches_out.append(entry)

    return {
        "ok": True,
        "device": spec["device"],
        "threads": threads,
        "load_seconds": load_s,
        "size_bytes": pred.size_bytes(),
        "params": pred.num_params(),
        "memory_bytes": pred.memory_bytes(),
        "accuracy": accuracy,
        "macro_f1": float(f1_score(labels, predictions, average="macro") * 100),
        "predictions": predictions.astype(int).tolist(),
        "latency_ms": latency,
        "sentence_ms": lat_ms,  # [n_lat] batch-1 latency per timed sentence, for merging rounds
        "batches": batches_out,
        "notes": pred.notes,
        "effective_device": getattr(pred, "effective_device", spec["device"]),
        **({"routed_share": routed_share} if routed_share is not None else {}),
    }


def main() -> None:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = measure(spec)
    except Exception as exc:  # reported as a failed variant, not a failed run
        if os.environ.get("COMPRESS_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result = {"ok": False, "error": f"{exc.__class__.__name__}: {first}"[:300]}
    tmp = Path(out_path + ".part")
    tmp.write_text(json.dumps(result))
    tmp.rename(out_path)


if __name__ == "__main__":
    main()
