"""How each benchmarkable artifact format is loaded for inference.

A loader returns a Predictor: the tokenizer to use, a call that maps a padded batch
(numpy arrays [B, T]) to logits [B, num_labels], and what counts as the model on disk.
Loaders are named by module path so that importing this registry imports no framework.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

# The tokenizer outputs an encoder classifier takes, each [B, T] once padded (a model
# without segments, such as DistilBERT, has no token_type_ids).
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def model_inputs(features: Mapping[str, Any], names: Iterable[str] | None = None) -> dict[str, Any]:
    """The model inputs among `features` (a tokenizer's output, an example, a padded batch
    that also holds labels and row numbers), in their order. `names`: only those (the inputs
    an ONNX graph declares); None: every model input there is."""
    keep = MODEL_INPUTS if names is None else tuple(k for k in MODEL_INPUTS if k in names)
    return {k: v for k, v in features.items() if k in keep}


# format -> "module:function"; the function is load(path, device, threads, options) -> Predictor
LOADERS: dict[str, str] = {
    "hf": "compress.formats.hf:load",
    "torch_int8": "compress.formats.torch_int8:load",
    "cascade": "compress.formats.cascade:load",
    "onnx": "compress.formats.onnx:load",
    "bnb_4bit": "compress.formats.bnb_4bit:load",
    "openvino": "compress.formats.openvino:load",
}

# Causal LMs: format -> "module:function", load(path, device, threads, options) -> CausalLM
# (compress/formats/causal.py: the contract every causal-LM predictor keeps).
CAUSAL_LOADERS: dict[str, str] = {
    "hf": "compress.formats.causal:load_hf",
    "torch_int8": "compress.formats.torch_int8:load_causal",
    "torchao": "compress.formats.torchao:load_causal",
    "onnx": "compress.formats.causal_onnx:load",
    "genai": "compress.formats.genai:load",
    "gguf": "compress.formats.llamacpp:load",
}

# Formats with no GPU kernels: benchmarked on the CPU only (a note says so on a GPU machine).
CPU_ONLY = {
    "torch_int8": "torch dynamic INT8 has CUDA kernels for no layer",
    "openvino": "OpenVINO runs on Intel CPUs and GPUs, not on CUDA devices",
    "genai": "the onnxruntime-genai folder is built for the CPU",
    "torchao": "torchao's INT4 layout here is the CPU one",
    "gguf": "llama.cpp is built here for the CPU (the gguf extra)",
}

# The runtime that runs each format, named in every report row (the format alone does not
# say it: `hf` runs with torch, `onnx` with onnxruntime).
RUNTIMES = {
    "hf": "torch", "torch_int8": "torch", "bnb_4bit": "torch+bitsandbytes",
    "onnx": "onnxruntime", "openvino": "openvino", "cascade": "cascade",
    "torchao": "torch+torchao", "genai": "onnxruntime-genai", "gguf": "llama.cpp",
}

# Files that are tokenizer or bookkeeping, not model: left out of "size on disk".
NON_MODEL_FILES = {
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
    "merges.txt", "vocab.json", "sentencepiece.bpe.model", "spiece.model", "added_tokens.json",
    "result.json", "_complete.json", "gguf_source.json", "ort_config.json", "teacher_logits.npy", "README.md",
    "llamacpp.json",
}


class Predictor:
    """A loaded variant, ready to time. Subclasses set tokenizer and implement __call__."""

    tokenizer: Any
    device: str = "cpu"
    notes: list[str]
    input_names: tuple[str, ...] | None = None  # inputs the model takes; None: all the tokenizer gives
    # True: the batch must also carry the raw texts ("text", "text_pair": object arrays [B]),
    # because the predictor tokenizes some inputs itself (a cascade whose members tokenize differently).
    takes_text: bool = False

    def __init__(self, path: Path):
        self.path = path
        self.notes = []

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def sync(self) -> None:
        """Wait for queued device work (GPU), so that timings are real."""

    def num_params(self) -> int:  # pragma: no cover
        raise NotImplementedError

    def model_files(self) -> list[Path]:
        from compress.data.sources import model_files

        return [p for p in model_files(self.path) if p.name not in NON_MODEL_FILES and not p.name.startswith(".")]

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.model_files())

    def memory_bytes(self) -> int | None:
        """Bytes the loaded weights take in memory, where the format can tell."""
        return None

    def peak_memory_bytes(self) -> int | None:
        """Peak device memory since the process started (weights, activations, workspaces),
        where the runtime counts it: torch on a GPU. None elsewhere."""
        return None


def load_predictor(fmt: str, path: Path, device: str, threads: int, options: dict | None = None,
                   causal: bool = False) -> Predictor:
    table = CAUSAL_LOADERS if causal else LOADERS
    if fmt not in table:
        what = "a causal LM" if causal else "a classifier"
        raise ValueError(f"format '{fmt}' cannot be benchmarked as {what}; known: {', '.join(sorted(table))}")
    module, func = table[fmt].split(":")
    return getattr(importlib.import_module(module), func)(path, device, threads, options or {})


def write_labels(folder: Path, id2label: dict[int, str]) -> bool:
    """Records the class names (id2label / label2id) in a variant folder's config.json, so
    that transformers pipelines and Optimum answer `positive` rather than LABEL_1. Leaves a
    folder without config.json, or whose head has another label count, as it is; returns
    whether it wrote."""
    import json

    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    old = config.get("id2label")
    if isinstance(old, dict) and len(old) != len(id2label):
        return False
    config["id2label"] = {str(i): name for i, name in id2label.items()}
    config["label2id"] = {name: i for i, name in id2label.items()}
    from compress.core.files import write_file

    write_file(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return True
