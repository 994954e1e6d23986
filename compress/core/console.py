"""Terminal output: one rich console (stderr for progress and logs, stdout for tables).

On a terminal, long loops show rich progress bars. Without one (CI, nohup, a pipe) a bar
would print nothing until the end, so a plain line is logged instead at least every
`progress_seconds()` (done/total, rate, ETA), and `heartbeat` logs that a step without a
loop of its own is still running.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

from rich.console import Console

# Seconds between plain progress lines when stderr is not a terminal; a test sets it small.
PROGRESS_ENV = "COMPRESS_PROGRESS_SECONDS"


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    # Logs and CI captures are not terminals: give tables room instead of 80 columns.
    return probe if probe.is_terminal else Console(stderr=stderr, width=200)


out = _console()
err = _console(stderr=True)
_last_line = [time.monotonic()]  # when the last line was logged (heartbeat stays quiet after one)


def progress_seconds() -> float:
    try:
        return max(float(os.environ.get(PROGRESS_ENV, "30")), 0.0)
    except ValueError:
        return 30.0


def log(message: str) -> None:
    mark_logged()
    err.print(message, highlight=False, markup=False)


def mark_logged() -> None:
    """Notes that a line was just logged (by `log` or any other writer): the heartbeat waits."""
    _last_line[0] = time.monotonic()


def stamped(write):
    """`write` (a log function), also noting each line for the heartbeat."""
    if write is log:
        return log

    def _write(message: str) -> None:
        mark_logged()
        write(message)

    return _write


def duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m: how long something took or will take."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(description: str, done: int, total: int, elapsed: float, extra: str = "") -> str:
    """`description: done/total (pct), rate/s, ETA` for logs that are not a terminal."""
    rate = done / max(elapsed, 1e-9)
    pct = f" ({done / total:.0%})" if total else ""
    eta = f", ETA {duration((total - done) / rate)}" if total and rate > 0 and done < total else ""
    return f"{description}: {done}/{total}{pct}, {rate:,.1f} ex/s{eta}" + (f"  {extra}" if extra else "")


class _Progress:
    """A progress bar that shows examples per second (the number a CPU user watches)."""

    def __init__(self, bar, task, total: int, description: str):
        self._bar, self._task, self.total, self.description = bar, task, total, description
        self.start = time.perf_counter()
        self.done = 0
        self._plain = not err.is_terminal
        self._every = progress_seconds()
        self._last = self.start

    def advance(self, n: int = 1, **fields) -> None:
        self.done += n
        now = time.perf_counter()
        rate = self.done / max(now - self.start, 1e-9)
        extra = "  ".join(f"{k} {v}" for k, v in fields.items())
        if self._plain:
            if fields:
                self._extra = extra
            # A little before the heartbeat's interval (measured from the last line anyone
            # logged), so that a loop's own line, which says more, always comes first.
            quiet = time.monotonic() - _last_line[0]
            if quiet >= 0.8 * self._every and now - self._last >= 0.8 * self._every and self.done < self.total:
                self._last = now
                log("  " + progress_line(self.description, self.done, self.total, now - self.start,
                                         getattr(self, "_extra", "")))
            return
        self._bar.update(self._task, advance=n, rate=f"{rate:,.0f} ex/s", extra=extra)

    @property
    def rate(self) -> float:
        return self.done / max(time.perf_counter() - self.start, 1e-9)


@contextmanager
def progress(total: int, description: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [
        TextColumn("  {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[extra]}"),
    ]
    with Progress(*columns, console=err, transient=False, disable=not err.is_terminal) as bar:
        task = bar.add_task(description, total=total, rate="", extra="")
        p = _Progress(bar, task, total, description)
        yield p
    if not err.is_terminal:  # logs and CI: a summary line at the end
        log(f"  {description}: {p.done} in {time.perf_counter() - p.start:.1f}s ({p.rate:,.1f}/s)")


@contextmanager
def heartbeat(label: str, log_fn=None):
    """While the block runs and stderr is not a terminal, logs `label: still running (Xs)`
    whenever nothing was logged for `progress_seconds()`: a step with no loop of its own
    (an ONNX export, a graph quantization) then still shows it is alive in a CI log."""
    if err.is_terminal:
        yield
        return
    write = log_fn or log
    every = max(progress_seconds(), 0.05)
    start = time.monotonic()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(min(every, 1.0)):
            now = time.monotonic()
            if now - max(_last_line[0], start) >= every:  # never sooner than `every` into the block
                mark_logged()
                write(f"{label}: still running ({duration(now - start)})")

    thread = threading.Thread(target=beat, name="compress-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# Loggers of libraries whose warnings say nothing a user of compress can act on here (for
# example bitsandbytes' "Failed to load CPU gemm_4bit_forward from kernels-community" on
# every CPU without the optional `kernels` package, or torchao's "Failed to load ..._C_mxfp8...so"
# for each CUDA-only extension on a CPU machine, and torch's pytree logger warning that torchao
# registers its Enum settings the deprecated way: transformers imports torchao whenever it is
# installed); errors still show.
QUIET_LOGGERS = ("bitsandbytes", "optimum", "onnxruntime", "torch.onnx", "accelerate", "datasets", "huggingface_hub",
                 "torchao", "torch.utils._pytree")


def quiet_libraries() -> None:
    """Silences library chatter (\"newly initialized weights\", deprecation notices, optional
    kernels not installed) that is expected here and drowns the run's own lines, in this
    process and in the benchmark workers. COMPRESS_DEBUG=1 keeps it."""
    import logging
    import warnings

    if os.environ.get("COMPRESS_DEBUG", "") not in ("", "0"):
        return
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    # The ONNX exporter's and ORT quantizer's notes on graphs they handle correctly here
    # (advanced indexing, a read-only numpy weight handed to torch): nothing to act on.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx\..*")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"onnxruntime\.quantization\..*")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # worker processes inherit it
