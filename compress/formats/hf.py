"""transformers sequence-classification folders (safetensors), run with torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compress.formats import Predictor


class TorchPredictor(Predictor):
    """Any torch nn.Module classifier: fp32 on the CPU, optional autocast on the GPU."""

    def __init__(self, path: Path, model, tokenizer, device: str, dtype: str = "fp32"):
        import torch

        super().__init__(path)
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.device = device
        self._torch = torch
        self._autocast = None
        if device == "cuda" and dtype in ("fp16", "bf16"):
            self._autocast = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
            self.notes.append(f"{dtype} autocast")

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        torch = self._torch
        inputs = {k: torch.from_numpy(v).to(self.device, non_blocking=True) for k, v in batch.items()}
        with torch.inference_mode():
            if self._autocast is not None:
                with torch.autocast("cuda", dtype=self._autocast):
                    logits = self.model(**inputs).logits
            else:
                logits = self.model(**inputs).logits
        return logits.float().cpu().numpy()

    def sync(self) -> None:
        if self.device == "cuda":
            self._torch.cuda.synchronize()

    def peak_memory_bytes(self) -> int | None:
        # torch's caching allocator counts every tensor it handed out on the GPU; each
        # variant is measured in a process of its own, so the peak is this variant's.
        return int(self._torch.cuda.max_memory_allocated()) if self.device == "cuda" else None

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def memory_bytes(self) -> int:
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)


def save(model, tokenizer, folder: Path) -> None:
    """Writes an `hf` artifact: safetensors weights, config and tokenizer (what load_model reads)."""
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def load_model(path: Path, trust_remote_code: bool = False):
    from transformers import AutoModelForSequenceClassification

    # safetensors only: never unpickle a weights file. trust_remote_code is always passed
    # (the recipe's): left unset, transformers asks on stdin whether to run a folder's code.
    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, use_safetensors=True, trust_remote_code=trust_remote_code, output_loading_info=True)
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    if problems:  # transformers would have initialised those at random, with a muted warning
        from compress.core.errors import ArtifactError

        kind, keys = next(iter(problems.items()))
        raise ArtifactError(f"{path}: {kind.replace('_', ' ')} in the weights ({', '.join(map(str, keys[:3]))}); "
                            f"its weights do not match its config.json: rebuild or replace the folder")
    return model


def only_head_initialised(model, info: dict, path: Path):
    """Checks the loading info of a model loaded for training with a new head: only the
    classification head may be missing or of another shape (a label count of its own); any
    other tensor transformers initialised at random is an error naming the folder."""
    from compress.core.errors import ModelSourceError

    head = ("classifier.", "score.", "pre_classifier.", "pooler.", "bert.pooler.", "roberta.pooler.")
    keys = list(info.get("missing_keys") or []) + [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys") or []]
    bad = [k for k in keys if not any(k.startswith(h) or f".{h}" in f".{k}" for h in head)]
    if bad:
        raise ModelSourceError(
            f"{path}: {len(bad)} weights are missing or do not match config.json's shapes (first: {bad[0]}); "
            f"transformers would initialise them at random: use the model's own config.json and weights"
        )
    return model


def load(path: Path, device: str, threads: int, options: dict) -> TorchPredictor:
    from transformers import AutoTokenizer

    trust = bool(options.get("trust_remote_code", False))
    return TorchPredictor(path, load_model(path, trust), AutoTokenizer.from_pretrained(path, trust_remote_code=trust),
                          device, options.get("cuda_dtype", "fp32"))
