"""bitsandbytes 4-bit models, as transformers saves them (safetensors with the packed
4-bit weights and their quantization state; `quantization_config` in config.json).

Loading needs no settings beyond the folder: transformers rebuilds the Linear4bit layers
from config.json. On the CPU, bitsandbytes (>= 0.47) runs 4-bit matmuls with its own CPU
kernels (faster ones come from the optional `kernels` package when installed).
"""

from __future__ import annotations

from pathlib import Path

from compress.formats.hf import TorchPredictor


# bitsandbytes quantizes in blocks of 64 weights along a row; its CPU kernels also tile
# the output dimension by 32 (bitsandbytes.functional._convert_weight_packed_for_cpu).
BLOCK_IN, BLOCK_OUT = 64, 32


def unpackable_layers(model) -> list[str]:
    """Names of Linear layers whose [out, in] shape the 4-bit CPU kernels cannot tile."""
    import torch

    return [
        name for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and (m.in_features % BLOCK_IN or m.out_features % BLOCK_OUT)
    ]


def count_4bit(model) -> int:
    import bitsandbytes as bnb

    return sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


class Bnb4bitPredictor(TorchPredictor):
    """A TorchPredictor whose weights are 4-bit: parameters and memory counted as such."""

    def __init__(self, path: Path, model, tokenizer, device: str):
        # The compute dtype is part of the stored config; no autocast on top of it.
        super().__init__(path, model, tokenizer, device, "fp32")
        self.effective_device = device
        q = getattr(model.config, "quantization_config", None)
        if q is not None:
            qd = q if isinstance(q, dict) else q.to_dict()
            self.notes.append(
                f"{qd.get('bnb_4bit_quant_type', '4-bit')} weights, compute {str(qd.get('bnb_4bit_compute_dtype', '')).replace('torch.', '')}"
            )

    def num_params(self) -> int:
        # A Params4bit holds packed bytes (two weights per byte); its quant_state has the
        # original shape [out, in].
        total = 0
        for p in self.model.parameters():
            state = getattr(p, "quant_state", None)
            total += int(state.shape.numel()) if state is not None else p.numel()
        return total

    def memory_bytes(self) -> int:
        return int(self.model.get_memory_footprint())


def check_backend(device: str) -> str | None:
    """Why 4-bit cannot run on `device` with the installed bitsandbytes, or None."""
    from importlib.metadata import version

    from packaging.version import Version

    have = Version(version("bitsandbytes"))
    if device == "cpu" and have < Version("0.47"):
        return f"bitsandbytes {have} has no CPU 4-bit kernels (0.47 or newer has); upgrade, or benchmark on a GPU"
    return None


def load(path: Path, device: str, threads: int, options: dict) -> Bnb4bitPredictor:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    problem = check_backend(device)
    if problem:
        raise RuntimeError(problem)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, use_safetensors=True, dtype=torch.float32, device_map={"": device},
        trust_remote_code=bool(options.get("trust_remote_code", False)),
    )
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(options.get("trust_remote_code", False)))
    return Bnb4bitPredictor(Path(path), model, tokenizer, device)
