"""What a run was made of: versions, hardware, threads, seeds, data and model fingerprints."""

from __future__ import annotations

import os
import platform
from importlib import metadata

PACKAGES = (
    "compress", "torch", "transformers", "tokenizers", "safetensors", "accelerate", "datasets",
    "onnx", "onnxruntime", "onnxruntime-gpu", "optimum", "optimum-onnx", "openvino", "nncf", "bitsandbytes",
    "numpy", "scikit-learn", "pydantic",
)


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def int8_saturates() -> bool:
    """True on an x86-64 CPU without VNNI: ONNX Runtime's u8 x s8 MatMulInteger there sums
    pairs of products in int16 (vpmaddubsw), which saturates on full-range 8-bit weights; ORT
    advises 7-bit weights (reduce_range) on such CPUs."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return not {"avx512_vnni", "avx_vnni"} & set(_cpu()["isa"])


def _cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name") and model in ("", platform.machine(), platform.processor()):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "avx_vnni", "asimd", "sve") if f in flags]
    return {"model": model, "arch": platform.machine(), "cores": os.cpu_count(), "isa": isa}


def gpu() -> dict | None:
    """GPU name and memory when torch sees one (imports torch)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        p = torch.cuda.get_device_properties(0)
        return {"name": p.name, "memory_gb": round(p.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
                "cuda": torch.version.cuda}
    except Exception:
        return None


def hardware(with_gpu: bool = True) -> dict:
    try:
        import psutil

        mem = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:
        mem = None
    return {
        "cpu": _cpu(), "memory_gb": mem, "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(), "gpu": gpu() if with_gpu else None,
    }


def machine_key(hw: dict, vers: dict) -> dict:
    """What makes a timing comparable: the hardware and the runtime versions."""
    return {"cpu": hw["cpu"], "gpu": hw.get("gpu"), "versions": vers}
