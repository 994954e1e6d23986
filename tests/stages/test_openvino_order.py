"""Which orders of export_openvino and quantize_openvino a recipe may use: refused ones
fail validation naming the key and why (no model loads); allowed ones validate."""

import pytest

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from tests.conftest import tiny_recipe


def _recipe(model, data, stages):
    raw = tiny_recipe(model, data)
    raw["stages"] = [{"id": "baseline", "uses": "finetune", "with": {"epochs": 1}}] + stages
    return raw


@pytest.mark.parametrize("stages, index, key, why", [
    ([{"id": "ov", "uses": "export_openvino", "from": "baseline"},
      {"id": "q1", "uses": "quantize_openvino", "from": "ov"},
      {"id": "q2", "uses": "quantize_openvino", "from": "q1", "with": {"mode": "weights_int4"}}],
     3, "from", "already quantized"),
    ([{"id": "int8", "uses": "quantize_dynamic", "from": "baseline"},
      {"id": "ov", "uses": "export_openvino", "from": "int8"}], 2, "from", "torch_int8"),
    ([{"id": "onnx", "uses": "export_onnx", "from": "baseline"},
      {"id": "q", "uses": "quantize_onnx", "from": "onnx"},
      {"id": "ov", "uses": "export_openvino", "from": "q"}], 3, "from", "INT8 ONNX graph"),
    ([{"id": "ov", "uses": "export_openvino", "from": "baseline"},
      {"id": "onnx", "uses": "export_onnx", "from": "ov"}], 2, "from", "goes back neither to torch nor to ONNX"),
    ([{"id": "ov", "uses": "export_openvino", "from": "baseline"},
      {"id": "q", "uses": "quantize_onnx", "from": "ov"}], 2, "from", "openvino"),
    ([{"id": "onnx", "uses": "export_onnx", "from": "baseline"},
      {"id": "q", "uses": "quantize_openvino", "from": "onnx"}], 2, "from", "onnx"),
    ([{"id": "ov", "uses": "export_openvino", "from": "baseline"},
      {"id": "q", "uses": "quantize_openvino", "from": "ov", "with": {"mode": "weights_int8", "accuracy_control": True}}],
     2, "with", "accuracy_control works with mode int8 only"),
])
def test_refused_orders_fail_validation_naming_the_key(tiny_checkpoint, tiny_data, stages, index, key, why):
    with pytest.raises(RecipeError) as exc:
        validate_recipe(_recipe(tiny_checkpoint, tiny_data, stages))
    assert exc.value.key.startswith(f"stages[{index}].{key}")
    assert why in exc.value.message


def test_allowed_orders_validate(tiny_checkpoint, tiny_data):
    stages = [
        {"id": "ov", "uses": "export_openvino", "from": "baseline"},
        {"id": "onnx", "uses": "export_onnx", "from": "baseline"},
        {"id": "ov_from_onnx", "uses": "export_openvino", "from": "onnx"},
        {"id": "ov_int8", "uses": "quantize_openvino", "from": "ov_from_onnx",
         "with": {"accuracy_control": True, "max_drop": 0.5}},
        {"id": "ov_w4", "uses": "quantize_openvino", "from": "ov", "with": {"mode": "weights_int4", "group_size": -1}},
        {"id": "onnx_int8", "uses": "quantize_onnx", "from": "onnx"},
    ]
    recipe = validate_recipe(_recipe(tiny_checkpoint, tiny_data, stages))
    assert recipe.stage("ov_int8").config.max_drop == 0.5
