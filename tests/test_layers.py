"""compress/ reads bottom-up: a module imports only its own layer or lower ones, and no
modules import each other in a circle.

The import graph is read from the source with `ast`, so every import counts: at module
level, inside functions (the lazy imports that keep `compress --help` fast) and under
TYPE_CHECKING. Relative imports are resolved. Catalogues that name modules as strings
(compress.registry.CATALOGUE, compress.formats.LOADERS) are data, imported on first use,
and are not edges. A new module must be placed in LAYERS (or under a package prefix there).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "compress"

# Bottom -> top. A module may import only modules of its own layer or lower ones.
LAYERS: dict[int, tuple[str, ...]] = {
    # base: types, errors, output, the stage and task catalogues as data
    0: ("compress", "compress.errors", "compress.console", "compress.manifest", "compress.architectures",
        "compress.registry", "compress.tasks", "compress.stats"),
    # schema: the recipe, and facts read from a model's files without loading it
    1: ("compress.recipe", "compress.peek", "compress.lm_records", "compress.gguf"),
    # sources and data
    2: ("compress.sources", "compress.data", "compress.artifacts", "compress.context", "compress.lm_data"),
    # techniques and formats
    3: ("compress.formats", "compress.formats.*", "compress.classify", "compress.train", "compress.distillation", "compress.parity",
        "compress.predict", "compress.augment", "compress.tasks.*", "compress.lm_export", "compress.lm_bench", "compress.memory_plan"),
    # stages
    4: ("compress.stages", "compress.stages.*"),
    # benchmark
    5: ("compress.measure", "compress.benchmark", "compress.bench_worker", "compress.distributed"),
    # decision
    6: ("compress.decision",),
    # reports
    7: ("compress.report_json", "compress.report", "compress.html_report", "compress.junit", "compress.model_card", "compress.compare"),
    # runner
    8: ("compress.plan", "compress.evaluate", "compress.runner", "compress.init"),
    # command line
    9: ("compress.cli", "compress.__main__"),
}

def layer_of(module: str) -> int | None:
    """The module's layer by LAYERS: an exact name first, then the nearest package prefix
    (`compress.stages.*`); None for a module the table does not place."""
    exact = {name: layer for layer, names in LAYERS.items() for name in names if not name.endswith(".*")}
    if module in exact:
        return exact[module]
    prefixes = {name[:-1]: layer for layer, names in LAYERS.items() for name in names if name.endswith(".*")}
    best = max((p for p in prefixes if module.startswith(p)), key=len, default=None)
    return prefixes[best] if best is not None else None


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
            out.append(f"{module}: no layer; place it in LAYERS (tests/test_layers.py)")
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


def test_the_check_finds_an_upward_edge_a_circle_and_an_unplaced_module():
    graph = {
        "compress.registry": {"compress.stages.distill"},  # 0 -> 4
        "compress.stages.distill": {"compress.registry"},
        "compress.recipe": {"compress.peek"},
        "compress.peek": {"compress.recipe"},  # a circle inside layer 1
        "compress.somewhere_new": set(),
    }
    found = problems(graph)
    assert "compress.registry (layer 0) imports compress.stages.distill (layer 4), a higher layer" in found
    assert "import circle: compress.peek -> compress.recipe -> compress.peek" in found
    assert "compress.somewhere_new: no layer; place it in LAYERS (tests/test_layers.py)" in found
    # Allowed edges are passed over: only the unplaced module is left.
    allowed = {("compress.registry", "compress.stages.distill"), ("compress.peek", "compress.recipe")}
    assert problems(graph, allowed) == ["compress.somewhere_new: no layer; place it in LAYERS (tests/test_layers.py)"]


def test_every_kind_of_import_is_an_edge(tmp_path):
    pkg = tmp_path / "compress"
    (pkg / "formats").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "peek.py").write_text("")
    (pkg / "recipe.py").write_text("")
    (pkg / "formats" / "__init__.py").write_text("from . import hf\n")
    (pkg / "formats" / "hf.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from .. import errors\n"
        "if TYPE_CHECKING:\n    from compress.recipe import X\n"
        "def f():\n    import compress.peek.something\n"
    )
    graph = import_graph(pkg)
    assert graph["compress.formats.hf"] == {"compress.errors", "compress.recipe", "compress.peek"}
    assert graph["compress.formats"] == {"compress.formats.hf"}


def test_stage_modules_in_the_catalogue_sit_in_the_stage_layer():
    from compress.formats import LOADERS
    from compress.registry import CATALOGUE

    mods = modules()
    for path in CATALOGUE.values():
        assert path in mods and layer_of(path) == 4, path
    for target in LOADERS.values():
        path = target.split(":")[0]
        assert path in mods and layer_of(path) == 3, path
    from compress.tasks import TASKS

    for target in TASKS.values():  # task implementations are techniques: layer 3
        path = target.split(":")[0]
        assert path in mods and layer_of(path) == 3, path
