"""What a stage sees: its settings, its input artifact, the data, and a folder to write.

Stages talk to each other only through this and their artifact folders; nothing here
knows any particular stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from compress.data.artifacts import Artifact
    from compress.tasks.classification.data import Data
    from compress.recipe.schema import BudgetSpec, Recipe
    from compress.core.registry import StageConfig


@dataclass
class StageContext:
    stage_id: str
    config: "StageConfig"
    input: "Artifact"  # the `from` stage's output, or the recipe's model
    out: Path  # empty folder; becomes artifacts/<recipe>/<stage id>/ when the stage returns
    recipe: "Recipe"
    refs: dict[str, "Artifact"] = field(default_factory=dict)  # config key -> artifact
    _data: Callable[[], "Data"] | None = None
    log: Callable[[str], None] = print
    device: str = "cpu"  # where training and calibration run
    threads: int = 2
    seed: int = 0
    cache_root: Path | None = None  # default: <run folder>/.cache (see cache_dir)

    @property
    def data(self) -> "Data":
        assert self._data is not None
        return self._data()

    @property
    def budget(self) -> "BudgetSpec":
        return self.recipe.budget

    @property
    def num_labels(self) -> int:
        return self.data.num_labels

    def cache_dir(self, key: str) -> Path:
        """A folder named `key` for derived data worth keeping across runs of the recipe
        (e.g. teacher logits), outside any artifact. `key` must capture everything the
        content depends on; write into it atomically (temp file, then rename). It lives in
        <run folder>/.cache: while a stage runs, `out` is <run folder>/.tmp/<name>."""
        import re

        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", key):
            raise ValueError(f"cache key {key!r} is not a safe folder name")
        from compress.core.files import real_folder

        root = self.cache_root if self.cache_root is not None else real_folder(self.out.parent.parent / ".cache")
        # A link in place of the folder (a restored cache) is replaced: nothing is written where it points.
        return real_folder(root / key)

    def progress(self, total: int, description: str) -> Any:
        from compress.core.console import progress

        return progress(total, description)
