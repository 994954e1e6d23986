"""README.md and docs/: the README stays short, links and named files exist, its commands
name recipes that exist, and its figures block is what docs/figures.py makes of a report."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.synthetic_report import flip, make_report, measurement, write_run

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FIGURES = DOCS / "figures.py"
MAX_LINES = 250

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def figures():
    spec = importlib.util.spec_from_file_location("docs_figures", FIGURES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def code_lines(text: str) -> list[str]:
    """The lines of a page's code: indented blocks (after a blank line) and fenced blocks."""
    out, fenced, prev_blank, in_indented = [], False, True, False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            out.append(line.strip())
        elif line.startswith("    ") and (prev_blank or in_indented) and line.strip():
            in_indented = True
            out.append(line.strip())
        elif line.strip():
            in_indented = False
        prev_blank = not line.strip()
    return out


# --- the README itself


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; at most {MAX_LINES}: move detail into docs/"


def test_readme_keeps_the_commands_ci_runs():
    """.ci/run installs and tests as the README says: each of its pip installs is in the
    README's install line, and the README's test command is the one it runs."""
    text = README.read_text(encoding="utf-8")
    install = [ln.strip() for ln in code_lines(text) if ln.strip().startswith("python3 -m venv .venv")]
    assert len(install) == 1, "README.md needs one install line starting `python3 -m venv .venv`"
    steps = [s.strip() for s in install[0].split("&&")]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for args in re.findall(r"^pip install -q (.+)$", ci, flags=re.M):
        assert f"pip install {args.strip()}" in steps, f".ci/run installs {args!r}; README.md's install line does not"
    assert "python -m pytest" in code_lines(text), "README.md's Tests section must give `python -m pytest`"
    assert re.search(r"^python -m pytest", ci, flags=re.M)


def test_readme_commands_name_existing_recipes():
    commands = [ln for ln in code_lines(README.read_text(encoding="utf-8")) if ln.startswith("compress ")]
    assert any(c.startswith("compress run ") for c in commands), "README.md shows no `compress run` command"
    for cmd in commands:
        words = shlex.split(cmd.split("#", 1)[0])
        if words[1] in ("run", "validate"):
            assert (ROOT / words[2]).is_file(), f"README.md: `{cmd}` names no existing recipe"
        for w in words:
            if w.endswith((".yaml", ".yml")):
                assert (ROOT / w).is_file(), f"README.md: `{cmd}` names {w}, which does not exist"


def test_readme_has_one_figures_block():
    text = README.read_text(encoding="utf-8")
    mod = figures()
    assert text.count(mod.START) == 1 and text.count(mod.END) == 1
    assert text.index(mod.START) < text.index(mod.END)


# --- links and named files


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(page):
    text = page.read_text(encoding="utf-8")
    links = [m for m in LINK.findall(text) if not re.match(r"[a-z]+:", m)]
    for link in links:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: link {link} points to no file"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target), f"{page.name}: link {link}: {target.name} has no heading #{anchor}"


