import json

import pytest

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from compress.run.runner import run_recipe
from tests.conftest import tiny_recipe


def _recipe(model, data, **with_):
    r = tiny_recipe(model, data)
    r["stages"] = [{"id": "int8", "uses": "quantize_dynamic", "with": {"calibration_examples": 64, "sensitivity_examples": 32, **with_}}]
    r["budget"]["baseline"] = "model"
    return r


def test_all_layers_quantized_and_recorded(tiny_classifier, tiny_data, tmp_path):
    run_recipe(validate_recipe(_recipe(tiny_classifier, tiny_data, mode="all")), tmp_path, log=lambda m: None)
    result = json.loads((tmp_path / "tiny" / "int8" / "result.json").read_text())
    assert result["fp32_layers"] == [] and result["quantized_layers"] == 14  # 2 layers x 6 Linear (q, k, v, out, ffn in, ffn out) + pooler + classifier


def test_accuracy_aware_falls_back_when_the_target_is_impossible(tiny_classifier, tiny_data, tmp_path):
    # A random model: quantization moves its logits, and a target of -1 points can never be met,
    # so the most sensitive layers go back to fp32 up to the limit, and the shortfall is noted.
    r = _recipe(tiny_classifier, tiny_data, max_drop=0.0, max_fp32_layers=3)
    r["stages"][0]["with"]["calibration_examples"] = 200
    run_recipe(validate_recipe(r), tmp_path, log=lambda m: None)
    result = json.loads((tmp_path / "tiny" / "int8" / "result.json").read_text())
    calib = result["calibration"]
    assert calib["target_drop"] == 0.0
    if calib["fp32_accuracy"] - calib["steps"][0]["accuracy"] > 0:
        assert 1 <= len(result["fp32_layers"]) <= 3
        assert len(calib["steps"]) >= 2
    spec = json.loads((tmp_path / "tiny" / "int8" / "quantization.json").read_text())
    assert set(spec["fp32_layers"]) == set(result["fp32_layers"])
    assert not set(spec["layers"]) & set(spec["fp32_layers"])


def test_keep_fp32_patterns(tiny_classifier, tiny_data, tmp_path):
    run_recipe(validate_recipe(_recipe(tiny_classifier, tiny_data, mode="all", keep_fp32=["classifier", "bert.pooler.*"])),
               tmp_path, log=lambda m: None)
    result = json.loads((tmp_path / "tiny" / "int8" / "result.json").read_text())
    assert sorted(result["fp32_layers"]) == ["bert.pooler.dense", "classifier"]


def test_budget_change_reruns_the_stage(tiny_classifier, tiny_data, tmp_path):
    r = _recipe(tiny_classifier, tiny_data)
    run_recipe(validate_recipe(r), tmp_path, log=lambda m: None)
    logs = []
    run_recipe(validate_recipe(r), tmp_path, log=logs.append)
    assert any("int8" in m and "reused" in m for m in logs)
    r["budget"]["max_accuracy_drop"] = 0.5
    logs.clear()
    run_recipe(validate_recipe(r), tmp_path, log=logs.append)
    assert any("int8" in m and "running" in m for m in logs)


def test_bad_settings_name_the_key(tiny_classifier, tiny_data):
    with pytest.raises(RecipeError) as exc:
        validate_recipe(_recipe(tiny_classifier, tiny_data, scheme="per_row"))
    assert exc.value.key == "stages[0].with.scheme"
