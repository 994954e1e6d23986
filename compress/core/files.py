"""Writing a run folder's own files: atomically, and never through a symbolic link.

A run folder can come from a restored CI cache or a shared disk, where any file in it may
have been replaced by a link. Opening such a name for writing would truncate whatever the
link points to, outside the run folder, and a temporary that is a link, renamed into
place, would leave the link behind for every later run to write through again. So every
file a run writes goes through `write_file`: whatever sits at the temporary's name is
removed first (a link itself, never its target), the temporary is created with
O_CREAT|O_EXCL|O_NOFOLLOW (which fails on any link) and renamed over the file's name, which
replaces a link there rather than what it points to. A link found on the way is said in
one line.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def note_link(path: Path, what: str) -> None:
    """One line: `path` was a symbolic link, and what was done instead of following it."""
    from compress.core.console import log

    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    log(f"{path}: was a symbolic link (to {target}); {what} instead of writing through it")


def write_file(path: Path, data: str | bytes, *, encoding: str = "utf-8", errors: str = "strict",
               tmp: Path | None = None, fsync: bool = False) -> Path:
    """Writes `data` to `path` atomically (a temporary, then a rename: a reader sees the old
    file or the whole new one) and never through a link, at `path` or at the temporary.
    `tmp`: the temporary's name (default `path` + ".part", beside it). Returns `path`."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else path.with_name(path.name + ".part")
    if path.is_symlink():
        note_link(path, "replaced it with a regular file")
    if tmp.is_symlink():
        note_link(tmp, "removed it")
    try:
        tmp.unlink()  # a leftover of a killed run, or a link: the name, never what it points to
    except FileNotFoundError:
        pass
    body = data.encode(encoding, errors) if isinstance(data, str) else data
    fd = os.open(tmp, _CREATE, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks (weights files are large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def real_folder(path: Path) -> Path:
    """`path` as a folder of its own (created with its parents if missing): a link there is
    removed and a real folder made in its place, so that nothing written into it lands where
    the link pointed."""
    path = Path(path)
    if path.is_symlink():
        note_link(path, "made a folder in its place")
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_no_follow(path: Path, flags: int = os.O_RDWR | os.O_CREAT, mode: int = 0o644) -> int:
    """os.open of `path` that never follows a link: a link there is removed (said in one
    line) and the file created in its place. Returns the descriptor."""
    path = Path(path)
    try:
        return os.open(path, flags | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if exc.errno != errno.ELOOP and not path.is_symlink():
            raise
    note_link(path, "replaced it with a regular file")
    path.unlink()
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