def _module_exists(dotted: str) -> bool:
    """compress.a.b is a module or package, or an attribute of one (compress.tasks.COLUMN)."""
    parts = dotted.split(".")
    for n in (len(parts), len(parts) - 1):
        base = ROOT.joinpath(*parts[:n])
        if n and (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            return True
    return False


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_named_modules_and_files_exist(page):
    """Every `compress/...`, `tests/...`, `eval/...` and `recipes/...` path and every
    `compress.x.y` module a page names in backticks exists (the docs use the package's
    current layout)."""
    text = page.read_text(encoding="utf-8")
    for span in re.findall(r"`([^`\n]+)`", text):
        for path in re.findall(r"(?<![\w/.~])((?:compress|tests|eval|recipes|docs)/[\w./<>-]*)", span):
            if "<" in path or path.endswith("/**"):
                continue
            assert (ROOT / path.rstrip("/")).exists(), f"{page.name}: `{span}` names {path}, which does not exist"
        for dotted in re.findall(r"(?<![\w/.])(compress(?:\.\w+)+)", span):
            assert _module_exists(dotted), f"{page.name}: `{span}` names {dotted}, no such module"


def test_recipe_comments_name_existing_docs():
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        for path in re.findall(r"docs/[\w.-]+\.md", recipe.read_text(encoding="utf-8")):
            assert (ROOT / path).is_file(), f"{recipe.name} names {path}, which does not exist"


def test_docs_index_lists_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in sorted(DOCS.glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"


def test_architecture_names_every_layer():
    from compress import LAYERS
    from compress.tasks import COLUMN

    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    for layer in LAYERS:
        assert f"| `{layer}` |" in text, f"docs/architecture.md has no row for the layer {layer}"
    for name in COLUMN:
        assert f"`{name}.py`" in text, f"docs/architecture.md does not place {name}.py of a task folder"


# --- docs/figures.py


def _run(tmp_path: Path) -> tuple[Path, dict]:
    labels = np.array([0, 1] * 100)
    results = {
        "baseline": measurement(flip(labels, 10), labels, p50=10.0, p95=12.0, throughput=100.0, size_mb=90.0),
        "int8": measurement(flip(labels, 11, seed=1), labels, p50=4.0, p95=5.0, throughput=300.0, size_mb=25.0),
        "tiny": measurement(flip(labels, 40, seed=2), labels, p50=1.0, p95=2.0, throughput=3000.0, size_mb=5.0),
    }
    report = make_report(results, labels, cpu_model="Test CPU 9000")
    write_run(tmp_path / "run", report, results, labels)
    return tmp_path / "run" / "report.json", report


def _table(block: str) -> list[list[str]]:
    rows = [ln for ln in block.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in rows[2:]]


def test_figures_renders_the_report(tmp_path):
    path, report = _run(tmp_path)
    mod = figures()
    from compress.reports.report_json import read_report

    block = mod.render(read_report(path))
    rows = _table(block)
    ids = [r["id"] for r in report["rows"] if r["device"] == report["decision"]["device"]]
    assert [r[0].strip("*") for r in rows] == ids
    selected = report["decision"]["selected"]
    assert selected == "int8"
    for cells in rows:
        bold = all(c.startswith("**") and c.endswith("**") for c in cells)
        assert bold == (cells[0].strip("*") == selected), cells
    assert "Test CPU 9000" in block and f"deploy **{selected}**" in block
    cost = next(c for c in rows[1] if c.strip("*").startswith("$"))
    assert re.fullmatch(r"\*\*\$0\.0000[1-9]\d* @b\d+\*\*", cost), cost


def test_figures_significant_digits():
    mod = figures()
    assert mod.money(0.0000472345) == "0.0000472"
    assert mod.money(0.283) == "0.283"
    assert mod.money(12.34) == "12.3"


def test_figures_check_fails_on_a_different_block(tmp_path):
    path, _ = _run(tmp_path)
    mod = figures()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{mod.START}\nold figures\n{mod.END}\n\nafter\n", encoding="utf-8")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(FIGURES), str(path), "--readme", str(readme), *args],
                              capture_output=True, text=True, cwd=ROOT)

    assert cli("--check").returncode == 1
    printed = cli("--print")
    assert printed.returncode == 0 and "old figures" not in printed.stdout
    assert readme.read_text(encoding="utf-8").count("old figures") == 1  # --print writes nothing
    assert cli().returncode == 0
    text = readme.read_text(encoding="utf-8")
    assert "old figures" not in text and text.endswith(f"{mod.END}\n\nafter\n")
    assert printed.stdout in text
    assert cli("--check").returncode == 0
    readme.write_text(text.replace("| int8 |", "| int9 |").replace("**int8**", "**int9**"), encoding="utf-8")
    assert cli("--check").returncode == 1
    readme.write_text("no markers\n", encoding="utf-8")
    assert cli("--check").returncode == 2
