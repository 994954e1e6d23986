"""Nothing the package loads can run code: no pickle, safetensors for weights,
`weights_only` where a torch format is unavoidable, safe YAML, and remote model code only
when the recipe turns it on. A scan of the package source (its syntax tree, so comments
and strings do not count) keeps it that way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

PACKAGE = Path(__file__).resolve().parents[2] / "compress"


def _calls():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield path.relative_to(PACKAGE.parent), node


def _name(node) -> str:
    """`torch.load` for torch.load(...), `load` for load(...)."""
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "?"


def _kw(call: ast.Call, key: str):
    for kw in call.keywords:
        if kw.arg == key:
            return kw.value
    return None


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def test_no_unsafe_deserialisation_in_the_package():
    problems = []
    for where, call in _calls():
        name = _name(call.func)
        at = f"{where}:{call.lineno}: {name}("
        if name.endswith("torch.load") and not _is_true(_kw(call, "weights_only")):
            problems.append(at + " without weights_only=True")
        if name.split(".")[0] in ("pickle", "cPickle", "dill", "joblib", "cloudpickle") and name.endswith(("load", "loads")):
            problems.append(at + " unpickles")
        if name in ("yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "yaml.unsafe_load_all"):
            problems.append(at + " is not a safe YAML load")
        if name == "yaml.load":
            loader = _kw(call, "Loader")
            if loader is None or "Safe" not in _name(loader):
                problems.append(at + " without a SafeLoader")
        if name.endswith(("np.load", "numpy.load")) and _is_true(_kw(call, "allow_pickle")):
            problems.append(at + " with allow_pickle=True")
        if _is_true(_kw(call, "trust_remote_code")):
            problems.append(at + " with trust_remote_code=True (only the recipe may turn it on)")
    assert not problems, "\n".join(problems)


def test_our_model_formats_load_safetensors_only():
    """Loaders of our own artifacts pass use_safetensors=True to from_pretrained (a model
    class, not a tokenizer or config), so a stray .bin beside them is never unpickled."""
    problems = []
    for where, call in _calls():
        if where.parts[1] != "formats":
            continue
        name = _name(call.func)
        if name.endswith(".from_pretrained") and "Model" in name.split(".")[-2]:
            if not _is_true(_kw(call, "use_safetensors")):
                problems.append(f"{where}:{call.lineno}: {name}( without use_safetensors=True")
    assert not problems, "\n".join(problems)


def test_recipe_loader_is_a_safe_loader():
    from compress.recipe.schema import _SafeUniqueKeyLoader

    assert issubclass(_SafeUniqueKeyLoader, yaml.SafeLoader)


def test_the_scan_can_fail(tmp_path, monkeypatch):
    """The scan flags each pattern it looks for (a test that cannot fail proves nothing)."""
    bad = tmp_path / "compress"
    bad.mkdir()
    (bad / "m.py").write_text("import torch, yaml, pickle\n"
                              "torch.load('x')\nyaml.load(s, Loader=yaml.Loader)\npickle.loads(b)\n"
                              "M.from_pretrained(p, trust_remote_code=True)\n")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", bad)
    try:
        test_no_unsafe_deserialisation_in_the_package()
    except AssertionError as exc:
        found = str(exc)
    else:
        raise AssertionError("the scan found nothing")
    for needle in ("torch.load", "yaml.load", "pickle.loads", "trust_remote_code"):
        assert needle in found


def test_remote_code_is_off_unless_the_recipe_sets_it(tiny_checkpoint, tiny_data):
    from compress.recipe.schema import validate_recipe
    from tests.conftest import tiny_recipe

    assert validate_recipe(tiny_recipe(tiny_checkpoint, tiny_data)).model.trust_remote_code is False


# Loaders of models, tokenizers and configs: transformers' own classes and ours. Optimum's
# ORTQuantizer/ORTOptimizer read an ONNX graph we exported (from a model already checked)
# and take no trust_remote_code; a prompt they might raise is turned into an error by
# sources.never_prompt.
_NOT_TRANSFORMERS_LOADERS = ("ORTQuantizer", "ORTOptimizer")


def test_every_loader_passes_trust_remote_code():
    """Left unset, transformers asks on stdin whether to run a folder's custom code (and a
    `y` there runs it): every from_pretrained passes the recipe's setting explicitly."""
    problems = []
    for where, call in _calls():
        name = _name(call.func)
        if not name.endswith(".from_pretrained") or name.split(".")[-2] in _NOT_TRANSFORMERS_LOADERS:
            continue
        if _kw(call, "trust_remote_code") is None:
            problems.append(f"{where}:{call.lineno}: {name}( without trust_remote_code=")
    assert not problems, "\n".join(problems)


def test_every_model_load_is_safetensors_only():
    """Every model-class from_pretrained in the package (stages included, not only the
    formats) passes use_safetensors=True: a pickle beside a safetensors file named like a
    shard is never the fallback."""
    problems = []
    for where, call in _calls():
        name = _name(call.func)
        if name.endswith(".from_pretrained") and "Model" in name.split(".")[-2] and name.split(".")[-2] not in _NOT_TRANSFORMERS_LOADERS:
            if _kw(call, "gguf_file") is not None:  # a GGUF file: read by transformers' GGUF reader, no pickle
                continue
            if not _is_true(_kw(call, "use_safetensors")):
                problems.append(f"{where}:{call.lineno}: {name}( without use_safetensors=True")
    assert not problems, "\n".join(problems)


