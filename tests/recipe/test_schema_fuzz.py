"""Property-based tests of the recipe loader: random YAML-ish documents, random mutations
of the default recipe and random `--set` overrides are either valid recipes or a
RecipeError, never another exception (which would reach the user as a crash)."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compress.core.errors import RecipeError
from compress.recipe.schema import apply_override, load_recipe, parse_override, validate_recipe

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = yaml.safe_load((ROOT / "recipes" / "bert_sentiment.yaml").read_text())
FUZZ = settings(max_examples=int(os.environ.get("COMPRESS_FUZZ_EXAMPLES", "150")), deadline=None,
                derandomize=not os.environ.get("COMPRESS_FUZZ_EXAMPLES"),  # CI: the same examples each run
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["", "..", "../x", "/etc", "model", "baseline", "int8", "finetune", "quantize_dynamic",
                     "cpu", "cuda", "x\n", "package:os", "package:../x", "1e-4", "nan", "~", "*"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=12), st.integers()), inner, max_size=4)),
    max_leaves=12)


def _paths(node, prefix=()):
    """Every key path of a nested document."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


ALL_PATHS = list(_paths(DEFAULT))[1:]
KEYS = sorted({p[-1] for p in ALL_PATHS if isinstance(p[-1], str)})


def _set(doc, path, value, delete=False):
    node = doc
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


@st.composite
def mutated_recipes(draw):
    doc = copy.deepcopy(DEFAULT)
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        try:
            if action == "replace":
                _set(doc, path, draw(values))
            elif action == "delete":
                _set(doc, path, None, delete=True)
            else:
                node = doc
                for part in path[:-1]:
                    node = node[part]
                if isinstance(node, dict):
                    node[draw(st.sampled_from(KEYS + ["extra", "with", "from"]))] = draw(values)
                elif isinstance(node, list):
                    node.append(draw(values))
        except (KeyError, IndexError, TypeError):
            pass
    return doc


def _only_recipe_errors(fn, *args) -> None:
    try:
        fn(*args)
    except RecipeError as exc:
        assert str(exc)  # (the command line prints it on one line whatever it holds)
    # anything else propagates and fails the test, with hypothesis' minimal example


@FUZZ
@given(mutated_recipes())
def test_mutations_of_the_default_recipe(doc):
    _only_recipe_errors(validate_recipe, doc, "fuzz.yaml", ROOT / "recipes" / "bert_sentiment.yaml")


@FUZZ
@given(values)
def test_random_documents(doc):
    _only_recipe_errors(validate_recipe, doc if isinstance(doc, dict) else {"doc": doc}, "fuzz.yaml")


yaml_chars = st.sampled_from(list("abc:-[]{},'\"&*!|>#%@`?\n \t0123456789.") + ["stages:", "- id: ", "uses: ",
                                                                              "with: ", "from: ", "name: ", "&a ", "*a",
                                                                              "!!python/object:os.system ", "<<: "])


@FUZZ
@given(st.lists(yaml_chars, max_size=60).map("".join))
def test_random_yaml_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "r.yaml"
    path.write_text(text)
    _only_recipe_errors(load_recipe, path)


@FUZZ
@given(st.text(max_size=40), values)
def test_random_overrides(key, value):
    doc = copy.deepcopy(DEFAULT)

    def apply():
        parts, parsed = parse_override(f"{key}={yaml.safe_dump(value, default_flow_style=True).strip()}")
        apply_override(doc, parts, parsed, key)
        validate_recipe(doc, "fuzz.yaml", ROOT / "recipes" / "bert_sentiment.yaml")

    _only_recipe_errors(apply)


def test_nan_and_huge_numbers_are_errors_not_crashes():
    doc = copy.deepcopy(DEFAULT)
    doc["stages"][0]["with"]["lr"] = math.nan
    try:
        validate_recipe(doc, "fuzz.yaml")
    except RecipeError as exc:
        assert exc.key == "stages[0].with.lr"
    doc = copy.deepcopy(DEFAULT)
    doc["benchmark"]["threads"] = 2**80
    try:
        validate_recipe(doc, "fuzz.yaml")
    except RecipeError as exc:
        assert exc.key == "benchmark.threads"


source_text = st.one_of(
    st.text(max_size=30),
    st.tuples(st.sampled_from(["~", "~nosuchuser", "./", "../", "/", "package:", "package:.", "org/", "a/b/",
                               "\x00", "C:\\", "file://"]), st.text(max_size=15)).map("".join),
)


@FUZZ
@given(source_text)
def test_random_model_sources(source):
    """Model sources are looked at during validation (is the model a classifier?)."""
    doc = copy.deepcopy(DEFAULT)
    doc["model"]["source"] = source
    _only_recipe_errors(validate_recipe, doc, "fuzz.yaml", ROOT / "recipes" / "bert_sentiment.yaml")
