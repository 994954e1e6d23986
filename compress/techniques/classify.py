"""Classify texts with a variant folder of a finished run, answering as a transformers
text-classification pipeline does: one [{"label": name, "score": probability}] per text.

    from compress.techniques.classify import load_classifier
    clf = load_classifier("artifacts/bert_sentiment/cascade")
    clf(["a gripping, beautifully shot film"])      # [[{"label": "positive", "score": 0.98}]]

A single-model folder (hf, ONNX, OpenVINO) loads with transformers or Optimum as well (see
docs/benchmark.md). A cascade folder has no such loader: its two members read the text with their
own tokenizers and a threshold sits between them, so this is how a selected cascade is
served; it names its members relative to the run folder, which must stay beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from compress.data.artifacts import ArtifactStore
from compress.formats import Predictor, load_predictor, model_inputs
from compress.formats.cascade import member_path, read_spec, top_probability


def folder_format(path: Path) -> str:
    """The variant format of a folder: its stage's completion marker when the folder is intact,
    else what its files are (a folder copied out of its run without the marker)."""
    from compress.core.errors import ArtifactError
    from compress.data.artifacts import MARKER

    marker, why = ArtifactStore(path.parent).check(path.name)
    if marker is not None:
        return marker["format"]
    if (path / MARKER).exists():  # sealed once, changed since: a half-written or edited output
        raise ArtifactError(f"{path}: {why}; it is not loaded: run the recipe again to rebuild it")
    if (path / "cascade.json").is_file():
        return "cascade"
    if any(path.glob("*.onnx")):
        return "onnx"
    if (path / "model.xml").is_file():  # what export_openvino writes (compress.formats.openvino)
        return "openvino"
    return "hf"


def label_names(path: Path, fmt: str) -> dict[int, str]:
    """id -> class name from the folder's config.json (a cascade: its small member's)."""
    if fmt == "cascade":
        path = member_path(read_spec(path)["small"], path)
    try:
        config = json.loads((path / "config.json").read_text())
        return {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


class Classifier:
    """Texts -> [{"label", "score"}] per text, the top class of the variant's softmax."""

    def __init__(self, predictor: Predictor, id2label: dict[int, str], max_length: int):
        self.predictor, self.id2label, self.max_length = predictor, id2label, max_length

    def __call__(self, texts: str | list[str]) -> list[list[dict]]:
        texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
        enc = self.predictor.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True,
                                       return_tensors="np")
        batch = {k: np.asarray(v, dtype=np.int64) for k, v in model_inputs(enc, self.predictor.input_names).items()}
        if getattr(self.predictor, "takes_text", False):  # a cascade whose members tokenize differently
            batch["text"] = np.array(texts, dtype=object)
        logits = np.asarray(self.predictor(batch))  # [B, C]
        return [[{"label": self.id2label.get(int(i), f"LABEL_{int(i)}"), "score": float(p)}]
                for i, p in zip(logits.argmax(axis=-1), top_probability(logits))]


def load_classifier(path: str | Path, device: str = "cpu", threads: int | None = None,
                    max_length: int = 128) -> Classifier:
    """A Classifier over the variant folder `path` (any format the benchmark measures)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such variant folder; give a stage folder of a finished run")
    fmt = folder_format(path)
    pred = load_predictor(fmt, path, device, threads or os.cpu_count() or 1, {"max_length": max_length})
    return Classifier(pred, label_names(path, fmt), max_length)