def test_the_loader_scans_can_fail(tmp_path, monkeypatch):
    import sys

    bad = tmp_path / "compress"
    bad.mkdir()
    (bad / "m.py").write_text("AutoTokenizer.from_pretrained(p)\nAutoModelForSequenceClassification.from_pretrained(p, trust_remote_code=t)\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", bad)
    for scan, needle in ((test_every_loader_passes_trust_remote_code, "AutoTokenizer.from_pretrained"),
                         (test_every_model_load_is_safetensors_only, "without use_safetensors")):
        try:
            scan()
        except AssertionError as exc:
            assert needle in str(exc)
        else:
            raise AssertionError(f"{scan.__name__} found nothing")


def test_a_package_source_is_found_without_importing_its_parents(tmp_path, monkeypatch):
    """`package:a.b` locates a/b/model through the import path: a's __init__ never runs
    (importlib.util.find_spec('a.b') would import it)."""
    import sys

    from compress.recipe.peek import _package_dir

    pkg = tmp_path / "hostile_parent_pkg"
    (pkg / "child" / "model").mkdir(parents=True)
    marker = tmp_path / "parent_code_ran"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (pkg / "child" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (pkg / "child" / "model" / "config.json").write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _package_dir("hostile_parent_pkg.child") == pkg / "child" / "model"
    assert not marker.exists() and "hostile_parent_pkg" not in sys.modules


def test_a_missing_package_source_is_one_line(tmp_path, monkeypatch):
    import pytest as _pytest

    from compress.core.errors import ModelSourceError
    from compress.recipe.peek import _package_dir

    monkeypatch.syspath_prepend(str(tmp_path))
    with _pytest.raises(ModelSourceError, match="not installed"):
        _package_dir("no_such_pkg_for_compress.child")


def _custom_code_tokenizer(src: Path, dest: Path) -> Path:
    """A copy of a model folder whose tokenizer config maps to code in the folder; the code
    writes pwned.txt into the working folder when it runs."""
    import json
    import shutil

    shutil.copytree(src, dest)
    (dest / "evil_tokenizer.py").write_text(
        "open('pwned.txt', 'w').write('custom code ran')\n"
        "from transformers import BertTokenizerFast\nclass EvilTokenizer(BertTokenizerFast):\n    pass\n")
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    cfg.update({"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": [None, "evil_tokenizer.EvilTokenizer"]}})
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dest


def test_a_distill_student_with_custom_code_never_runs_it(cli, tmp_path, monkeypatch, tiny_classifier, tiny_data):
    """The student folder gets the recipe model's checks: with trust_remote_code off its
    custom tokenizer code does not run, even with a `y` waiting on stdin (the consent
    transformers' prompt would have taken)."""
    import io
    import sys

    from tests.conftest import tiny_recipe

    student = _custom_code_tokenizer(tiny_classifier, tmp_path / "student")
    raw = tiny_recipe(tiny_classifier, tiny_data)
    raw["stages"] = [{"id": "small", "uses": "distill", "with": {"student": str(student), "epochs": 1}}]
    raw["budget"] = {"baseline": "model"}
    work = tmp_path / "work"
    work.mkdir()
    (work / "recipe.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    code, out, err = cli("run", "recipe.yaml")
    assert not (work / "pwned.txt").exists(), "the student's custom code ran"
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and "custom code" in line and str(student) in line
    assert "[y/N]" not in out + err


# --- No code of a package runs at validation (issue "Hostile inputs, third round", item 7) ---

@pytest.mark.parametrize("module", ["hostile_empty_pkg", "hostile_empty_parent.child"])
def test_a_package_without_a_model_file_is_refused_at_validation_without_importing_it(tmp_path, monkeypatch, module,
                                                                                       tiny_data):
    """A package (or a package's child) whose folder holds no model and whose code does not
    say where one is: one line naming model.source, and neither it nor its parent ran."""
    import sys

    from compress.core.errors import RecipeError
    from compress.recipe.schema import validate_recipe
    from tests.conftest import tiny_recipe

    marker = tmp_path / "package_code_ran"
    root = tmp_path / "site"
    folder = root.joinpath(*module.split("."))
    folder.mkdir(parents=True)
    for depth in range(1, len(module.split(".")) + 1):
        root.joinpath(*module.split(".")[:depth], "__init__.py").write_text(
            f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.syspath_prepend(str(root))
    raw = tiny_recipe(tmp_path, tiny_data)
    raw["model"] = {"source": f"package:{module}"}
    with pytest.raises(RecipeError) as exc:
        validate_recipe(raw, "r.yaml")
    assert exc.value.key == "model.source" and "holds no model folder" in exc.value.message
    assert not marker.exists() and module.split(".")[0] not in sys.modules


def test_a_package_that_computes_its_model_path_runs_only_when_the_run_resolves_it(tmp_path, monkeypatch):
    """get_model_path() is the package's code: validation leaves its folder unknown, the run
    imports it (it was named to be used) and takes the path it gives."""
    import sys

    from compress.data.sources import resolve_model
    from compress.recipe.peek import local_folder, peek_model_format
    from compress.recipe.schema import ModelSpec

    marker = tmp_path / "package_code_ran"
    model = tmp_path / "elsewhere" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
    pkg = tmp_path / "site" / "hostile_path_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                     f"def get_model_path():\n    return {str(model)!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "hostile_path_pkg", raising=False)
    spec = ModelSpec(source="package:hostile_path_pkg")
    assert local_folder(spec, tmp_path) is None and peek_model_format(spec, tmp_path) is None
    assert not marker.exists() and "hostile_path_pkg" not in sys.modules
    assert resolve_model(spec, tmp_path).path == model and marker.exists()
