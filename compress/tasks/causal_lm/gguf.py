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
import re
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
    quantization: str  # the file's declared type ("Q4_1", "Q4_K_M"), else its commonest tensor type; "F16" ...
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
    or None. ModelSourceError when it holds several (which one is meant is unclear).

    A file too large for one package may be shipped as byte chunks, `NAME.gguf.part00`,
    `.part01` ... in the package's own tree or in companion packages named `<package>_part1`,
    `<package>_part2` ... (PyPI's per-file size limit): they are joined once into
    `<cache>/assembled/NAME.gguf` (checked against a SHA256SUMS file of the package when it
    lists NAME) and that file is the source."""
    if not root.is_dir() or (root / "config.json").is_file() or (root / "model" / "config.json").is_file():
        return None
    files = sorted(p for p in root.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(files) > 1:
        raise ModelSourceError(f"model.source: package folder '{root}' holds {len(files)} GGUF files "
                               f"({', '.join(p.name for p in files[:3])}); name one by its path instead")
    if files:
        return files[0]
    split = chunks(root)
    if not split:
        return None
    if len(split) > 1:
        raise ModelSourceError(f"model.source: package '{root.name}' holds chunks of {len(split)} GGUF files "
                               f"({', '.join(sorted(split)[:3])}); name one joined file by its path instead")
    (name, parts), = split.items()
    return assemble(root, name, parts)


_CHUNK = re.compile(r"(?P<name>.+\.gguf)\.part(?P<index>\d+)", re.IGNORECASE)


def companions(root: Path) -> list[Path]:
    """The folders of installed top-level packages `<root.name>_part0`, `_part1` ... found
    without importing them; three missing numbers in a row end the search (one missing in
    the middle is a package not installed, which `chunks` names)."""
    from importlib.machinery import PathFinder

    out: list[Path] = []
    misses, i = 0, 0
    while misses < 3:
        try:
            spec = PathFinder.find_spec(f"{root.name}_part{i}")
        except (ImportError, ValueError, OSError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        misses = 0 if locations else misses + 1
        out += [Path(locations[0])] if locations else []
        i += 1
    return out


def chunks(root: Path) -> dict[str, list[Path]]:
    """GGUF file name -> its chunk files in order, from the package folder's tree and its
    companion packages'. ModelSourceError when a chunk in the middle is missing (a
    companion package not installed)."""
    found: dict[str, dict[int, Path]] = {}
    for folder in [root, *companions(root)]:
        for p in folder.rglob("*"):
            m = _CHUNK.fullmatch(p.name)
            if m and p.is_file():
                found.setdefault(m["name"], {})[int(m["index"])] = p
    out: dict[str, list[Path]] = {}
    for name, by_index in found.items():
        first, last = min(by_index), max(by_index)
        missing = [i for i in range(first, last + 1) if i not in by_index]
        if first > 1 or missing:
            gap = missing[0] if missing else 0
            raise ModelSourceError(f"model.source: chunk {gap} of {name} is missing (found {sorted(by_index)}); "
                                   f"install every `{root.name}_partN` package")
        out[name] = [by_index[i] for i in range(first, last + 1)]
    return out


def _listed_sha256(root: Path, name: str) -> str | None:
    for sums in root.rglob("SHA256SUMS*"):
        try:
            for line in sums.read_text(errors="replace").splitlines():
                digest, _, listed = line.strip().partition(" ")
                if listed.strip().lstrip("*") == name and re.fullmatch(r"[0-9a-fA-F]{64}", digest):
                    return digest.lower()
        except OSError:
            continue
    return None


def assemble(root: Path, name: str, parts: list[Path]) -> Path:
    """`name` joined from `parts` in the cache, once: a joined file whose record lists the
    same chunks (path, size, mtime) is reused without reading it; otherwise the chunks are
    copied under a temporary name, hashed on the way, checked and renamed."""
    target = cache_root() / "assembled" / name
    record = target.with_name(f"{name}.chunks.json")
    stamp = [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in parts]
    try:
        if json.loads(record.read_text()) == stamp and target.stat().st_size == sum(s for _, s, _ in stamp):
            return target
    except (OSError, ValueError):
        pass
    with _ConversionLock(target):
        tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as fh:
                        for block in iter(lambda: fh.read(1 << 22), b""):
                            digest.update(block)
                            out.write(block)
            want = _listed_sha256(root, name)
            if want is not None and digest.hexdigest() != want:
                raise ModelSourceError(f"model.source: the chunks of {name} in package '{root.name}' join to a file "
                                       f"whose sha256 is not the one its SHA256SUMS lists; reinstall the packages")
            tmp.rename(target)
            record.write_text(json.dumps(stamp))
        except OSError as exc:
            raise ModelSourceError(f"model.source: cannot join the chunks of {name} into {target} "
                                   f"({exc.strerror or exc.__class__.__name__}); set {CACHE_ENV} to a writable "
                                   f"folder with room") from exc
        finally:
            tmp.unlink(missing_ok=True)
    return target


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


class _one_reader:
    """gguf.GGUFReader memoised per path for the duration: transformers parses the file's whole
    header again for the config, the weights and the tokenizer (27 s each for a 262k-entry
    vocabulary), and never changes the reader it gets."""

    def __enter__(self):
        import gguf as lib

        self.lib, self.real, memo = lib, lib.GGUFReader, {}
        real = self.real

        def reader(path, mode="r"):
            key = (str(path), mode)
            if key not in memo:
                memo[key] = real(path, mode)
            return memo[key]

        lib.GGUFReader = reader

    def __exit__(self, *exc):
        self.lib.GGUFReader = self.real


def _write_converted(gguf: Path, out: Path) -> None:
    """The transformers folder of `gguf` written into `out`, its source record last."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # transformers' GGUF reader draws its own tqdm bar per tensor; the caller's line says it all
        with _no_progress_bars(), _one_reader():
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    except Exception as exc:  # an architecture transformers' GGUF reader does not know, a damaged file
        raise ModelSourceError(f"model.source: transformers cannot convert '{gguf}' "
                               f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); "
                               f"use a GGUF of an architecture transformers reads (llama, qwen2, gpt2 ...)") from exc
    tokenizer = _spm_as_bpe(tokenizer, read_header(gguf))
    _fix_special_tokens(tokenizer, gguf)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)  # the chat template travels in tokenizer_config.json / chat_template.jinja
    types = tensor_types(gguf)
    info = {"gguf": gguf.name, "sha256": file_sha256(gguf), "quantization": file_type(gguf) or _dominant(types),
            "tensor_types": types,
            "transformers": _transformers_version(), "files": _file_sizes(out)}
    (out / SOURCE_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")


def spm_bpe(header: Header):
    """llama.cpp's SentencePiece tokenizer of a GGUF (`tokenizer.ggml.model: llama`) as a
    tokenizers BPE: llama.cpp merges the adjacent pair whose joined piece is in the vocabulary
    with the highest score, so every split (a, b) of a normal piece is a merge ranked by that
    piece's score. User-defined pieces (newline and space runs) and control tokens are matched
    whole before it, as llama.cpp does. [V] vocabulary, ~2V merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    tokens, scores, types = (header.array(f"tokenizer.ggml.{k}") for k in ("tokens", "scores", "token_type"))
    vocab = {t: i for i, t in enumerate(tokens)}
    normal = {t for t, ty in zip(tokens, types) if ty == 1}
    ranked = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty == 1 and len(t) > 1:
            ranked += [(-scores[i], vocab[t[:k]], vocab[t[k:]]) for k in range(1, len(t))
                       if t[:k] in normal and t[k:] in normal]
    ranked.sort()
    unk = header.kv.get("tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(vocab=vocab, merges=[(tokens[a], tokens[b]) for _, a, b in ranked],
                     unk_token=tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None,
                     byte_fallback=True, fuse_unk=True)
    tk = Tokenizer(bpe)
    steps = [normalizers.Replace(" ", "\u2581")]
    if header.kv.get("tokenizer.ggml.add_space_prefix", True) is True:
        steps.insert(0, normalizers.Prepend("\u2581"))
    tk.normalizer = normalizers.Sequence(steps)
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tk


def _spm_as_bpe(tokenizer, header: Header):
    """transformers 4.57 turns a Gemma GGUF's SentencePiece vocabulary into a Unigram model
    scored by the file's scores, which are BPE merge ranks: it splits WikiText-2 into 1.9x the
    tokens llama.cpp does, and every row would be scored on ids the model never saw. Such a
    tokenizer is rebuilt as llama.cpp's (spm_bpe), keeping its class, special tokens and chat
    template; any other is returned as is."""
    import json as _json

    if header.kv.get("tokenizer.ggml.model") != "llama" or "tokenizer.ggml.merges" in header.kv:
        return tokenizer
    if _json.loads(tokenizer.backend_tokenizer.to_str()).get("model", {}).get("type") != "Unigram":
        return tokenizer
    rebuilt = type(tokenizer)(tokenizer_object=spm_bpe(header), bos_token=tokenizer.bos_token,
                              eos_token=tokenizer.eos_token, unk_token=tokenizer.unk_token,
                              pad_token=tokenizer.pad_token, add_bos_token=getattr(tokenizer, "add_bos_token", True),
                              add_eos_token=getattr(tokenizer, "add_eos_token", False))
    rebuilt.chat_template = tokenizer.chat_template
    return rebuilt


def _fix_special_tokens(tokenizer, gguf: Path) -> None:
    """Sets bos, eos, pad and whether a bos is prepended as the GGUF file says. transformers
    4.57's GGUF Llama tokenizer converter names the bos token as eos too, and prepends a bos
    to every text even when the file says not to (SmolLM2: eos would be <|im_start|>, and
    every perplexity window would start with a token the model never saw there)."""
    header = read_header(gguf)

    def scalar(key: str):
        v = header.kv.get(key)
        return None if isinstance(v, tuple) else v

    tokens = header.array("tokenizer.ggml.tokens")
    for attr, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id")):
        tid = scalar(f"tokenizer.ggml.{key}")
        if isinstance(tid, int) and 0 <= tid < len(tokens):
            setattr(tokenizer, attr, tokens[tid])
    add_bos = scalar("tokenizer.ggml.add_bos_token")
    if isinstance(add_bos, bool) and hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = add_bos  # LlamaTokenizerFast rebuilds its post-processor


def tensor_types(gguf: Path) -> dict[str, int]:
    """Tensor type name -> how many tensors of the file have it (read from its header)."""
    counts: dict[str, int] = {}
    for t in read_header(gguf).tensors.values():
        counts[t.type] = counts.get(t.type, 0) + 1
    return counts


# --- The file's header, read fast ------------------------------------------------------
# Written by hand because gguf-py's GGUFReader builds numpy views for every element of every
# array in the header: 27 s for Gemma-3's 262,144-entry vocabulary, read three times per
# conversion. This reads scalars and the tensor table, and an array only when asked.

_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str  # ggml type name: "Q4_K", "F32" ...
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (the input dim of a matrix)
    offset: int  # of its data, from the start of the file
    n_bytes: int


@dataclass
class Header:
    path: Path
    kv: dict[str, object]  # scalars and strings; an array as ("array", element type, count, file offset)
    tensors: dict[str, TensorInfo]

    def array(self, key: str) -> list:
        """The array value of `key` (strings decoded), [] when absent."""
        import struct

        v = self.kv.get(key)
        if not (isinstance(v, tuple) and v[:1] == ("array",)):
            return []
        _, etype, count, offset = v
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            if etype in _FIXED:
                size = struct.calcsize(_FIXED[etype])
                return list(struct.unpack(f"<{count}{_FIXED[etype][1]}", fh.read(size * count)))
            out = []
            for _ in range(count):  # strings: u64 length, bytes
                (n,) = struct.unpack("<Q", fh.read(8))
                out.append(fh.read(n).decode("utf-8", errors="replace"))
            return out

    def weights(self, name: str):
        """Tensor `name` dequantized: [rows, shape[0]] float32 (gguf-py's dequantizer)."""
        import numpy as np
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        t = self.tensors[name]
        raw = np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.n_bytes,))
        qtype = GGMLQuantizationType[t.type]
        rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        if qtype == GGMLQuantizationType.F32:
            return np.asarray(raw.view(np.float32)).reshape(rows, t.shape[0])
        if qtype == GGMLQuantizationType.F16:
            return np.asarray(raw.view(np.float16), dtype=np.float32).reshape(rows, t.shape[0])
        return np.asarray(dequantize(np.asarray(raw).reshape(rows, -1), qtype), dtype=np.float32).reshape(rows, t.shape[0])


