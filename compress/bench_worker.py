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

# Lines the worker writes to stderr with this prefix are progress for the parent's log
# (compress.benchmark relays them); everything else on stderr is library chatter, kept
# only for the error message of a worker that dies.
PROGRESS_PREFIX = "@compress-progress "


class Phases:
    """Seconds per phase of one measurement (load, tokenize, warm-up, passes), and a plain
    progress line to stderr at least every `every` seconds while a phase runs. `step` is
    called between timed calls, never inside one."""

    def __init__(self, label: str, every: float):
        self.label, self.every = label, every
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()
        self._name, self._total, self._done, self._start = "", 0, 0, self._last

    def begin(self, name: str, total: int = 0) -> None:
        self.end()
        self._name, self._total, self._done, self._start = name, total, 0, time.perf_counter()

    def end(self) -> None:
        if self._name:
            self.seconds[self._name] = self.seconds.get(self._name, 0.0) + time.perf_counter() - self._start
            self._name = ""

    def step(self, n: int = 1) -> None:
        self._done += n
        now = time.perf_counter()
        if self.label and now - self._last >= self.every and self._done < self._total:
            from compress.console import progress_line

            self._last = now
            line = progress_line(f"{self.label}: {self._name}", self._done, self._total, now - self._start)
            sys.stderr.write(PROGRESS_PREFIX + line + "\n")
            sys.stderr.flush()


def _phases(spec: dict) -> Phases:
    return Phases(str(spec.get("label") or ""), float(spec.get("progress_seconds", 30)))


def _pad(enc: dict, idx: list[int], pad_id: int) -> dict[str, np.ndarray]:
    """Pads the examples `idx` to the longest of them: arrays [B, T] int64."""
    width = max(len(enc["input_ids"][i]) for i in idx)
    out = {}
    for key in ("text", "text_pair"):  # raw texts [B] for a predictor that takes them (a cascade)
        if key in enc:
            out[key] = np.array([enc[key][i] for i in idx], dtype=object)
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


def percentiles(ms: list[float]) -> dict:
    """p50, p95, p99 and mean of latencies in ms, and their count."""
    a = np.asarray(ms)
    return {
        "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "n": int(a.size),
    }


def _load(spec: dict):
    from compress.formats import load_predictor

    if spec["format"] not in ("onnx", "openvino"):  # those set their own thread count
        import torch

        torch.set_num_threads(int(spec["threads"]))
    # max_length: a predictor that tokenizes inside its call (a cascade's large member) cuts
    # its inputs where the benchmark cuts everyone's.
    options = {**spec.get("options", {}), "max_length": int(spec["max_length"])}
    return load_predictor(spec["format"], Path(spec["path"]), spec["device"], int(spec["threads"]), options)


def _read_eval(spec: dict) -> tuple[list[str], list[str] | None, np.ndarray]:
    rows = [json.loads(line) for line in Path(spec["eval_file"]).read_text().splitlines() if line]
    pairs = [r["pair"] for r in rows] if rows and "pair" in rows[0] else None
    return [r["text"] for r in rows], pairs, np.array([r["label"] for r in rows])


def _encode(pred, texts: list[str], pairs: list[str] | None, max_length: int) -> tuple[dict, int]:
    """Each variant's own tokenizer (a trimmed vocabulary has its own ids): {name: [[ids]]}, pad id."""
    tok = pred.tokenizer
    enc = tok(texts, pairs, truncation=True, max_length=max_length)
    enc = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if pred.input_names is not None:  # an ONNX graph may not take every tokenizer output
        enc = {k: v for k, v in enc.items() if k in pred.input_names}
    if getattr(pred, "takes_text", False):  # a cascade tokenizes for its large member itself
        enc["text"] = list(texts)
        if pairs is not None:
            enc["text_pair"] = list(pairs)
    return enc, tok.pad_token_id if tok.pad_token_id is not None else 0


def _latency_selection(n_rows: int, spec: dict) -> list[int]:
    """The eval sentences timed one by one: an evenly spaced selection, the same for every variant."""
    n_lat = min(n_rows, int(spec.get("max_latency_examples") or n_rows))
    return np.linspace(0, n_rows - 1, n_lat).round().astype(int).tolist()


