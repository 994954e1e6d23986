"""Tokenised examples and batched inference, in one place for every stage and format.

How a split becomes tokenised
examples (`encode`), and how logits over many examples are computed: in length-sorted
batches, each padded to its longest example (little compute spent on padding), scattered
back into the examples' own order. Calibration accuracy, teacher logits, importance
scores and cascade thresholds all go through here; training (compress/techniques/train.py) reads
the same tokenised examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from compress.formats import model_inputs

if TYPE_CHECKING:  # pragma: no cover
    from compress.tasks.classification.data import Split

# ---------------------------------------------------------------------------------------
# Tokenised data


@dataclass
class Encoded:
    """A tokenised split: one dict of token lists per example, plus labels and lengths."""

    features: list[dict]  # {input: [T] ids, "labels": int, "idx": row number}
    lengths: np.ndarray  # [N] tokens per example

    def __len__(self) -> int:
        return len(self.features)


def encode(tokenizer, split: "Split", max_length: int) -> Encoded:
    enc = tokenizer(split.texts, split.pairs, truncation=True, max_length=max_length)
    inputs = model_inputs(enc)
    features = [
        {**{k: v[i] for k, v in inputs.items()}, "labels": int(split.labels[i]), "idx": i}
        for i in range(len(split))
    ]
    lengths = np.array([len(f["input_ids"]) for f in features])
    return Encoded(features, lengths)


def collate(tokenizer):
    """Pads a list of features to the longest one in the batch (dynamic padding)."""
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer, return_tensors="pt")


def length_sorted_batches(lengths: np.ndarray, batch_size: int) -> list[list[int]]:
    """Deterministic batches for inference: examples sorted by length, then chunked."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


def padded_batches(data: Encoded, tokenizer, batch_size: int, labels: bool = False) -> Iterator[tuple[list[int], dict]]:
    """(row numbers, padded batch) over `data` in length-sorted batches: the batch holds the
    model inputs as tensors [B, T], and with `labels` the labels [B] too."""
    pad = collate(tokenizer)
    for idx in length_sorted_batches(data.lengths, batch_size):
        rows = [model_inputs(data.features[i]) for i in idx]
        if labels:
            rows = [{**row, "labels": data.features[i]["labels"]} for row, i in zip(rows, idx)]
        yield idx, pad(rows)


# ---------------------------------------------------------------------------------------
# Logits over many examples


def gather_logits(n: int, batches: Iterable[tuple[list[int], Any]], forward: Callable[[Any], np.ndarray],
                  on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """Logits [n, C] float32 in example order: `forward(batch)` gives [B, C] for each
    (row numbers, batch) of `batches`; `on_batch(B)` after each (a progress bar's advance)."""
    out: np.ndarray | None = None
    for idx, batch in batches:
        logits = forward(batch)
        if out is None:
            out = np.zeros((n, logits.shape[-1]), dtype=np.float32)
        out[idx] = logits
        if on_batch is not None:
            on_batch(len(idx))
    if out is None:
        raise ValueError("no examples to predict")
    return out


def predict_logits(model, tokenizer, data: Encoded, batch_size: int = 64, device: str = "cpu",
                   on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """Logits [N, num_labels] of a torch classifier over `data`, in the original example
    order. `on_batch(n)` after each batch of n examples (a progress bar's advance)."""
    import torch

    def forward(batch) -> np.ndarray:
        return model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu().numpy()

    model.eval()
    with torch.inference_mode():
        return gather_logits(len(data), padded_batches(data, tokenizer, batch_size), forward, on_batch)


def tokenize_for(predictor, texts: list[str], pairs: list[str] | None, max_length: int) -> dict[str, list]:
    """The texts as a loaded Predictor (compress.formats) takes them: its own tokenizer (a
    trimmed vocabulary has its own ids), only the inputs it takes: {input: [[ids]]}, unpadded."""
    enc = predictor.tokenizer(texts, pairs, truncation=True, max_length=max_length)
    return model_inputs(enc, predictor.input_names)


def predictor_logits(predictor, split: "Split", max_length: int, batch_size: int,
                     on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """Logits [N, C] of a loaded Predictor (compress.formats; any runtime) over a split, in
    length-sorted padded batches of int64 arrays [B, T]. `on_batch(n)` after each batch."""
    enc = tokenize_for(predictor, split.texts, split.pairs, max_length)
    lengths = np.array([len(x) for x in enc["input_ids"]])

    def batches() -> Iterator[tuple[list[int], dict]]:
        for idx in length_sorted_batches(lengths, batch_size):
            padded = predictor.tokenizer.pad([{k: v[i] for k, v in enc.items()} for i in idx], return_tensors="np")
            yield idx, {k: np.asarray(padded[k], dtype=np.int64) for k in enc}

    return gather_logits(len(lengths), batches(), lambda batch: np.asarray(predictor(batch)), on_batch)