def read_header(path: Path) -> Header:
    """The header of a GGUF file (version 2 or 3, little-endian). ModelSourceError when it is
    not one."""
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as fh:
        def take(fmt: str):
            size = struct.calcsize(fmt)
            data = fh.read(size)
            if len(data) != size:
                raise ModelSourceError(f"model.source: {path} ends inside its GGUF header; the file is cut short")
            return struct.unpack(fmt, data)[0]

        def string() -> str:
            return fh.read(take("<Q")).decode("utf-8", errors="replace")

        if fh.read(4) != _MAGIC:
            raise ModelSourceError(f"model.source: {path} is not a GGUF file (no GGUF magic)")
        version = take("<I")
        if version not in (2, 3):
            raise ModelSourceError(f"model.source: {path} is GGUF version {version}; versions 2 and 3 are read")
        n_tensors, n_kv = take("<Q"), take("<Q")
        kv: dict[str, object] = {}
        for _ in range(n_kv):
            key, vtype = string(), take("<I")
            if vtype in _FIXED:
                kv[key] = take(_FIXED[vtype])
            elif vtype == _STRING:
                kv[key] = string()
            elif vtype == _ARRAY:
                etype, count = take("<I"), take("<Q")
                kv[key] = ("array", etype, count, fh.tell())
                if etype in _FIXED:
                    fh.seek(struct.calcsize(_FIXED[etype]) * count, 1)
                elif etype == _STRING:
                    for _ in range(count):
                        fh.seek(take("<Q"), 1)
                else:
                    raise ModelSourceError(f"model.source: {path}: header key {key} is an array of arrays")
            else:
                raise ModelSourceError(f"model.source: {path}: header key {key} has unknown value type {vtype}")
        infos = []
        for _ in range(n_tensors):
            name = string()
            dims = tuple(take("<Q") for _ in range(take("<I")))
            infos.append((name, dims, take("<I"), take("<Q")))
        align = int(kv.get("general.alignment", 32))
        start = -(-fh.tell() // align) * align
    tensors = {}
    for name, dims, ttype, offset in infos:
        qtype = GGMLQuantizationType(ttype)
        block, size = GGML_QUANT_SIZES[qtype]
        n = 1
        for d in dims:
            n *= d
        tensors[name] = TensorInfo(name, qtype.name, dims, start + offset, n // block * size)
    return Header(Path(path), kv, tensors)


def file_type(gguf: Path) -> str:
    """The type the file declares itself to be (`general.file_type`: "Q4_K_M", "Q4_1",
    "F16"), '' when the header has none. Not the commonest tensor type: a Q4_K_M file of a
    model whose rows are not a multiple of 256 holds mostly Q5_0 fallbacks, and is still
    what its maker chose and sold as Q4_K_M."""
    from gguf import LlamaFileType

    code = read_header(gguf).kv.get("general.file_type")
    try:
        return LlamaFileType(int(code)).name.removeprefix("MOSTLY_") if code is not None else ""
    except (ValueError, TypeError):
        return ""


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