def _warm_up(pred, batches: list[dict], n: int) -> None:
    """Untimed calls on the first `n` batches (at least one), then on one batch of every
    input shape among the rest: allocators, kernels, caches. A runtime can prepare its
    kernels for each shape on the first call of that shape: OpenVINO's CPU plugin compiles
    them (several times the call itself for a small encoder), a GPU picks kernels and grows
    its memory pool (p95/p99). A service that runs for hours pays that once per shape, so no
    timed call does."""
    calls = list(batches[: max(n, 1)])
    seen = {_shape(b) for b in calls}
    for b in batches[len(calls):]:
        if _shape(b) not in seen:
            seen.add(_shape(b))
            calls.append(b)
    for b in calls:
        pred(b)
    pred.sync()


def _shape(batch: dict) -> tuple:
    return tuple(v.shape for _, v in sorted(batch.items()))


def _timed(pred, batch: dict) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    logits = pred(batch)
    pred.sync()
    return (time.perf_counter() - start) * 1000.0, logits


# Sentences per turn when two models are timed alternately (measure_paired): long enough
# for a model's weights to be back in cache after the first call of its turn, short
# enough (0.2 s for the fp32 MiniLM baseline on 2 CPU threads) that a slow spell of the
# machine covers both. Turns of one sentence would have every call start with the other
# model's weights in the caches, which a model deployed alone never does.
PAIR_BLOCK = 20


def measure_paired(spec: dict) -> dict:
    """A later benchmark round that times the variant and a reference (the baseline) in one
    process, alternately, PAIR_BLOCK sentences each turn, the order swapped every turn
    (ABBA). Whatever else the machine is doing then slows both about equally, so the ratio
    of their latencies is steadier than that of two separate measurements."""
    ref_spec = {**spec, **spec["pair"]}
    ph = _phases(spec)
    ph.begin("load")
    preds = [_load(spec), _load(ref_spec)]
    texts, pairs, _ = _read_eval(spec)
    idx = _latency_selection(len(texts), spec)
    texts = [texts[i] for i in idx]  # only the selection is timed; nothing is scored here
    pairs = [pairs[i] for i in idx] if pairs is not None else None
    inputs = []  # per model: the selection as batches of one, with its own tokenizer
    for pred in preds:
        ph.begin("tokenize")
        enc, pad_id = _encode(pred, texts, pairs, int(spec["max_length"]))
        inputs.append([_pad(enc, [i], pad_id) for i in range(len(idx))])
        ph.begin("warm-up")
        _warm_up(pred, inputs[-1], int(spec["warmup"]))
    repeats = int(spec.get("latency_repeats", 1))
    ms = np.zeros((repeats, 2, len(idx)))  # [pass, model, sentence]
    ph.begin("latency round", repeats * 2 * len(idx))
    for rep in range(repeats):
        for turn, start in enumerate(range(0, len(idx), PAIR_BLOCK)):
            for m in ((0, 1) if turn % 2 == 0 else (1, 0)):
                for i in range(start, min(start + PAIR_BLOCK, len(idx))):
                    ms[rep, m, i] = _timed(preds[m], inputs[m][i])[0]
                    ph.step()
    ph.end()
    merged = np.median(ms, axis=0)  # [model, sentence]: per sentence, the median pass
    return {"ok": True, "sentence_ms": merged[0].tolist(), "pair_sentence_ms": merged[1].tolist(),
            "phase_seconds": ph.seconds}


def _finite(logits: np.ndarray) -> None:
    """NaN or infinite logits make argmax pick a class by position, which can still score
    near the majority rate: such a variant is failed, never scored."""
    bad = ~np.isfinite(logits).all(axis=-1)
    if bad.any():
        raise ValueError(f"the model gave NaN or infinite logits for {int(bad.sum())} of {len(bad)} eval "
                         f"sentences; its weights are broken")


