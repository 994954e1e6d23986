"""Model sources: a hub id, a local transformers folder, or `package:MODULE`, a model
shipped inside an installed Python package (the embedded default works offline).

Finding a source without a download and reading its files without loading a model is
compress/recipe/peek.py (recipe validation uses it too); this module resolves a source (hub
download included), fingerprints it and checks a folder before a stage loads it.
Frameworks are imported inside the functions that load a model.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compress.core.errors import ModelSourceError
from compress.tasks.causal_lm import gguf
from compress.recipe.peek import expand_user, folder_format, gguf_file, local_folder, missing_path_reason, safetensors_shapes

if TYPE_CHECKING:  # pragma: no cover
    from compress.recipe.schema import ModelSpec

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt", ".pth", ".h5", ".msgpack")


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    format: str  # "hf" (has a sequence-classification head) or "checkpoint"
    fingerprint: str
    origin: str  # how it was found, for the manifest


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def model_files(folder: Path) -> list[Path]:
    """The files under a model folder, leaving out compress's own run folders (a folder with a
    run lock or a completion marker): an --artifacts folder placed inside the model folder
    would otherwise change the model's fingerprint with every stage it writes (nothing is
    ever reused) and count the run's outputs in the model's size."""
    out = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not ((here / d / ".lock").exists() or (here / d / "_complete.json").exists()))
        out += [here / f for f in files if (here / f).is_file()]
    return sorted(out)


def fingerprint_files(folder: Path, suffixes: tuple[str, ...] | None = None) -> str:
    """sha256 over the names and contents of a folder's files (weights and configs)."""
    h = hashlib.sha256()
    for f in model_files(folder):
        if f.name.startswith(".") or (suffixes and f.suffix not in suffixes and f.suffix != ".json"):
            continue
        h.update(str(f.relative_to(folder)).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def resolve_model(spec: "ModelSpec", base_dir: Path, log=lambda m: None) -> ResolvedModel:
    """Find the model's folder, downloading from the hub only when online. A GGUF source
    is converted once to a cached transformers folder (compress/tasks/causal_lm/gguf.py)."""
    file = gguf_file(spec, base_dir)
    if file is not None:
        return _resolve_gguf(spec, file, log)
    folder = local_folder(spec, base_dir, import_package=True)
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
    elif origin == "local" and not expand_user(spec.source).exists() and not (base_dir / spec.source).exists():
        origin = "hub cache"
    fmt = folder_format(folder)
    return ResolvedModel(folder, fmt, fingerprint_files(folder, WEIGHT_SUFFIXES), origin)


def _resolve_gguf(spec: "ModelSpec", file: Path, log) -> ResolvedModel:
    done = gguf.convert(file, log)
    where = f"package {spec.source.split(':', 1)[1]}" if spec.source.startswith("package:") else "local"
    origin = f"{where}, GGUF {file.name} converted to fp32"
    if done.caveat:
        origin += f" ({done.caveat})"
    # The converted folder is ours and written once: the GGUF file's hash (with the
    # transformers version that converted it) names its content without hashing 0.5 GB.
    info = (done.path / gguf.SOURCE_FILE).read_bytes()
    return ResolvedModel(done.path, folder_format(done.path), hashlib.sha256(info).hexdigest(), origin)


# ---------------------------------------------------------------------------------------
# Checking a model folder before a stage loads it: a broken model is a one-line error that
# names the file, not a traceback from deep inside transformers.


def first_nonfinite(folder: Path) -> str | None:
    """'file: tensor' of the first floating-point weight holding NaN or an infinity in a
    folder's safetensors and ONNX files, or None when every weight is finite. A model with
    such weights scores by chance (every sentence one class) or crashes the next stage."""
    import numpy as np

    for f in sorted(folder.glob("*.safetensors")):
        import torch
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                t = fh.get_tensor(key)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    return f"{f.name}: {key}"
    for f in sorted(folder.glob("*.onnx")):
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(f), load_external_data=False)
        for init in model.graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                continue
            arr = numpy_helper.to_array(init)
            if arr.dtype.kind == "f" and not bool(np.isfinite(arr).all()):
                return f"{f.name}: {init.name}"
    return None


