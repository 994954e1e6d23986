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


def load_model(path: Path):
    from transformers import AutoModelForSequenceClassification

    # safetensors only: never unpickle a weights file.
    return AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True)


def load(path: Path, device: str, threads: int, options: dict) -> TorchPredictor:
    from transformers import AutoTokenizer

    return TorchPredictor(path, load_model(path), AutoTokenizer.from_pretrained(path), device, options.get("cuda_dtype", "fp32"))
