"""The processes of one run: one, or several started by `accelerate launch` / torchrun
for data-parallel training over several GPUs or machines.

Every process runs every stage (training stages need all of them: accelerate shards the
batches and DDP averages the gradients), but only the main process writes: it holds the
run lock, commits stage outputs and runs the benchmark, the decision and the reports.
The others write into throw-away folders, wait for the main process's commit, and go on
from the committed artifact, so every process feeds the next stage the same input.
The run folder must therefore be on storage that every process sees (a shared file
system when the processes span machines).

Nothing here imports torch or accelerate unless the run was launched with several
processes.
"""

from __future__ import annotations

import os
from typing import Any

# Launchers name the process count differently: torchrun/accelerate (WORLD_SIZE), MPI.
_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def _launched_size() -> int:
    for name in _SIZE_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 1


class Processes:
    """This process's place in the run. `share(value)` is the one synchronisation point:
    every process calls it at the same place and gets the main process's value (a
    barrier that carries a decision)."""

    def __init__(self) -> None:
        self.count = _launched_size()
        self.index = 0
        self.cpu = True
        self._state = None
        if self.count > 1:
            from accelerate import PartialState

            from compress.bench.benchmark import cuda_available

            # accelerate only picks gloo (multi-CPU) when asked for the CPU explicitly.
            forced_cpu = os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in {"1", "true", "yes"}
            self.cpu = forced_cpu or not cuda_available()
            self._state = PartialState(cpu=self.cpu)
            self.count = self._state.num_processes
            self.index = self._state.process_index

    @property
    def is_main(self) -> bool:
        return self.index == 0

    @property
    def device(self) -> str | None:
        """Where training runs under a launcher ('cpu' or 'cuda', PartialState having
        picked this process's GPU); None for a single process (the runner decides)."""
        if self._state is None:
            return None
        return "cpu" if self.cpu else "cuda"

    def share(self, value: Any = None) -> Any:
        if self._state is None or self.count == 1:
            return value
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def close(self) -> None:
        """Leave the process group once no collective call is left (the stages are done)."""
        if self._state is None:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