def measure(spec: dict) -> dict:
    from sklearn.metrics import accuracy_score, f1_score

    from compress.predict import length_sorted_batches

    threads = int(spec["threads"])
    ph = _phases(spec)
    ph.begin("load")
    t0 = time.perf_counter()
    pred = _load(spec)
    load_s = time.perf_counter() - t0

    ph.begin("tokenize")
    texts, pairs, labels = _read_eval(spec)
    enc, pad_id = _encode(pred, texts, pairs, int(spec["max_length"]))
    lengths = np.array([len(x) for x in enc["input_ids"]])
    warmup = int(spec["warmup"])

    def timed_pass(batches: list[list[int]], phase: str) -> tuple[list[float], np.ndarray | None]:
        padded = [_pad(enc, b, pad_id) for b in batches]
        ph.begin("warm-up")
        _warm_up(pred, padded, warmup)
        # A predictor that routes inputs (a cascade) counts what it routed: start the
        # count after the warm-up so that it covers exactly the timed inputs.
        if hasattr(pred, "reset_counts"):
            pred.reset_counts()
        ph.begin(phase, sum(len(b) for b in batches))
        times, outs = [], []
        for b, batch in zip(batches, padded):
            ms, logits = _timed(pred, batch)
            times.append(ms)
            outs.append(logits)
            ph.step(len(b))
        ph.end()
        return times, outs

    # Batch 1: latency percentiles over real eval sentences (an evenly spaced selection).
    lat_idx = _latency_selection(len(texts), spec)
    n_lat = len(lat_idx)
    passes = [timed_pass([[i] for i in lat_idx], "latency (batch 1)") for _ in range(int(spec.get("latency_repeats", 1)))]
    lat_ms = np.median(np.array([t for t, _ in passes]), axis=0).tolist()  # [n_lat]: per sentence, the median pass
    if spec.get("latency_only"):  # a later benchmark round (compress.benchmark): the timings alone
        return {"ok": True, "sentence_ms": lat_ms, "phase_seconds": ph.seconds}
    latency = percentiles(lat_ms)

    # Accuracy is scored at batch 1, one request at a time as a latency-bound service runs:
    # a sentence's label then never depends on its neighbours (dynamic quantization scales
    # activations over the whole padded batch). The latency passes scored the selection;
    # the other sentences run once more, untimed. Logits [N, C].
    logits = np.zeros((len(texts), passes[0][1][0].shape[-1]), dtype=np.float32)
    logits[lat_idx] = np.concatenate(passes[0][1])
    rest = sorted(set(range(len(texts))) - set(lat_idx))
    routed_share = getattr(pred, "routed_share", None)  # a cascade: share sent to its large model
    if rest:
        logits[rest] = np.concatenate(timed_pass([[i] for i in rest], "accuracy (batch 1)")[1])
        if routed_share is not None:  # over the selection, then over the rest: weigh by rows
            routed_share = (routed_share * len(lat_idx) + pred.routed_share * len(rest)) / len(texts)
    _finite(logits)
    predictions = logits.argmax(-1)
    accuracy = float(accuracy_score(labels, predictions) * 100)

    batches_out = []
    for bs in sorted(set(int(b) for b in spec["batch_sizes"]) | {1}):
        if bs == 1:
            times, n, waste, acc = lat_ms, n_lat, 0.0, accuracy
        else:
            batches = length_sorted_batches(lengths, bs)
            times, outs = timed_pass(batches, f"throughput (batch {bs})")
            n = len(texts)
            real = sum(int(lengths[b].sum()) for b in batches)
            waste = 1.0 - real / sum(int(lengths[b].max()) * len(b) for b in batches)
            batch_logits = np.zeros_like(logits)
            for b, o in zip(batches, outs):
                batch_logits[b] = o
            _finite(batch_logits)
            acc = float(accuracy_score(labels, batch_logits.argmax(-1)) * 100)
        p = percentiles(times)
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
        "peak_memory_bytes": pred.peak_memory_bytes(),
        "accuracy": accuracy,
        "macro_f1": float(f1_score(labels, predictions, average="macro") * 100),
        "predictions": predictions.astype(int).tolist(),
        "latency_ms": latency,
        "sentence_ms": lat_ms,  # [n_lat] batch-1 latency per timed sentence, for merging rounds
        "batches": batches_out,
        "notes": pred.notes,
        "effective_device": getattr(pred, "effective_device", spec["device"]),
        **({"routed_share": routed_share} if routed_share is not None else {}),
        "phase_seconds": ph.seconds,  # where the measurement's time went (report.json `timing`)
    }


def _die_with_parent() -> None:
    """On Linux the kernel kills this worker when the run that started it dies, whatever
    killed that (SIGTERM, SIGKILL, an OOM kill), so no worker keeps writing into bench/
    after its run is gone. Set here rather than in a preexec_fn (Python code between fork
    and exec, which a Ctrl-C to the process group can interrupt); a parent that died before
    this line is caught by comparing the parent pid with the one the run passed."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl: the run's SIGTERM handler still stops it
        return
    parent = os.environ.get("COMPRESS_BENCH_PARENT", "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)


def main() -> None:
    _die_with_parent()
    spec_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(spec_path).read_text())
    from compress.console import quiet_libraries

    quiet_libraries()  # before any library loads: its warnings would end up as a dead worker's error
    from compress.sources import never_prompt

    never_prompt()  # a folder with custom code is an error here, never a question on stdin
    try:
        result = measure_paired(spec) if spec.get("pair") else measure(spec)
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
