"""From measurements to a decision: accuracy deltas with paired bootstrap intervals, the
cost of each variant at its best operating point, the budget checks, and the pick.

Pure functions over plain dicts, so `compress report` and `compress gate` can rerun them
from a saved report.json.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress.errors import EXIT_BUDGET, EXIT_OK
from compress.formats import RUNTIMES

OBJECTIVE_KEY = {"min_cost": "usd_per_1k", "min_latency": "p95_ms", "min_size": "size_mb"}


def paired_bootstrap(correct_a: np.ndarray, correct_b: np.ndarray, samples: int, seed: int = 0) -> tuple[float, float]:
    """95% interval of accuracy(b) - accuracy(a) in points, resampling examples together
    (the two models are scored on the same sentences, so their errors are paired)."""
    n = len(correct_a)
    rng = np.random.default_rng(seed)
    diff = correct_b.astype(np.float32) - correct_a.astype(np.float32)  # [N]
    deltas = np.empty(samples, dtype=np.float64)
    for start in range(0, samples, 200):  # chunks keep the index matrix small
        idx = rng.integers(0, n, size=(min(200, samples - start), n))
        deltas[start : start + idx.shape[0]] = diff[idx].mean(axis=1) * 100
    lo, hi = np.percentile(deltas, [2.5, 97.5])
    return float(lo), float(hi)


def operating_point(batches: list[dict], slo_ms: float | None) -> dict | None:
    """The cheapest operating point: the batch size with the best throughput (cost per
    inference is price / throughput) whose p95 batch latency meets the SLO; without an SLO,
    the best throughput. Ties go to the smaller batch (lower latency). None: no batch size
    meets the SLO."""
    ok = [b for b in batches if b["throughput"] > 0 and (slo_ms is None or b["p95_ms"] <= slo_ms)]
    return max(ok, key=lambda b: (b["throughput"], -b["batch_size"])) if ok else None


def usd_per_1k(usd_per_hour: float, throughput: float) -> float | None:
    """USD per 1,000 inferences on an instance billed per hour, running at `throughput`
    sequences per second all the time (None when nothing was measured)."""
    if throughput <= 0:
        return None
    return usd_per_hour / 3600.0 / throughput * 1000.0


def build_rows(
    variants: list[dict], results: dict[tuple[str, str], dict], labels: np.ndarray, recipe: dict
) -> list[dict]:
    """One row per variant and device. `variants`: [{id, stage, format, source}]."""
    budget, bench = recipe["budget"], recipe["benchmark"]
    base_id = budget["baseline"]
    rows = []
    for device in dict.fromkeys(d for (_, d) in results):
        base = results.get((base_id, device), {})
        base_correct = (np.array(base["predictions"]) == labels) if base.get("ok") else None
        for v in variants:
            r = results.get((v["id"], device))
            if r is None:
                continue
            row: dict[str, Any] = {**v, "runtime": RUNTIMES.get(v["format"], v["format"]), "device": device,
                                   "ok": bool(r.get("ok")), "notes": list(r.get("notes", []))}
            if not r.get("ok"):
                row["error"] = r.get("error", "unknown error")
                rows.append(row)
                continue
            price = bench["prices"].get(device)
            point = operating_point(r["batches"], budget.get("latency_p95_ms"))
            row.update({
                "accuracy": r["accuracy"],
                "macro_f1": r["macro_f1"],
                "size_mb": r["size_bytes"] / 1e6,
                "params": r["params"],
                "memory_mb": (r["memory_bytes"] / 1e6) if r.get("memory_bytes") else None,
                "peak_memory_mb": (r["peak_memory_bytes"] / 1e6) if r.get("peak_memory_bytes") else None,
                "latency_ms": {k: r["latency_ms"][k] for k in ("p50", "p95", "p99")},
                "latency_rounds_p50": r.get("latency_rounds_p50"),  # each round's p50; latency_ms merges them
                "p95_ms": r["latency_ms"]["p95"],
                "throughput": {str(b["batch_size"]): b["throughput"] for b in r["batches"]},
                "batches": r["batches"],
                "operating_point": point,
                "price": price,
                "usd_per_1k": usd_per_1k(price["usd_per_hour"], point["throughput"]) if price and point else None,
                "effective_device": r.get("effective_device", device),
                "load_seconds": r.get("load_seconds"),
            })
            by_batch = {b["batch_size"]: b["accuracy"] for b in r["batches"] if "accuracy" in b}
            if len(set(by_batch.values())) > 1:
                # Dynamic quantization scales activations over the whole padded batch, so a
                # sentence's label can depend on its neighbours: say so, with every figure.
                shown = ", ".join(f"batch {b} {a:.2f}%" for b, a in sorted(by_batch.items()))
                row["notes"].append(f"accuracy depends on the batch it runs in ({shown}); the table scores "
                                    f"batch 1, one request at a time")
            if r.get("routed_share") is not None:  # a cascade: share sent on to its large model
                row["routed_share"] = r["routed_share"]
                if not (v.get("refs") or {}).get("large"):  # else compare_members says it with the figures
                    row["notes"].append(f"{r['routed_share']:.0%} of the eval inputs went on to the large model")
            if base_correct is not None:
                correct = np.array(r["predictions"]) == labels
                row["delta"] = row["accuracy"] - base["accuracy"]
                row["delta_ci95"] = list(paired_bootstrap(base_correct, correct, bench["bootstrap_samples"]))
            rows.append(row)

    # Speed-ups against the baseline and against the variant's own input ("real gain").
    # Where the benchmark timed the variant alternately with the baseline (paired rounds),
    # the speed-up against the baseline is theirs, and the one against the input is the
    # quotient of the two variants' paired speed-ups: (base/variant) / (base/input).
    # Otherwise both are ratios of the separately measured p50s.
    by_key = {(r["id"], r["device"]): r for r in rows if r["ok"]}
    paired = {(vid, d): m["paired_speedup"]["speedup"] for (vid, d), m in results.items()
              if m.get("ok") and (m.get("paired_speedup") or {}).get("reference") == base_id}
    for r in rows:
        if not r["ok"]:
            continue
        key = (r["id"], r["device"])
        for name, ref_id in (("speedup_vs_baseline", base_id), ("speedup_vs_input", r.get("source"))):
            ref = by_key.get((ref_id, r["device"]))
            if not ref or ref is r:
                r[name] = None
            elif key in paired and (ref_id == base_id or (ref_id, r["device"]) in paired):
                r[name] = paired[key] / paired.get((ref_id, r["device"]), 1.0)
                r[name.replace("speedup", "paired")] = True
            else:
                r[name] = ref["latency_ms"]["p50"] / r["latency_ms"]["p50"]
        s = r.get("speedup_vs_input")
        if s is not None and s < 1.0:
            r["notes"].append(f"not faster than its input '{r['source']}' at batch 1 ({s:.2f}x)")
        if r.get("not_smaller"):  # the stage's own word (e.g. distill on ALBERT's shared layers)
            r["notes"].append(f"not smaller than its input '{r['source']}': {r['not_smaller']}")
        if r.get("effective_device") not in (None, r["device"]):
            r["notes"].append(f"runs on {r['effective_device']} although benchmarked on {r['device']} (fallback)")
    _compare_runtimes(variants, rows, results, labels, bench["bootstrap_samples"], paired)
    compare_members(rows)
    return rows


# Stages that change a model's runtime or graph but not what it computes (up to rounding),
# and those that quantize it: a variant's lineage through them says which variants of the
# other runtime are the same model at the same precision.
_CONVERSIONS = {"export_onnx", "optimize_onnx", "export_openvino"}
_QUANTIZATIONS = {"quantize_onnx", "quantize_openvino"}


def _lineage(vid: str, by_id: dict[str, dict]) -> tuple[str | None, bool] | None:
    """(the model the variant was converted from, whether it was quantized on the way), for
    an ONNX or OpenVINO variant; None for any other."""
    v = by_id.get(vid)
    if v is None or v["format"] not in ("onnx", "openvino"):
        return None
    quantized = False
    while v is not None and v["format"] in ("onnx", "openvino"):
        if v["stage"] not in _CONVERSIONS | _QUANTIZATIONS:
            return None  # a stage this comparison does not know
        quantized = quantized or v["stage"] in _QUANTIZATIONS
        source = v["source"]
        v = by_id.get(source)
    return source, quantized


def _compare_runtimes(variants: list[dict], rows: list[dict], results: dict, labels: np.ndarray, samples: int,
                      paired: dict) -> None:
    """Compares every OpenVINO row with its onnxruntime siblings on the same device: the
    variants converted from the same model and quantized (or not) the same way (e.g. OpenVINO
    INT8 of the baseline and onnxruntime INT8 of the baseline). Adds `vs_runtime` to the row,
    and a note: the accuracy difference with its paired bootstrap interval, the batch-1
    speed ratio (from the paired rounds, as speed-ups against the input are: the quotient of
    the two variants' paired speed-ups, with its range over the rounds) and the throughput
    ratio at the largest batch size."""
    by_id = {v["id"]: v for v in variants}
    lineage = {v["id"]: _lineage(v["id"], by_id) for v in variants}
    by_key = {(r["id"], r["device"]): r for r in rows if r["ok"]}
    for r in rows:
        if not r["ok"] or r["format"] != "openvino" or lineage.get(r["id"]) is None:
            continue
        siblings = [o for o in rows if o["ok"] and o["device"] == r["device"] and o["format"] == "onnx"
                    and lineage.get(o["id"]) == lineage[r["id"]]]
        for o in siblings:
            mine, theirs = results[(r["id"], r["device"])], results[(o["id"], o["device"])]
            correct = [np.array(m["predictions"]) == labels for m in (theirs, mine)]
            entry: dict[str, Any] = {
                "id": o["id"], "runtime": o["runtime"], "delta": r["accuracy"] - o["accuracy"],
                "delta_ci95": list(paired_bootstrap(correct[0], correct[1], samples)),
            }
            key, other = (r["id"], r["device"]), (o["id"], o["device"])
            if key in paired and other in paired:
                entry["speedup_b1"] = paired[key] / paired[other]
                entry["paired"] = True
                a, b = (results[k]["paired_speedup"].get("rounds") or [] for k in (key, other))
                if len(a) == len(b) and a:  # round i of both: timed in the same benchmark round
                    entry["speedup_b1_rounds"] = [x / y for x, y in zip(a, b)]
            else:
                entry["speedup_b1"] = by_key[other]["latency_ms"]["p50"] / r["latency_ms"]["p50"]
                entry["paired"] = False
            entry["throughput_ratio"] = {bs: t / o["throughput"][bs] for bs, t in r["throughput"].items()
                                         if o["throughput"].get(bs)}
            r.setdefault("vs_runtime", []).append(entry)
            lo, hi = entry["delta_ci95"]
            text = (f"vs {o['runtime']} '{o['id']}' (same model, same precision): accuracy "
                    f"{entry['delta']:+.2f} points [{lo:+.2f}, {hi:+.2f}]; batch 1 {entry['speedup_b1']:.2f}x as fast")
            rounds = entry.get("speedup_b1_rounds")
            if rounds:
                text += (f" (paired rounds {min(rounds):.2f}x to {max(rounds):.2f}x)" if len(rounds) > 1
                         else " (one paired round)")
            elif not entry["paired"]:
                text += " (separate p50s)"
            sizes = sorted(entry["throughput_ratio"], key=int)
            if sizes and sizes[-1] != "1":
                text += f"; batch {sizes[-1]} throughput {entry['throughput_ratio'][sizes[-1]]:.2f}x"
            r["notes"].append(text)


def compare_members(rows: list[dict]) -> None:
    """A cascade's row against its two members' rows on the same device, in place: the
    share of eval inputs routed to the large member, and accuracy and $/1K beside each
    member's (`members`, and a note). The small member is the row's `source`, the large
    one its `refs.large`."""
    by_key = {(r["id"], r["device"]): r for r in rows if r.get("ok")}
    for r in rows:
        large_id = (r.get("refs") or {}).get("large")
        if not r.get("ok") or r.get("routed_share") is None or not large_id:
            continue
        members = {role: by_key.get((vid, r["device"])) for role, vid in (("small", r.get("source")), ("large", large_id))}
        r["members"] = {role: None if m is None else {"id": m["id"], "accuracy": m["accuracy"],
                                                       "usd_per_1k": m.get("usd_per_1k")}
                        for role, m in members.items()}
        small, large = members["small"], members["large"]
        fig = [f"{r['routed_share']:.0%} of the eval inputs went on to '{large_id}'"]
        if small and large:
            fig.append(f"accuracy {r['accuracy']:.2f} against {small['accuracy']:.2f} ('{small['id']}') and "
                       f"{large['accuracy']:.2f} ('{large['id']}')")
            costs = (r.get("usd_per_1k"), small.get("usd_per_1k"), large.get("usd_per_1k"))
            if None not in costs:
                fig.append(f"$/1K {costs[0]:.5f} against {costs[1]:.5f} and {costs[2]:.5f} "
                           f"({costs[0] / costs[2]:.2f}x the large member's)")
        r["notes"].append("; ".join(fig))


def decide(rows: list[dict], recipe: dict, available_devices: list[str], eval_examples: int | None = None) -> dict:
    """Marks every row of the deciding device with a verdict and reasons; returns the decision.
    `eval_examples`: the eval split's size; under budget.min_eval_examples no variant is
    deployed (exit 3): a handful of sentences cannot tell a variant within budget from one
    that is not (one sentence of one is a 0-point delta with the interval [0, 0])."""
    budget = recipe["budget"]
    base_id = budget["baseline"]
    device = budget["device"]
    notes = []
    if device not in available_devices:
        notes.append(f"budget.device {device} was not benchmarked here; deciding on cpu")
        device = "cpu"
    key = OBJECTIVE_KEY[budget["objective"]]
    candidates, passing = [], []
    for r in rows:
        if r["device"] != device:
            r["verdict"], r["reasons"] = "reported", []
            continue
        if r["id"] == base_id:
            r["verdict"], r["reasons"] = ("baseline", []) if r["ok"] else ("failed", [r.get("error", "")])
            continue
        r["checks"] = budget_checks(r, budget)
        if not r["ok"]:
            reasons = [f"benchmark failed: {r.get('error')}"]
        else:
            reasons = [c["message"] for c in r["checks"] if c["status"] == "fail"]
            if r.get(key) is None:
                reasons.append(f"no {key} figure (no price for {device}?)")
        r["reasons"] = reasons
        candidates.append(r)
        if not reasons:
            passing.append(r)

    selected, tied, tolerance = pick(passing, key, budget)
    for r in candidates:
        if r is selected:
            r["verdict"] = "selected"
        elif r in passing:
            r["verdict"] = "within budget"
            if r in tied:
                # Accuracy or size decided the tie: name that figure of both.
                if r["accuracy"] < selected["accuracy"]:
                    why = f"more accurate ({selected['accuracy']:.2f}% vs {r['accuracy']:.2f}%)"
                else:
                    why = f"smaller ({selected['size_mb']:.1f} MB vs {r['size_mb']:.1f} MB)"
                if r is tied[0]:
                    r["reasons"] = [f"within budget and the best {_NAME[key]} ({_fmt(key, r[key])}), but "
                                    f"'{selected['id']}' is within {tolerance:.0%} of it and {why}"]
                else:
                    r["reasons"] = [f"within budget at {_fmt(key, r[key])}, within {tolerance:.0%} of the best "
                                    f"({_fmt(key, tied[0][key])}), but '{selected['id']}' is {why}"]
            else:
                r["reasons"] = [f"within budget, but {_fmt(key, r[key])} vs {_fmt(key, selected[key])} "
                                f"for '{selected['id']}'"]
        else:
            r["verdict"] = "rejected"
    minimum = int(budget.get("min_eval_examples") or 0)
    thin = selected is not None and eval_examples is not None and eval_examples < minimum
    if thin:
        notes.append(
            f"the evidence is too thin: the eval split has {eval_examples} sentence{'s' if eval_examples != 1 else ''}, "
            f"fewer than budget.min_eval_examples ({minimum}), so '{selected['id']}' is not deployed; give a larger "
            f"eval split, or set budget.min_eval_examples lower to accept it"
        )
        selected["verdict"] = "within budget"
        selected["reasons"] = [f"within budget, but not deployed: {eval_examples} eval sentences are fewer than "
                               f"budget.min_eval_examples ({minimum})"]
        selected = None
        tied = []
    if len(tied) > 1:
        best = tied[0]  # tied is ordered by the objective
        names = ", ".join(f"'{r['id']}'" for r in tied)
        notes.append(
            f"{names} are within {tolerance:.0%} of the best {_NAME[key]} ({_fmt(key, best[key])}, '{best['id']}'), "
            f"closer than timings repeat between runs (budget.tie_tolerance): the most accurate of them, "
            f"'{selected['id']}', is deployed"
        )

    # Within budget is not the same as better: a variant can keep the accuracy and still
    # cost more than the model it replaces (4-bit on a CPU dequantizes every matmul). The
    # selection stays (it answers "which compressed variant"), but the decision says so.
    base = next((r for r in rows if r["id"] == base_id and r["device"] == device and r["ok"]), None)
    if selected is not None and base is not None and base.get(key) is not None and selected[key] >= base[key]:
        notes.append(
            f"'{selected['id']}' is the best compressed variant within budget, but the baseline is no worse "
            f"on {budget['objective']} ({_fmt(key, selected[key])} vs {_fmt(key, base[key])}): "
            "keeping the baseline is as good a choice here"
        )

    # A compressing stage that says its output is no smaller (shared layers): a deployment
    # of it is not a size win, and the decision says so beside the pick.
    if selected is not None and selected.get("not_smaller"):
        notes.append(f"'{selected['id']}' is deployed, but it is not smaller than its input "
                     f"'{selected['source']}': {selected['not_smaller']}")

    best_failed = None
    if selected is None:
        scored = [r for r in candidates if r["ok"] and r.get("delta") is not None]
        if scored:
            best = max(scored, key=lambda r: r["delta"])
            best_failed = {"id": best["id"], "accuracy": best["accuracy"], "delta": best["delta"],
                           "p95_ms": best["p95_ms"], "size_mb": best["size_mb"], "usd_per_1k": best.get("usd_per_1k"),
                           "reasons": best["reasons"]}
            notes.append(
                f"no compressed variant is within budget; the closest is '{best['id']}' "
                f"({best['delta']:+.2f} points: {'; '.join(best['reasons'])})"
            )
        elif not thin:
            notes.append("no compressed variant could be measured")
    return {
        "device": device,
        "objective": budget["objective"],
        "selected": selected["id"] if selected else None,
        "tied": [r["id"] for r in tied],
        "tie_tolerance": tolerance,
        "best_failed": best_failed,
        "too_few_eval_examples": thin,
        "exit_code": EXIT_OK if selected else EXIT_BUDGET,
        "notes": notes,
    }


def pick(passing: list[dict], key: str, budget: dict) -> tuple[dict | None, list[dict], float]:
    """The variant to deploy among those within budget: (selected, the ones tied with the best
    on the objective, the tolerance that tied them).

    Timed figures ($/1K, p95) move between runs of the same recipe by more than the gaps
    between close variants (a 2-core cloud VM gave $/1K ratios of the same two variants
    0.72x in one run and 1.12x in the next), so picking the strict minimum flips the
    decision from run to run. Variants within `budget.tie_tolerance` of the best figure
    count as equal, and the tie goes to the higher accuracy, then the smaller size: both
    are the same on every run, so the pick among close variants repeats. Sizes are exact,
    so min_size takes no tolerance."""
    if not passing:
        return None, [], 0.0
    tolerance = 0.0 if key == "size_mb" else float(budget.get("tie_tolerance", 0.0))  # absent: an older report
    best = min(r[key] for r in passing)
    tied = sorted((r for r in passing if r[key] <= best * (1.0 + tolerance)), key=lambda r: (r[key], r["p95_ms"]))
    selected = max(tied, key=lambda r: (r["accuracy"], -r["size_mb"], -r[key], -r["p95_ms"]))
    return selected, tied, tolerance


CHECKS = ("accuracy budget", "latency SLO", "size limit")


def budget_checks(r: dict, budget: dict) -> list[dict]:
    """The budget checks of one candidate row, each {name, status, message} with status
    pass | fail | skipped (the budget sets no such limit) | error (not measured). decide()
    turns the failures into reasons; junit.py reports every check as a test case."""
    if not r["ok"]:
        msg = f"benchmark failed: {r.get('error')}"
        return [{"name": n, "status": "error", "message": msg} for n in CHECKS]
    out = []
    limit = budget["max_accuracy_drop"]
    if r.get("delta") is None or r.get("delta_ci95") is None:
        out.append({"name": CHECKS[0], "status": "fail",
                    "message": f"no accuracy delta: the baseline was not measured on {r['device']}"})
    else:
        ci_lower = budget.get("gate_on") == "ci_lower"
        gate = r["delta_ci95"][0] if ci_lower else r["delta"]
        drop = -gate + 0.0  # + 0.0: no "-0.00"
        what = "lower 95% bound of the accuracy delta" if ci_lower else "accuracy drop"
        if drop > limit:
            out.append({"name": CHECKS[0], "status": "fail",
                        "message": f"{what} {drop:.2f} points exceeds the budget of {limit:.2f}"})
        else:
            out.append({"name": CHECKS[0], "status": "pass",
                        "message": f"{what} {drop:.2f} points is within the budget of {limit:.2f}"})
    slo = budget.get("latency_p95_ms")
    if slo is None:
        out.append({"name": CHECKS[1], "status": "skipped", "message": "no latency SLO set (budget.latency_p95_ms)"})
    elif r["p95_ms"] > slo:
        out.append({"name": CHECKS[1], "status": "fail",
                    "message": f"p95 latency {r['p95_ms']:.2f} ms exceeds the SLO of {slo:.2f} ms"})
    elif r.get("operating_point") is None:
        out.append({"name": CHECKS[1], "status": "fail", "message": "no batch size meets the latency SLO"})
    else:
        out.append({"name": CHECKS[1], "status": "pass",
                    "message": f"p95 latency {r['p95_ms']:.2f} ms meets the SLO of {slo:.2f} ms "
                    f"(cheapest batch size within it: {r['operating_point']['batch_size']})"})
    max_mb = budget.get("max_size_mb")
    if max_mb is None:
        out.append({"name": CHECKS[2], "status": "skipped", "message": "no size limit set (budget.max_size_mb)"})
    elif r["size_mb"] > max_mb:
        out.append({"name": CHECKS[2], "status": "fail",
                    "message": f"size {r['size_mb']:.1f} MB exceeds the limit of {max_mb:.1f} MB"})
    else:
        out.append({"name": CHECKS[2], "status": "pass",
                    "message": f"size {r['size_mb']:.1f} MB is within the limit of {max_mb:.1f} MB"})
    return out


_NAME = {"usd_per_1k": "$/1K", "p95_ms": "p95 latency", "size_mb": "size"}


def _fmt(key: str, value: float) -> str:
    return {"usd_per_1k": f"${value:.5f}/1K", "p95_ms": f"p95 {value:.2f} ms", "size_mb": f"{value:.1f} MB"}[key]
