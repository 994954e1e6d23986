"""Terminal output: one rich console (stderr for progress and logs, stdout for tables)."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console

def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    # Logs and CI captures are not terminals: give tables room instead of 80 columns.
    return probe if probe.is_terminal else Console(stderr=stderr, width=200)


out = _console()
err = _console(stderr=True)


def log(message: str) -> None:
    err.print(message, highlight=False, markup=False)


class _Progress:
    """A progress bar that shows examples per second (the number a CPU user watches)."""

    def __init__(self, bar, task, total: int):
        self._bar, self._task, self.total = bar, task, total
        self.start = time.perf_counter()
        self.done = 0

    def advance(self, n: int = 1, **fields) -> None:
        self.done += n
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        extra = "  ".join(f"{k} {v}" for k, v in fields.items())
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
        p = _Progress(bar, task, total)
        yield p
    if not err.is_terminal:  # logs and CI: one summary line instead of a bar
        log(f"  {description}: {p.done} in {time.perf_counter() - p.start:.1f}s ({p.rate:,.1f}/s)")
