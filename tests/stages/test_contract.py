"""Every registered stage kind keeps the contract the recipe, the runner and the docs rely
on (in the spirit of torchao's test over every registered config): a light module, a
strict and documented config that survives a round trip (the stage fingerprint is its
JSON dump), valid formats, a typed result, and a name equal to its catalogue key.

Parameterised over compress.core.registry.CATALOGUE, so a new kind is checked without a word
here; a kind whose config has a required field declares a small example in EXAMPLES.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from compress.core.registry import CATALOGUE, Format, StageConfig, StageResult, get_stage

KINDS = list(CATALOGUE)
FORMATS = set(typing.get_args(Format))

# The smallest `with:` block for kinds whose config cannot be built from defaults alone.
EXAMPLES: dict[str, dict] = {
    "cascade": {"large": "baseline"},  # the large variant is a stage id; nothing to default to
    "prune": {"teacher": "baseline"},  # an optional reference: set, so the contract sees it
}

# Packages a kind's config checks for at validation time (without importing them).
REQUIRES: dict[str, str] = {
    "load_4bit": "bitsandbytes",
    "quantize_gguf": "llama_cpp",
}

# Imported inside the functions that use them, never when a stage module loads: listing and
# validating stays fast (`compress --help`, `compress validate`).
HEAVY = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "safetensors", "huggingface_hub",
         "onnx", "onnxruntime", "optimum", "openvino", "nncf", "bitsandbytes", "sklearn", "scipy", "pandas",
         "matplotlib", "rich")

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> dict:
    package = REQUIRES.get(name)
    if package and importlib.util.find_spec(package) is None:
        pytest.skip(f"{name}'s config needs {package}, not installed here")
    return dict(EXAMPLES.get(name, {}))


@pytest.mark.parametrize("name", KINDS)
def test_the_stage_module_imports_no_framework(name):
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({CATALOGUE[name]!r})\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"{CATALOGUE[name]} imports a framework at load"


@pytest.mark.parametrize("name", KINDS)
def test_the_kind_is_named_by_its_catalogue_key_and_documented(name):
    module = importlib.import_module(CATALOGUE[name])
    kind = get_stage(name)
    assert module.KIND is kind and kind.name == name
    assert (module.__doc__ or "").strip(), f"{CATALOGUE[name]} has no module docstring"
    assert kind.summary.strip() and "\n" not in kind.summary
    assert callable(kind.run)
    for hook in ("check_model", "check_input", "keeps_architecture", "check_tokenizer"):
        assert getattr(kind, hook) is None or callable(getattr(kind, hook)), hook


@pytest.mark.parametrize("name", KINDS)
def test_the_config_is_strict_and_every_field_is_described(name):
    config = get_stage(name).config
    assert issubclass(config, StageConfig)
    assert config.model_config.get("extra") == "forbid"
    assert config.model_config.get("allow_inf_nan") is False
    undescribed = [key for key, field in config.model_fields.items() if not (field.description or "").strip()]
    assert not undescribed, f"{name}: fields without a description: {undescribed}"


@pytest.mark.parametrize("name", KINDS)
def test_the_config_round_trips_and_refuses_an_unknown_key(name):
    config = get_stage(name).config
    cfg = config.model_validate(example(name))
    assert config.model_validate(cfg.model_dump()) == cfg
    # The fingerprint hashes the JSON dump: it must read back as the same settings.
    assert config.model_validate(json.loads(json.dumps(cfg.model_dump(mode="json")))) == cfg
    with pytest.raises(ValidationError, match="no_such_setting"):
        config.model_validate({**example(name), "no_such_setting": 1})


@pytest.mark.parametrize("name", KINDS)
def test_formats_refs_and_budget_keys_are_known(name):
    from compress.recipe.schema import BudgetSpec

    kind = get_stage(name)
    assert kind.accepts and set(kind.accepts) <= FORMATS
    assert kind.produces in FORMATS
    assert set(kind.ref_accepts) <= FORMATS
    refs = kind.config.model_validate(example(name)).refs()
    # A kind that reads other stages says what they may give, and only then.
    assert bool(refs) == bool(kind.ref_accepts)
    assert set(refs) <= set(kind.config.model_fields)
    assert set(kind.budget_keys) <= set(BudgetSpec.model_fields)


@pytest.mark.parametrize("name", KINDS)
def test_the_result_is_a_typed_stage_result(name):
    result = get_stage(name).result
    assert issubclass(result, StageResult) and result is not StageResult
    assert result.model_config.get("extra") == "forbid"
    assert "format" in result.model_fields


def test_every_stage_module_is_catalogued():
    """A module under compress/stages/ that defines KIND but is not in the catalogue would
    never be registered."""
    folder = ROOT / "compress" / "stages"
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defines_kind = any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "KIND" for t in node.targets)
                           for node in tree.body)
        if defines_kind:
            assert f"compress.stages.{path.stem}" in CATALOGUE.values(), f"{path.name} defines KIND, not catalogued"


def test_a_kind_is_imported_on_first_use_only():
    code = (
        "import sys\n"
        "from compress.core.registry import get_stage\n"
        "get_stage('finetune')\n"
        "print(sorted(m for m in sys.modules if m.startswith('compress.stages.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "['compress.stages.finetune']"


def test_the_registry_is_one_dict_that_get_stage_reads(monkeypatch):
    from compress.core.registry import registry

    kinds = registry()
    # Same kinds, one dict (other tests swap a kind in and out of it, which may move it to the end).
    assert sorted(kinds) == sorted(KINDS) and registry() is kinds
    monkeypatch.delitem(kinds, "prune")
    with pytest.raises(KeyError, match="unknown stage kind 'prune'; valid: cascade, distill, "):
        get_stage("prune")
    with pytest.raises(KeyError, match="unknown stage kind 'nope'"):
        get_stage("nope")
