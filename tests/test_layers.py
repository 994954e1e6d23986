"""compress/ reads bottom-up: a module imports only its own layer or lower ones, and no
modules import each other in a circle.

The layers are the folders of compress/, in the order compress.LAYERS gives; a task folder
(compress/tasks/<task>/) is a column through them, each module in the layer its file name
maps to in compress.tasks.COLUMN. So a new module is placed by the folder it is put in.

The import graph is read from the source with `ast`, so every import counts: at module
level, inside functions (the lazy imports that keep `compress --help` fast) and under
TYPE_CHECKING. Relative imports are resolved. Catalogues that name modules as strings
(compress.core.registry.CATALOGUE, compress.formats.LOADERS, compress.core.task.TASKS) are
data, imported on first use, and are not edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

from compress import LAYERS
from compress.tasks import COLUMN

ROOT = Path(__file__).resolve().parents[1] / "compress"
TOP = len(LAYERS) - 1


def layer_of(module: str) -> int | None:
    """The module's layer, read from where its file sits: the package itself (which imports
    nothing) is the bottom, `compress.__main__` the top, `compress.<layer>.*` its folder's
    place in LAYERS, `compress.tasks.<task>.<name>` the layer COLUMN names for <name>; None
    for a module in no layer folder."""
    parts = module.split(".")[1:]
    if not parts:
        return 0
    if parts == ["__main__"]:
        return TOP
    if parts[0] == "tasks":
        if len(parts) <= 2:  # compress.tasks and compress.tasks.<task>: packages that import nothing
            return 0
        where = COLUMN.get(parts[2])
        return LAYERS.index(where) if where in LAYERS else None
    return LAYERS.index(parts[0]) if parts[0] in LAYERS else None


def folder_problems(root: Path = ROOT) -> list[str]:
    """One line per folder or top-level module that the layer order does not account for."""
    out = []
    folders = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    for name in sorted(folders - set(LAYERS) - {"tasks"}):
        out.append(f"compress/{name}/: not a layer; add it to compress.LAYERS in its place")
    for name in LAYERS:
        if name not in folders:
            out.append(f"compress.LAYERS names {name!r}, but compress/{name}/ is no package")
    for path in sorted(root.glob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            out.append(f"compress/{path.name}: a module outside the layer folders; move it into one")
    for task in sorted(p for p in (root / "tasks").iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        for path in sorted(task.glob("*.py")):
            if path.stem != "__init__" and path.stem not in COLUMN:
                out.append(f"compress/tasks/{task.name}/{path.name}: its name maps to no layer; "
                           "name it after one in compress.tasks.COLUMN or add it there")
    return out


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `root` (a package's __init__.py
    is the package itself)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the compress modules it imports anywhere in its file."""
    mods = modules(root)
    top = root.name

    def known(name: str) -> str | None:
        # `import compress.formats.hf` or `from compress.formats import load_predictor`:
        # the longest prefix that is a module (the rest names attributes).
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: `from . import x`, `from ..formats import hf`
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # `from compress.formats import hf` imports the module compress.formats.hf
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            else:
                continue
            for target in targets:
                if target == top or target.startswith(top + "."):
                    found = known(target)
                    if found is not None and found != name:
                        deps.add(found)
        graph[name] = deps
    return graph


