"""`compress serve` as a user runs it: a subprocess that serves until SIGTERM, drains the
requests in flight, exits 0 and leaves no Ray process behind; its one-line errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT

pytest.importorskip("ray.serve", reason="needs the serve extra: pip install -e \".[serve]\"")
requests = pytest.importorskip("requests")
psutil = pytest.importorskip("psutil")


def test_serve_errors_are_one_line(cli, tmp_path):
    code, _, err = cli("serve", tmp_path / "missing")
    assert code == 2 and "no such run folder" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "run").mkdir()
    code, _, err = cli("serve", tmp_path / "run")
    assert code == 2 and "no report.json" in err and "--variant" in err
    code, _, err = cli("serve", tmp_path / "run", "--variant", "nope")
    assert code == 2 and "no variant 'nope'" in err
    code, _, err = cli("serve", tmp_path / "run", "--variant", "x", "--cache", "redis")
    assert code == 2 and "serving.cache.url" in err


def test_without_the_serve_extra_the_error_says_what_to_install(cli, tmp_path, tokenizer_dir, monkeypatch):
    from tests.serving.served_run import build_run

    run = build_run(tmp_path, tokenizer_dir)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as it does without the extra
    code, _, err = cli("serve", run)
    assert code == 2 and 'pip install -e ".[serve]"' in err and len(err.strip().splitlines()) == 1


def test_sigterm_drains_in_flight_requests_and_leaves_nothing_running(tmp_path, tokenizer_dir):
    from tests.serving.served_run import build_run

    run = build_run(tmp_path, tokenizer_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "compress", "serve", str(run), "--port", "0", "--max-batch-size", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    url, deadline = None, time.monotonic() + 240
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        found = [m.group(1) for ln in list(lines) if (m := re.search(r"at (http://127\.0\.0\.1:\d+)", ln))]
        url = found[0] if found else None
        time.sleep(0.2)
    assert url, f"no url; exit {proc.poll()}; stderr: {''.join(lines)[-2000:]}"
    try:
        texts = [f"the film number {i} was good and the cast was lovely" for i in range(200)]
        assert requests.post(f"{url}/predict", json={"texts": texts[:2]}, timeout=60).status_code == 200
        family = psutil.Process(proc.pid).children(recursive=True)
        assert family, "the server started no Ray processes"

        outcomes: list[tuple[float, object]] = []  # (when sent, status code or the exception's name)
        stop = threading.Event()

        def client(k: int) -> None:
            n = 0
            while not stop.is_set():
                sent, n = time.monotonic(), n + 1
                body = {"texts": [f"{t} {k} {n}" for t in texts[:100]]}  # 25 model calls: a while in flight
                try:
                    outcomes.append((sent, requests.post(f"{url}/predict", json=body, timeout=60).status_code))
                except requests.RequestException as exc:
                    outcomes.append((sent, type(exc).__name__))

        clients = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for c in clients:
            c.start()
        time.sleep(1.5)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=90)
        stopped_after = time.monotonic() - signalled
        stop.set()
        for c in clients:
            c.join(70)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code in (0, 143), "".join(lines)[-2000:]
    assert stopped_after < 60
    underway = [o for sent, o in outcomes if sent < signalled]
    assert underway and all(o == 200 for o in underway), underway  # every request sent before SIGTERM answered
    late = [o for sent, o in outcomes if sent >= signalled]
    assert all(o in (200, 503) or isinstance(o, str) for o in late), sorted({str(o) for o in late})  # refused, never a 500
    time.sleep(2)
    alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [" ".join(p.cmdline()[:3]) for p in alive]
    assert "stopped" in "".join(lines) and "Traceback" not in "".join(lines)
