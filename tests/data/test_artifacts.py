import multiprocessing
import time

import pytest

from compress.data.artifacts import ArtifactStore, RunLock
from compress.core.errors import CompressError


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


def test_an_edited_completion_marker_is_not_trusted(tmp_path):
    """The marker carries a checksum of its own content: an edited format, or a file list
    edited to match changed files, makes the stage run again."""
    import json

    from compress.data.artifacts import MARKER, _checksums

    store = ArtifactStore(tmp_path)
    _write(store, "a", "fp")
    marker_path = tmp_path / "a" / MARKER
    original = json.loads(marker_path.read_text())
    assert "checksum" in original

    marker_path.write_text(json.dumps({**original, "format": "onnx"}))
    assert store.load("a", "fp") is None and "edited" in store.check("a", "fp")[1]

    (tmp_path / "a" / "model.safetensors").write_bytes(b"other weights")
    marker_path.write_text(json.dumps({**original, "files": _checksums(tmp_path / "a")}))
    assert store.load("a", "fp") is None


@pytest.mark.parametrize("content", ["[]", '"x"', "1", '{"fingerprint": "fp"}', '{"files": [], "checksum": 3}', "[" * 100000])
def test_a_completion_marker_of_the_wrong_shape_is_rebuilt_not_a_crash(tmp_path, content):
    from compress.data.artifacts import MARKER

    store = ArtifactStore(tmp_path)
    _write(store, "a", "fp")
    (tmp_path / "a" / MARKER).write_text(content)
    marker, why = store.check("a", "fp")
    assert marker is None and why


def test_a_lock_or_temporary_folder_that_is_a_link_is_replaced_never_written_through(tmp_path):
    """A run folder restored from a CI cache or found on a shared disk may hold links: the
    lock must not overwrite the file `.lock` points to with a pid, and stage outputs must
    not be written into the folder a `.tmp` link points to (nor swept out of it)."""
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    (run / ".lock").symlink_to(target)
    with RunLock(run):
        assert not (run / ".lock").is_symlink()
    assert target.read_text() == "precious"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept").write_text("x")
    (run / ".tmp").symlink_to(elsewhere)
    store = ArtifactStore(run)
    store.sweep()
    assert (elsewhere / "kept").is_file()
    (run / ".tmp").unlink(missing_ok=True)
    (run / ".tmp").symlink_to(elsewhere)
    tmp = store.begin("a")
    assert not (run / ".tmp").is_symlink() and tmp.parent == run / ".tmp"  # written inside the run folder
    (tmp / "model.safetensors").write_bytes(b"weights")
    assert store.commit("a", tmp, "fp", "hf").path == run / "a" and store.load("a", "fp") is not None
    assert sorted(p.name for p in elsewhere.iterdir()) == ["kept"]