def check_model_folder(folder: Path, trust_remote_code: bool = False) -> None:
    """Checks that a model folder can be loaded as a text classifier: transformers reads
    its config, the config's model type has a sequence-classification class, the weights
    are complete, finite, named as transformers looks for them, and belong to that config
    (every tensor of the architecture present, with the config's shapes), and the
    tokenizer loads. Raises ModelSourceError naming the file. Nothing is unpickled, and
    no code from the folder runs unless `trust_remote_code` (the recipe's) is on.
    Every folder a recipe names (model, distill student) goes through this."""
    import copy

    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    if not folder.is_dir():
        raise ModelSourceError(f"model.source: {missing_path_reason(folder)}")
    cfg_file = folder / "config.json"
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except Exception as exc:  # unknown model_type, bad values, custom code: transformers' own message
        raise ModelSourceError(f"{cfg_file}: transformers cannot read it ({_first_line(exc)})")
    remote = trust_remote_code and bool(getattr(config, "auto_map", None))
    if not remote and type(config) not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING:
        raise ModelSourceError(
            f"{cfg_file}: model_type '{config.model_type}' has no sequence-classification model in "
            f"transformers; use a text encoder (BERT, RoBERTa, MiniLM, DistilBERT, ...)"
        )

    weights = sorted(folder.glob("*.safetensors"))
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl"))
    if not weights:
        if pickled:  # loading those means unpickling: never done with a user's file
            raise ModelSourceError(
                f"{folder / pickled[0]}: weights in a pickle format; compress loads safetensors only: convert them once "
                f"where you trust the file (save_pretrained(folder, safe_serialization=True))"
            )
        raise ModelSourceError(f"{folder}: no weights (model.safetensors); is it a complete transformers model folder?")
    if not (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").is_file():
        # transformers looks for exactly these; with neither it falls back to other files
        # (a pickle beside them), and every loader here passes use_safetensors=True.
        raise ModelSourceError(
            f"{weights[0]}: transformers loads model.safetensors (or shards listed in "
            f"model.safetensors.index.json), not this name; rename it to model.safetensors"
        )
    shapes: dict[str, list[int]] = {}
    for f in weights:
        shapes.update(safetensors_shapes(f))
    if not remote:
        import torch

        # The model's tensors, built on the meta device (no memory, no init). Tensor names do
        # not depend on `pruned_heads`, but shapes do, and transformers' pruning indexes with
        # a boolean mask, which the meta device cannot do: shapes are compared unpruned only.
        pruned = bool(getattr(config, "pruned_heads", None))
        probe = copy.deepcopy(config)
        probe.pruned_heads = {}
        classifier = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
        try:
            with torch.device("meta"):
                built = (AutoModelForSequenceClassification if classifier else AutoModel).from_config(probe)
            expected = {k: list(v.shape) for k, v in built.state_dict().items()}
        except Exception as exc:  # values transformers accepted but cannot build
            raise ModelSourceError(f"{cfg_file}: its settings do not build a model ({_first_line(exc)})")
        prefix = built.base_model_prefix if classifier else getattr(
            MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)], "base_model_prefix", "")
        found = {n.split(".", 1)[1] if not classifier and prefix and n.startswith(prefix + ".") else n: shape
                 for n, shape in shapes.items()}
        # A checkpoint saved without its pooler (BERT's masked-LM checkpoints) is usual: the
        # pooler is trained with the new head. Anything else missing would be initialised at
        # random without a word.
        optional = {k for k in expected if ".pooler." in f".{k}" or k.startswith("pooler.")} if not classifier else set()
        missing = [k for k in expected if k not in found and k not in optional and not k.endswith("position_ids")]
        if missing:
            raise ModelSourceError(
                f"{weights[0]}: the weights do not match config.json (model_type '{config.model_type}'): "
                f"{len(missing)} of {len(expected)} expected tensors missing (first: {missing[0]}); "
                f"is config.json from another model?"
            )
        wrong = [k for k in expected if not pruned and k in found and found[k] != expected[k]
                 and not k.endswith("position_ids")]
        if wrong:
            k = wrong[0]
            raise ModelSourceError(
                f"{weights[0]}: tensor '{k}' has shape {found[k]} but config.json makes it {expected[k]}; "
                f"{len(wrong)} tensors disagree with config.json (transformers would initialise them at random)"
            )
    bad = first_nonfinite(folder)
    if bad:
        raise ModelSourceError(f"{folder / bad.split(':')[0]}: weight '{bad.split(': ', 1)[1]}' holds NaN or "
                               f"infinite values; the model cannot give usable predictions: use an intact copy")
    try:
        AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelSourceError(f"{folder}: the tokenizer cannot be loaded ({_first_line(exc)}); "
                               f"the folder needs its tokenizer files (tokenizer.json or vocab)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else exc.__class__.__name__)[:200]


def never_prompt() -> None:
    """transformers asks on stdin "Do you wish to run the custom code? [y/N]" when a folder
    holds custom code and a loader was not told trust_remote_code; a `y` there (or in a
    piped stdin) would run it. Every loader here passes the recipe's setting; this turns
    any prompt that slips through into an error (in the run and in every benchmark worker)."""
    try:
        from transformers import dynamic_module_utils

        dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0
    except Exception:  # pragma: no cover - an older transformers without the prompt
        pass
