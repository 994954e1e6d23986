"""GGUF model sources: a `.gguf` file (llama.cpp's format), named by its path or shipped
inside an installed package (`package:MODULE` whose folder holds one), turned once into a
transformers folder (fp32 safetensors, tokenizer, chat template) that every stage loads.

transformers reads GGUF itself (`from_pretrained(folder, gguf_file=NAME)`, which needs the
`gguf` package) and dequantizes every tensor to fp32; this module only finds the file,
keeps the converted folder in a cache keyed by the file, and says what the file's weights
were quantized to: a model converted from a 4-bit GGUF carries that grid's rounding in
every weight, which the fp32 "baseline" of a report must state.

Finding the file and the cache folder imports nothing and no other compress module:
compress/recipe/peek.py finds GGUF sources through them (recipe validation reads an already
converted folder's config.json); the conversion imports transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from compress.core.errors import ModelSourceError
from compress.core.files import file_sha256

SUFFIX = ".gguf"
CACHE_ENV = "COMPRESS_GGUF_CACHE"  # folder of converted models; default ~/.cache/compress/gguf
SOURCE_FILE = "gguf_source.json"  # written last into a converted folder: what it came from

@dataclass(frozen=True)
class Converted:
    """A GGUF file converted to a transformers folder."""

    path: Path  # the converted folder
    gguf: Path  # the file it came from
    sha256: str  # of the GGUF file
    quantization: str  # the file's dominant tensor type ("Q4_1"), "F32", "F16" ...
    tensor_types: dict[str, int]  # tensor type -> count in the file

    @property
    def caveat(self) -> str:
        """What the conversion means for quality, in words ('' for a float file)."""
        if self.quantization in ("F32", "F16", "BF16", ""):
            return ""
        counts = ", ".join(f"{n} {t}" for t, n in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))
        grid = f"{bits(self.quantization)}-bit {self.quantization}" if bits(self.quantization) else self.quantization
        return (f"weights dequantized to fp32 from the GGUF's {grid} grid ({counts} tensors): "
                f"the fp32 baseline already carries that quantization's error")


def in_folder(root: Path) -> Path | None:
    """The GGUF file of a package folder that holds no transformers model (no config.json),
    or None. ModelSourceError when it holds several (which one is meant is unclear)."""
    if not root.is_dir() or (root / "config.json").is_file() or (root / "model" / "config.json").is_file():
        return None
    files = sorted(p for p in root.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(files) > 1:
        raise ModelSourceError(f"model.source: package folder '{root}' holds {len(files)} GGUF files "
                               f"({', '.join(p.name for p in files[:3])}); name one by its path instead")
    return files[0] if files else None


def from_path(source: str, base_dir: Path) -> Path | None:
    """The GGUF file a path source names (it ends in `.gguf`; relative to base_dir), or None
    for any other source. ModelSourceError when the file is not there."""
    if source.startswith("package:") or not source.lower().endswith(SUFFIX):
        return None
    path = Path(source).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if not path.is_file():
        raise ModelSourceError(f"model.source: no GGUF file '{path}'")
    return path


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV, "").strip()
    return Path(root).expanduser() if root else Path.home() / ".cache" / "compress" / "gguf"


def cache_folder(gguf: Path) -> Path:
    """Where `gguf` is (or would be) converted: keyed by the file's name, size and mtime (a
    changed or replaced file gets a new folder) and by the transformers version (its
    GGUF reader decides the weights), so no hashing is needed to find it."""
    st = gguf.stat()
    key = json.dumps([str(gguf.resolve()), st.st_size, st.st_mtime_ns, _transformers_version()])
    return cache_root() / f"{gguf.stem[:60]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def converted(gguf: Path) -> Converted | None:
    """The converted folder of `gguf` when it is complete, else None (nothing imported):
    its source record is there and every file it lists has the size recorded (a folder
    damaged or emptied since, or one of an older version without the list, is rebuilt)."""
    folder = cache_folder(gguf)
    try:
        info = json.loads((folder / SOURCE_FILE).read_text())
        files = info["files"]
        if not isinstance(files, dict) or not files or any(
                not isinstance(size, int) or (folder / name).stat().st_size != size for name, size in files.items()):
            return None
        return Converted(folder, gguf, info["sha256"], info["quantization"], dict(info["tensor_types"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _file_sizes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


class _ConversionLock:
    """One conversion of a file at a time (an flock beside its cache folder): a second run
    converting the same GGUF waits, then finds the folder the first one wrote."""

    def __init__(self, folder: Path):
        self.path = folder.parent / f".{folder.name}.lock"

    def __enter__(self):
        import fcntl

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a+")
        except OSError as exc:
            raise ModelSourceError(f"model.source: cannot write the GGUF cache {self.path.parent} "
                                   f"({exc.strerror or exc.__class__.__name__}); set {CACHE_ENV} to a writable "
                                   f"folder") from exc
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()


class _no_progress_bars:
    """TQDM_DISABLE for the duration (tqdm reads it when a bar is made)."""

    def __enter__(self):
        self.old = os.environ.get("TQDM_DISABLE")
        os.environ["TQDM_DISABLE"] = "1"

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = self.old


def convert(gguf: Path, log=lambda m: None) -> Converted:
    """The converted folder of `gguf`, converting it first when the cache has none. The
    folder is written under a temporary name and renamed when complete, so a run killed
    halfway leaves no folder that looks done; runs converting the same file take turns (a
    lock), and a folder left incomplete (no source record, a file of the wrong size) is
    replaced rather than trusted or left in the way."""
    done = converted(gguf)
    if done is not None:
        return done
    try:
        import gguf as _gguf  # noqa: F401 - transformers' GGUF reader needs it
    except ImportError as exc:
        raise ModelSourceError(f"model.source: '{gguf.name}' is a GGUF file; reading it needs the gguf package "
                               f"(pip install gguf)") from exc
    folder = cache_folder(gguf)
    with _ConversionLock(folder):
        done = converted(gguf)  # another run converted it while this one waited
        if done is not None:
            return done
        # Holding the lock, every temporary folder of this file is a dead run's.
        for stale in folder.parent.iterdir():
            if stale.name.startswith(f".{folder.name}.") and stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        log(f"  converting {gguf.name} to a transformers folder (once; cached in {folder})")
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            _write_converted(gguf, tmp)
            if folder.exists() or folder.is_symlink():  # incomplete (converted() said so): replace it
                trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
                folder.rename(trash / "folder")
                shutil.rmtree(trash, ignore_errors=True)
            tmp.rename(folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    done = converted(gguf)
    if done is None:
        raise ModelSourceError(f"model.source: the conversion of '{gguf}' in {folder} did not stay complete; "
                               f"check the disk, or set {CACHE_ENV} to another folder")
    return done


def _write_converted(gguf: Path, out: Path) -> None:
    """The transformers folder of `gguf` written into `out`, its source record last."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # transformers' GGUF reader draws its own tqdm bar per tensor; the caller's line says it all
        with _no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    except Exception as exc:  # an architecture transformers' GGUF reader does not know, a damaged file
        raise ModelSourceError(f"model.source: transformers cannot convert '{gguf}' "
                               f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); "
                               f"use a GGUF of an architecture transformers reads (llama, qwen2, gpt2 ...)") from exc
    _fix_special_tokens(tokenizer, gguf)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)  # the chat template travels in tokenizer_config.json / chat_template.jinja
    types = tensor_types(gguf)
    info = {"gguf": gguf.name, "sha256": file_sha256(gguf), "quantization": _dominant(types), "tensor_types": types,
            "transformers": _transformers_version(), "files": _file_sizes(out)}
    (out / SOURCE_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")


def _fix_special_tokens(tokenizer, gguf: Path) -> None:
    """Sets bos, eos, pad and whether a bos is prepended as the GGUF file says. transformers
    4.57's GGUF Llama tokenizer converter names the bos token as eos too, and prepends a bos
    to every text even when the file says not to (SmolLM2: eos would be <|im_start|>, and
    every perplexity window would start with a token the model never saw there)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields

    def scalar(key: str):
        f = fields.get(key)
        return f.contents() if f is not None else None

    tokens = fields["tokenizer.ggml.tokens"].contents() if "tokenizer.ggml.tokens" in fields else []
    for attr, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id")):
        tid = scalar(f"tokenizer.ggml.{key}")
        if isinstance(tid, int) and 0 <= tid < len(tokens):
            setattr(tokenizer, attr, tokens[tid])
    add_bos = scalar("tokenizer.ggml.add_bos_token")
    if isinstance(add_bos, bool) and hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = add_bos  # LlamaTokenizerFast rebuilds its post-processor


def tensor_types(gguf: Path) -> dict[str, int]:
    """Tensor type name -> how many tensors of the file have it (read from its header)."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for t in GGUFReader(str(gguf)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def _dominant(types: dict[str, int]) -> str:
    # Norms and biases are F32 in every quantized GGUF; the matrices' grid is what was chosen.
    quant = {t: n for t, n in types.items() if t not in ("F32", "F16", "BF16")}
    pool = quant or types
    return max(pool, key=lambda t: pool[t]) if pool else ""


def bits(quantization: str) -> int | None:
    """Bits per weight of a GGUF integer grid's name (Q4_1, Q4_K, IQ4_XS -> 4; Q8_0 -> 8), None
    for a float type (F32, F16, BF16)."""
    digits = quantization.removeprefix("I").removeprefix("Q") if quantization.startswith(("Q", "IQ")) else ""
    return int(digits[0]) if digits[:1].isdigit() else None


def _transformers_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return ""
