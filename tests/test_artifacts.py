import multiprocessing
import time

import pytest

from compress.artifacts import ArtifactStore, RunLock
from compress.errors import CompressError


def _write(store: ArtifactStore, sid: str, fp: str, payload: bytes = b"weights"):
    tmp = store.begin(sid)
    (tmp / "model.safetensors").write_bytes(payload)
    return store.commit(sid, tmp, fp, "hf")


def test_commit_then_load(tmp_path):
    store = ArtifactStore(tmp_path)
    art = _write(store, "a", "fp1")
    assert art.path == tmp_path / "a" and art.format == "hf"
    assert store.load("a", "fp1") is not None
    assert store.load("a", "fp2") is None  # settings changed
    assert store.check("a", "fp2")[1] == "inputs or settings changed"


def test_corruption_is_detected(tmp_path):
    store = ArtifactStore(tmp_path)
    _write(store, "a", "fp", b"x" * 100)
    f = tmp_path / "a" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[10] ^= 0xFF  # same size, one byte changed
    f.write_bytes(bytes(data))
    marker, why = store.check("a", "fp")
    assert marker is None and "corrupt" in why


def test_truncation_is_detected(tmp_path):
    store = ArtifactStore(tmp_path)
    _write(store, "a", "fp", b"x" * 100)
    (tmp_path / "a" / "model.safetensors").write_bytes(b"x" * 10)
    assert store.load("a", "fp") is None


def test_unfinished_folder_is_not_trusted(tmp_path):
    store = ArtifactStore(tmp_path)
    tmp = store.begin("a")
    (tmp / "model.safetensors").write_bytes(b"half")
    # the process dies here: nothing was committed
    assert store.load("a") is None
    store.sweep()
    assert not (tmp_path / ".tmp").exists()


def test_recommit_replaces(tmp_path):
    store = ArtifactStore(tmp_path)
    _write(store, "a", "fp1", b"one")
    _write(store, "a", "fp2", b"two")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == b"two"
    assert store.load("a", "fp2") is not None


def _hold(path, ready, release):
    with RunLock(path):
        ready.set()
        release.wait(10)


def test_second_run_is_refused(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path, ready, release))
    p.start()
    try:
        assert ready.wait(30)
        with pytest.raises(CompressError, match="another run"):
            with RunLock(tmp_path):
                pass
    finally:
        release.set()
        p.join(10)
    with RunLock(tmp_path):  # free again once the first run ended
        time.sleep(0)