def circular_groups(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of two or more modules that all reach each other through imports
    (strongly connected components, Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(sorted(g) for g in groups)


def circle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return group + [start]  # pragma: no cover - a strongly connected group always closes


def problems(graph: dict[str, set[str]], allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    """One line per module the table does not place, per upward edge and per circle."""
    out = []
    for module in sorted(graph):
        if layer_of(module) is None:
            out.append(f"{module}: no layer; move it into a layer folder (compress.LAYERS)")
    checked = {m: {d for d in deps if (m, d) not in allowed} for m, deps in graph.items()}
    for module in sorted(checked):
        mine = layer_of(module)
        for dep in sorted(checked[module]):
            theirs = layer_of(dep)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{module} (layer {mine}) imports {dep} (layer {theirs}), a higher layer")
    for group in circular_groups(checked):
        path = circle(checked, group)
        more = f" (one circle of {len(group)} modules that all reach each other: {', '.join(group)})" \
            if len(group) > len(path) - 1 else ""
        out.append("import circle: " + " -> ".join(path) + more)
    return out


def test_compress_reads_bottom_up_without_circles():
    found = problems(import_graph())
    assert not found, "\n".join(found)


def test_every_folder_is_a_layer_and_every_module_in_one():
    found = folder_problems()
    assert not found, "\n".join(found)


def test_a_stray_folder_and_module_are_found(tmp_path):
    root = tmp_path / "compress"
    for name in (*LAYERS, "tasks", "tasks/thing", "helpers"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
    (root / "loose.py").write_text("")
    (root / "tasks" / "thing" / "records.py").write_text("")
    (root / "tasks" / "thing" / "misc.py").write_text("")
    found = folder_problems(root)
    assert found == [
        "compress/helpers/: not a layer; add it to compress.LAYERS in its place",
        "compress/loose.py: a module outside the layer folders; move it into one",
        "compress/tasks/thing/misc.py: its name maps to no layer; name it after one in compress.tasks.COLUMN or add it there",
    ]


def test_layers_are_read_from_folders():
    assert layer_of("compress") == 0
    assert layer_of("compress.core.errors") == LAYERS.index("core")
    assert layer_of("compress.stages.distill") == LAYERS.index("stages")
    assert layer_of("compress.tasks.causal_lm.records") == LAYERS.index("recipe")
    assert layer_of("compress.tasks.classification.data") == LAYERS.index("data")
    assert layer_of("compress.tasks.causal_lm.task") == LAYERS.index("techniques")
    assert layer_of("compress.__main__") == TOP
    assert layer_of("compress.somewhere_new") is None
    assert layer_of("compress.tasks.causal_lm.misc") is None


def test_the_check_finds_an_upward_edge_a_circle_and_an_unplaced_module():
    core, stages, recipe = LAYERS.index("core"), LAYERS.index("stages"), LAYERS.index("recipe")
    graph = {
        "compress.core.registry": {"compress.stages.distill"},  # core -> stages
        "compress.stages.distill": {"compress.core.registry"},
        "compress.recipe.schema": {"compress.recipe.peek"},
        "compress.recipe.peek": {"compress.recipe.schema"},  # a circle inside one layer
        "compress.somewhere_new": set(),
    }
    found = problems(graph)
    assert (f"compress.core.registry (layer {core}) imports compress.stages.distill (layer {stages}), "
            "a higher layer") in found
    assert "import circle: compress.recipe.peek -> compress.recipe.schema -> compress.recipe.peek" in found
    assert "compress.somewhere_new: no layer; move it into a layer folder (compress.LAYERS)" in found
    assert recipe > core
    # Allowed edges are passed over: only the unplaced module is left.
    allowed = {("compress.core.registry", "compress.stages.distill"), ("compress.recipe.peek", "compress.recipe.schema")}
    assert problems(graph, allowed) == ["compress.somewhere_new: no layer; move it into a layer folder (compress.LAYERS)"]


def test_every_kind_of_import_is_an_edge(tmp_path):
    pkg = tmp_path / "compress"
    for sub in ("core", "recipe", "formats"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "errors.py").write_text("")
    (pkg / "recipe" / "peek.py").write_text("")
    (pkg / "recipe" / "schema.py").write_text("")
    (pkg / "formats" / "__init__.py").write_text("from . import hf\n")
    (pkg / "formats" / "hf.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..core import errors\n"
        "if TYPE_CHECKING:\n    from compress.recipe.schema import X\n"
        "def f():\n    import compress.recipe.peek.something\n"
    )
    graph = import_graph(pkg)
    assert graph["compress.formats.hf"] == {"compress.core.errors", "compress.recipe.schema", "compress.recipe.peek"}
    assert graph["compress.formats"] == {"compress.formats.hf"}


def test_catalogued_modules_sit_in_their_layers():
    from compress.core.registry import CATALOGUE
    from compress.core.task import TASKS
    from compress.formats import CAUSAL_LOADERS, LOADERS

    mods = modules()
    for path in CATALOGUE.values():
        assert path in mods and layer_of(path) == LAYERS.index("stages"), path
    for target in [*LOADERS.values(), *CAUSAL_LOADERS.values()]:
        path = target.split(":")[0]
        assert path in mods and layer_of(path) == LAYERS.index("formats"), path
    for target in TASKS.values():  # a task's Task object is a technique
        path = target.split(":")[0]
        assert path in mods and layer_of(path) == LAYERS.index("techniques"), path
