"""Nothing the package loads can run code: no pickle, safetensors for weights,
`weights_only` where a torch format is unavoidable, safe YAML, and remote model code only
when the recipe turns it on. A scan of the package source (its syntax tree, so comments
and strings do not count) keeps it that way."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

PACKAGE = Path(__file__).resolve().parents[1] / "compress"


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
    from compress.recipe import _SafeUniqueKeyLoader

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
    from compress.recipe import validate_recipe
    from tests.conftest import tiny_recipe

    assert validate_recipe(tiny_recipe(tiny_checkpoint, tiny_data)).model.trust_remote_code is False
