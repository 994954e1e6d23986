"""Sequence classification (single texts or pairs): the first task.

Data columns: `text`, optional `pair`, `label` (a class id). A timed call is one forward
pass over a padded batch; the predictor returns logits [B, C]; a prediction is the argmax
class; quality is accuracy in percent, scored per sentence (correct 0/1, the paired
bootstrap's resampling unit), with macro-F1 beside it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress.core.task import Metric, Task

TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")
TEXT_KEYS = ("text", "text_pair")  # raw texts [B] for a predictor that tokenizes some inputs itself


class SequenceClassification(Task):
    name = "sequence-classification"
    metric = Metric(name="accuracy", direction="higher", unit="%", label="acc %", delta_unit="points",
                    better="more accurate", best="most accurate")
    secondary = (Metric(name="macro_f1", direction="higher", unit="%", label="macro-F1 %"),)
    columns = ("text", "pair", "label")
    workload = "one forward pass per padded batch (logits [B, C])"
    throughput_unit = "seq/s"
    scale = 100.0

    # --- data
    def eval_rows(self, split: Any) -> list[dict]:
        rows = []
        for i, text in enumerate(split.texts):
            row = {"text": text, "label": int(split.labels[i])}
            if split.pairs is not None:
                row["pair"] = split.pairs[i]
            rows.append(row)
        return rows

    def read_eval(self, rows: list[dict]) -> tuple[tuple[list[str], list[str] | None], np.ndarray]:
        pairs = [r["pair"] for r in rows] if rows and "pair" in rows[0] else None
        return ([r["text"] for r in rows], pairs), np.array([r["label"] for r in rows])

    def select(self, inputs: tuple[list[str], list[str] | None], idx: list[int]):
        texts, pairs = inputs
        return [texts[i] for i in idx], ([pairs[i] for i in idx] if pairs is not None else None)

    def encode(self, predictor: Any, inputs: tuple[list[str], list[str] | None], max_length: int) -> tuple[dict, int]:
        texts, pairs = inputs
        return encode(predictor, texts, pairs, max_length)

    def batch(self, encoded: tuple[dict, int], idx: list[int]) -> dict[str, np.ndarray]:
        enc, pad_id = encoded
        return pad(enc, idx, pad_id)

    def size(self, encoded: tuple[dict, int], i: int) -> int:
        return len(encoded[0]["input_ids"][i])

    # --- the workload
    def run(self, predictor: Any, batch: dict[str, np.ndarray]) -> np.ndarray:
        return predictor(batch)

    # --- scoring
    def check(self, outputs: np.ndarray) -> None:
        """NaN or infinite logits make argmax pick a class by position, which can still score
        near the majority rate: such a variant is failed, never scored."""
        bad = ~np.isfinite(outputs).all(axis=-1)
        if bad.any():
            raise ValueError(f"the model gave NaN or infinite logits for {int(bad.sum())} of {len(bad)} eval "
                             f"sentences; its weights are broken")

    def predictions(self, outputs: np.ndarray) -> np.ndarray:
        return outputs.argmax(-1)

    def quality(self, predictions: np.ndarray, targets: np.ndarray) -> float:
        from sklearn.metrics import accuracy_score

        return float(accuracy_score(targets, predictions) * 100)

    def secondary_scores(self, predictions: np.ndarray, targets: np.ndarray) -> dict[str, float]:
        from sklearn.metrics import f1_score

        return {"macro_f1": float(f1_score(targets, predictions, average="macro") * 100)}

    def example_scores(self, predictions: np.ndarray, targets: np.ndarray) -> np.ndarray:
        return np.asarray(predictions) == np.asarray(targets)  # [N] bool: correct or not


def encode(pred: Any, texts: list[str], pairs: list[str] | None, max_length: int) -> tuple[dict, int]:
    """Each variant's own tokenizer (a trimmed vocabulary has its own ids): {name: [[ids]]}, pad id."""
    tok = pred.tokenizer
    enc = tok(texts, pairs, truncation=True, max_length=max_length)
    enc = {k: v for k, v in enc.items() if k in TOKEN_KEYS}
    if pred.input_names is not None:  # an ONNX graph may not take every tokenizer output
        enc = {k: v for k, v in enc.items() if k in pred.input_names}
    if getattr(pred, "takes_text", False):  # a cascade tokenizes for its large member itself
        enc["text"] = list(texts)
        if pairs is not None:
            enc["text_pair"] = list(pairs)
    return enc, tok.pad_token_id if tok.pad_token_id is not None else 0


def pad(enc: dict, idx: list[int], pad_id: int) -> dict[str, np.ndarray]:
    """Pads the examples `idx` to the longest of them: arrays [B, T] int64."""
    width = max(len(enc["input_ids"][i]) for i in idx)
    out = {}
    for key in TEXT_KEYS:  # raw texts [B] for a predictor that takes them (a cascade)
        if key in enc:
            out[key] = np.array([enc[key][i] for i in idx], dtype=object)
    for key in TOKEN_KEYS:
        if key not in enc:
            continue
        fill = pad_id if key == "input_ids" else 0
        arr = np.full((len(idx), width), fill, dtype=np.int64)
        for row, i in enumerate(idx):
            seq = enc[key][i]
            arr[row, : len(seq)] = seq
        out[key] = arr
    return out


TASK = SequenceClassification()
