"""`cascade`: tiered inference. The small variant (the `from` input) answers when its top
softmax probability is at least a threshold; every other input goes to the large variant
(`with.large`). The artifact is a small `cascade.json` naming both members, so nothing is
copied (see formats/cascade.py).

The threshold is chosen on the calibration slice (`ctx.data.calibration`, never the eval
split), one of two ways:
- `max_drop` (the default): the lowest threshold, i.e. the largest share answered by the
  small model, whose calibration accuracy stays within `max_drop` of the large model's.
  It reads labels, so on a slice of a few hundred sentences (one sentence = 0.1 to 0.2
  points) it follows the slice's luck;
- `route_share`: the small model's confidence at that quantile of the slice, so the share
  sent on (the cost) carries over to any data shaped like the slice, and the accuracy is
  what the benchmark then measures.
The benchmark measures the cascade for real on the eval split, like any other variant.

The members may tokenize differently (a trimmed vocabulary in front of the full one):
each member reads the text with its own tokenizer, here and in the benchmark.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeFloat, PositiveInt, model_validator

from compress.core.files import write_file
from compress.core.registry import StageConfig, StageKind, StageResult

MEMBER_FORMATS = ("hf", "torch_int8", "onnx", "openvino", "bnb_4bit")


class Config(StageConfig):
    large: str = Field(
        description="Stage id of the large variant that answers the inputs the small one "
        "(the `from` input) is unsure about; `model` for the recipe's model when it is a classifier."
    )
    threshold: float | None = Field(
        None, gt=0, le=1,
        description="Top softmax probability at which the small variant answers. Default: "
        "chosen on the calibration slice as the lowest threshold within `max_drop`.",
    )
    max_drop: NonNegativeFloat | None = Field(
        None,
        description="Calibration accuracy drop against the large variant allowed when choosing "
        "the threshold, in points. Default: half of budget.max_accuracy_drop, leaving room "
        "for the gap between calibration and eval data.",
    )
    route_share: float | None = Field(
        None, gt=0, lt=1,
        description="Share of inputs to send to the large variant: the threshold is the small variant's "
        "confidence at that quantile of the calibration slice, so the cost is set and the accuracy is "
        "measured. Chooses the threshold instead of `max_drop`, whose labelled calibration accuracy moves "
        "with each sentence of a small slice.",
    )
    calibration_examples: PositiveInt = Field(
        1000, description="Training examples (outside the training subset) for choosing the threshold."
    )
    max_length: PositiveInt = Field(128, description="Tokens per calibration example.")
    batch_size: PositiveInt = Field(64, description="Batch size of the calibration passes.")

    @model_validator(mode="after")
    def _one_rule(self):
        set_ = [k for k in ("threshold", "max_drop", "route_share") if getattr(self, k) is not None]
        if len(set_) > 1:
            raise ValueError(f"set one of threshold, max_drop and route_share, not {' and '.join(set_)}")
        return self

    def refs(self) -> dict[str, str]:
        return {"large": self.large}


class Result(StageResult):
    small: dict  # {stage, format, path}
    large: dict
    threshold: float
    calibration: dict  # accuracies and the small model's share on the calibration slice


def choose_threshold(
    confidence, small_correct, large_correct, max_drop: float
) -> tuple[float, dict]:
    """The lowest threshold t (the small model answers rows with confidence >= t) whose
    accuracy is within `max_drop` points of the large model's. Arrays [N]. Accuracy is not
    monotone in t, so every distinct confidence is tried. Returns (t, figures)."""
    import numpy as np

    conf = np.asarray(confidence, dtype=np.float64)
    small_c = np.asarray(small_correct, dtype=bool)
    large_c = np.asarray(large_correct, dtype=bool)
    large_acc = float(large_c.mean() * 100)
    # Descending confidences: taking the first k rows for the small model means t = conf[k-1].
    order = np.argsort(-conf, kind="stable")
    conf_sorted, s, l = conf[order], small_c[order], large_c[order]
    n = len(conf)
    # accuracy when the k most confident rows go to the small model, k = 0..N:
    # (small correct among the first k + large correct among the rest) / N.
    acc = (np.concatenate([[0], np.cumsum(s)]) + np.concatenate([[l.sum()], l.sum() - np.cumsum(l)])) / n * 100
    # A threshold only separates rows of different confidence: k must end a run of ties.
    valid = np.concatenate([[True], np.r_[conf_sorted[1:] < conf_sorted[:-1], True]])
    ok = np.flatnonzero(valid & (large_acc - acc <= max_drop + 1e-9))
    k = int(ok.max())  # k = 0 (everything to the large model) is always within the budget
    # k = 0: just above the highest calibration confidence, so the large model answers all of them.
    t = float(conf_sorted[k - 1]) if k > 0 else float(np.nextafter(conf_sorted[0], np.inf))
    curve = []
    for q in np.linspace(0, n, 11).round().astype(int):  # the trade-off at 0%, 10%, ... small share
        q = int(q)
        curve.append({"small_share": q / n, "accuracy": float(acc[q])})
    return t, {
        "large_accuracy": large_acc,
        "small_accuracy": float(small_c.mean() * 100),
        "cascade_accuracy": float(acc[k]),
        "small_share": k / n,
        "target_drop": max_drop,
        "curve": curve,
    }


def share_threshold(confidence, small_correct, large_correct, share: float) -> tuple[float, dict]:
    """The threshold that sends `share` of the rows (the least confident) to the large model:
    the small model's confidence at that quantile. Arrays [N]. A run of tied confidences at
    the cut goes to the small model whole. Returns (t, figures) as choose_threshold does."""
    import numpy as np

    conf = np.asarray(confidence, dtype=np.float64)
    small_c = np.asarray(small_correct, dtype=bool)
    large_c = np.asarray(large_correct, dtype=bool)
    ordered = np.sort(conf)
    k = int(round(share * len(conf)))  # rows routed
    t = float(ordered[k]) if k < len(conf) else float(np.nextafter(ordered[-1], np.inf))
    return t, {**at_threshold(t, conf, small_c, large_c), "target_share": share}


def at_threshold(t: float, conf, small_c, large_c) -> dict:
    """Calibration figures of a given threshold t (arrays [N]: confidence, and whether each
    member is right): both members' accuracy, the cascade's, and the share the small one answers."""
    answered = conf >= t
    return {
        "large_accuracy": float(large_c.mean() * 100),
        "small_accuracy": float(small_c.mean() * 100),
        "cascade_accuracy": float(((answered & small_c) | (~answered & large_c)).mean() * 100),
        "small_share": float(answered.mean()),
        "target_drop": None,
    }


def _member(art) -> dict:
    from compress.recipe.schema import MODEL_ID

    # Stage outputs live in the run folder under their id: stored relative to it, so the
    # run folder stays valid when moved. The recipe's model lives elsewhere: absolute.
    path = str(art.path.resolve()) if art.id == MODEL_ID else art.id
    return {"stage": art.id, "format": art.format, "path": path}


def run(ctx) -> Result:
    import json

    from compress.core.errors import StageError
    from compress.formats import load_predictor
    from compress.formats.cascade import SPEC_FILE, top_probability
    from compress.techniques.predict import predictor_logits

    cfg: Config = ctx.config
    small_art, large_art = ctx.input, ctx.refs["large"]
    if small_art.id == large_art.id:
        raise StageError(f"{ctx.stage_id}: with.large names the same stage as from ('{small_art.id}'); "
                         f"choose a larger variant")

    preds = {}
    for role, art in (("small", small_art), ("large", large_art)):
        # torch INT8 has CPU kernels only; the other formats calibrate where training runs.
        device = "cpu" if art.format == "torch_int8" else ctx.device
        try:
            preds[role] = load_predictor(art.format, art.path, device, ctx.threads,
                                         {"trust_remote_code": ctx.recipe.model.trust_remote_code})
        except Exception as exc:
            raise StageError(f"{ctx.stage_id}: cannot load the {role} variant '{art.id}' ({art.format}) on "
                             f"{device}: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    small, large = preds["small"], preds["large"]

    calib = ctx.data.calibration(cfg.calibration_examples)
    with ctx.progress(2 * len(calib), "calibration (small, then large)") as bar:
        # Each member reads the texts with its own tokenizer.
        small_logits = predictor_logits(small, calib, cfg.max_length, cfg.batch_size, bar.advance)  # [N, C]
        large_logits = predictor_logits(large, calib, cfg.max_length, cfg.batch_size, bar.advance)  # [N, C]
    conf = top_probability(small_logits)
    small_correct = small_logits.argmax(-1) == calib.labels
    large_correct = large_logits.argmax(-1) == calib.labels
    target = cfg.max_drop if cfg.max_drop is not None else ctx.budget.max_accuracy_drop / 2
    if cfg.route_share is not None:
        threshold, calibration = share_threshold(conf, small_correct, large_correct, cfg.route_share)
    else:
        threshold, calibration = choose_threshold(conf, small_correct, large_correct, target)
    if cfg.threshold is not None:  # fixed in the recipe: report what it does on calibration
        threshold = cfg.threshold
        calibration.update(at_threshold(threshold, conf, small_correct, large_correct))
    calibration.update({"examples": int(len(calib)), "threshold_from": "config" if cfg.threshold is not None else "calibration"})
    ctx.log(f"  calibration ({len(calib)} ex): small {calibration['small_accuracy']:.2f}, large "
            f"{calibration['large_accuracy']:.2f}, cascade {calibration['cascade_accuracy']:.2f} with "
            f"{calibration['small_share']:.0%} answered by '{small_art.id}' (threshold {threshold:.4f})")

    notes = routing_notes(calibration["small_share"], cfg, target, large_art.id)
    spec = {"small": _member(small_art), "large": _member(large_art), "threshold": threshold,
            "calibration": calibration}
    write_file(ctx.out / SPEC_FILE, json.dumps(spec, indent=1))
    return Result(format="cascade", small=spec["small"], large=spec["large"], threshold=threshold,
                  calibration=calibration, notes=notes)


def routing_notes(small_share: float, cfg: Config, target: float, large_id: str) -> list[str]:
    """What to tell the user when the chosen threshold leaves one member all the work: a
    cascade that routes nothing is its small member plus the large one's load time and memory."""
    if cfg.route_share is not None:  # the share was asked for
        return []
    if small_share == 0:
        return [f"the small variant answers no calibration input within the drop of {target:.2f} points; "
                f"every input goes to '{large_id}'"]
    if small_share == 1 and cfg.threshold is None:
        return [f"the small variant alone is within {target:.2f} points of '{large_id}' on the calibration "
                f"slice, so no input goes on: set `route_share` (or a lower `max_drop`) to send the least "
                f"confident inputs to '{large_id}'"]
    return []


KIND = StageKind(
    name="cascade",
    summary="Tiered inference: a small variant answers when confident, a large one the rest "
    "(threshold chosen on calibration data).",
    config=Config,
    result=Result,
    run=run,
    accepts=MEMBER_FORMATS,
    produces="cascade",
    ref_accepts=MEMBER_FORMATS,
    budget_keys=("max_accuracy_drop",),
)
