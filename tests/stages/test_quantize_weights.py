"""quantize_weights in a recipe: its settings are checked where a recipe names them, and
the stage is catalogued for causal LMs only."""

from __future__ import annotations

import pytest

from compress.registry import get_stage


def test_catalogued_for_causal_lms_and_producing_torchao():
    kind = get_stage("quantize_weights")
    assert kind.tasks == ("causal-lm",) and kind.produces == "torchao" and kind.accepts == ("hf",)
    assert "causal-lm" in get_stage("quantize_dynamic").tasks


def test_every_setting_is_described_and_unknown_keys_are_refused():
    from pydantic import ValidationError

    cfg = get_stage("quantize_weights").config
    assert all(f.description for f in cfg.model_fields.values())
    with pytest.raises(ValidationError):
        cfg(scheme="int4", groupsize=32)


def test_a_classification_recipe_cannot_use_it(tiny_classifier, tiny_data):
    from compress.errors import RecipeError
    from compress.recipe import validate_recipe
    from tests.conftest import tiny_recipe

    r = tiny_recipe(tiny_classifier, tiny_data)
    r["stages"] = [{"id": "w4", "uses": "quantize_weights", "with": {"scheme": "int4"}}]
    with pytest.raises(RecipeError, match="does not take task 'sequence-classification'"):
        validate_recipe(r)
