"""Stage outputs on disk: fingerprints, atomic writes, completion markers, the run lock.

A stage writes into a temporary folder; the runner then writes `_complete.json` (the
fingerprint and a sha256 of every file) into it and renames it into place. A folder
without a valid marker, or whose files no longer match their checksums, is never
trusted: the stage runs again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compress.core.errors import ArtifactError, CompressError
from compress.core.files import file_sha256, open_no_follow, real_folder, write_file

MARKER = "_complete.json"
RESULT = "result.json"
# The model card (compress/reports/model_card.py) is written into a finished folder after the
# benchmark and rewritten on every run: not part of the output, so not checksummed.
MODEL_CARD = "README.md"


def copy_side_files(src: Path, dst: Path) -> None:
    """Copies the tokenizer and config of the model in `src` beside a converted or quantized
    model written to `dst` (the ONNX and OpenVINO tools write only their own files): every
    file that `dst` does not have yet, except graphs and bookkeeping."""
    for f in Path(src).iterdir():
        if f.is_file() and not f.name.endswith(".onnx") and f.name not in (RESULT, MARKER, "ort_config.json") \
                and not (Path(dst) / f.name).exists():
            shutil.copy2(f, Path(dst) / f.name)


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def sealed(record: dict) -> dict:
    """`record` with a `checksum` of its own content: a cache file (completion marker, cached
    measurement) edited by hand or by another tool no longer matches it and is rebuilt,
    never trusted. Computed over the JSON round trip, so a reader that loads the file
    computes the same value."""
    body = json.loads(json.dumps({k: v for k, v in record.items() if k != "checksum"}))
    return {**body, "checksum": digest(body)}


def is_sealed(record) -> bool:
    """Whether a loaded cache file is a JSON object whose checksum matches its content."""
    if not isinstance(record, dict) or not isinstance(record.get("checksum"), str):
        return False
    return record["checksum"] == digest({k: v for k, v in record.items() if k != "checksum"})


def _checksums(folder: Path) -> dict[str, list]:
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER
                    and not (p.name == MODEL_CARD and p.parent == folder)):
        out[str(f.relative_to(folder))] = [f.stat().st_size, file_sha256(f)]
    return out


@dataclass
class Artifact:
    """A finished stage output (or the recipe's model, id `model`)."""

    id: str
    path: Path
    format: str
    fingerprint: str
    result: dict = field(default_factory=dict)
    # sha256 over the checksums of the files written: tells a rebuilt output (same
    # fingerprint, new files) from the one measured before.
    content: str = ""
    # The same over the files except result.json (which holds timings): the output itself.
    output: str = ""

    @property
    def identity(self) -> str:
        """What dependants key on: the fingerprint and, once written, the output files. A
        stage re-run with unchanged settings (--force, a lost folder) that writes other weights
        (training on a GPU is not bit-reproducible) thereby re-runs its dependants and
        invalidates caches derived from it; identical files leave them valid."""
        return digest([self.fingerprint, self.output]) if self.output else self.fingerprint


class ArtifactStore:
    def __init__(self, root: Path):
        self.root = root

    def folder(self, stage_id: str) -> Path:
        return self.root / stage_id

    def check(self, stage_id: str, fingerprint: str | None = None) -> tuple[dict | None, str]:
        """(marker, '') when the folder is complete and intact (and of this fingerprint),
        else (None, why)."""
        folder = self.folder(stage_id)
        marker_path = folder / MARKER
        if not marker_path.is_file():
            return None, "no output yet" if not folder.exists() else "incomplete output"
        try:
            marker = json.loads(marker_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, OSError, RecursionError):
            return None, "unreadable completion marker"
        if not is_sealed(marker) or not isinstance(marker.get("files"), dict) or not isinstance(marker.get("format"), str):
            return None, "completion marker edited, damaged or of an older version"
        if fingerprint is not None and marker.get("fingerprint") != fingerprint:
            return None, "inputs or settings changed"
        if _checksums(folder) != marker.get("files"):
            return None, "files changed since it was written (corrupt or edited)"
        return marker, ""

    def load(self, stage_id: str, fingerprint: str | None = None) -> Artifact | None:
        marker, _ = self.check(stage_id, fingerprint)
        if marker is None:
            return None
        folder = self.folder(stage_id)
        result = json.loads((folder / RESULT).read_text()) if (folder / RESULT).is_file() else {}
        result = result if isinstance(result, dict) else {}
        files = marker["files"]
        output = digest({k: v for k, v in files.items() if k != RESULT})
        return Artifact(stage_id, folder, marker["format"], marker["fingerprint"], result, digest(files), output)

    def begin(self, stage_id: str) -> Path:
        tmp = real_folder(self.root / ".tmp") / f"{stage_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def commit(self, stage_id: str, tmp: Path, fingerprint: str, fmt: str, meta: dict | None = None) -> Artifact:
        marker = sealed({"fingerprint": fingerprint, "format": fmt, "files": _checksums(tmp), **(meta or {})})
        write_file(tmp / MARKER, json.dumps(marker, indent=1), fsync=True)
        final = self.folder(stage_id)
        trash = None
        if final.exists():
            trash = self.root / ".tmp" / f"old-{stage_id}-{uuid.uuid4().hex[:8]}"
            final.rename(trash)
        tmp.rename(final)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        return self.load(stage_id, fingerprint) or _raise(stage_id)

    def discard(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def sweep(self) -> None:
        """Remove temporary folders that an interrupted run left behind (a link there: the
        link, never the folder it points to)."""
        tmp = self.root / ".tmp"
        if tmp.is_symlink():
            real_folder(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _raise(stage_id: str):
    raise ArtifactError(f"{stage_id}: output vanished right after it was written; check the disk")


class RunLock:
    """One run per run folder at a time: a second one is refused, never interleaved."""

    def __init__(self, root: Path):
        self.path = root / ".lock"
        self._fh = None

    def __enter__(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Not truncated on open (that would blank the holder's pid), and never through a link:
        # a .lock restored as one would have its target overwritten with our pid.
        self._fh = os.fdopen(open_no_follow(self.path), "r+")
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.seek(0)
            holder = self._fh.read().strip()
            self._fh.close()
            raise CompressError(
                f"{self.path.parent}: another run of this recipe is in progress"
                f"{f' (pid {holder})' if holder.isdigit() else ''}; wait for it to finish"
            )
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        if self._fh:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
