"""Which orders of export_onnx, optimize_onnx, quantize_onnx and load_4bit a recipe may
use: refused ones fail validation naming the key and why; allowed ones run."""

import pytest

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from tests.conftest import tiny_recipe
from tests.stages.onnx_helpers import run_kind


def _recipe(model, data, stages):
    raw = tiny_recipe(model, data)
    raw["stages"] = [{"id": "baseline", "uses": "finetune", "with": {"epochs": 1}}] + stages
    return raw


@pytest.mark.parametrize("stages, index, why", [
    ([{"id": "onnx", "uses": "export_onnx", "from": "baseline"},
      {"id": "q1", "uses": "quantize_onnx", "from": "onnx"},
      {"id": "q2", "uses": "quantize_onnx", "from": "q1"}], 3, "already INT8"),
    ([{"id": "onnx", "uses": "export_onnx", "from": "baseline"},
      {"id": "q1", "uses": "quantize_onnx", "from": "onnx"},
      {"id": "o2", "uses": "optimize_onnx", "from": "q1"},
      {"id": "q2", "uses": "quantize_onnx", "from": "o2"}], 4, "already INT8"),
    ([{"id": "nf4", "uses": "load_4bit", "from": "baseline"},
      {"id": "onnx", "uses": "export_onnx", "from": "nf4"}], 2, "no ONNX export"),
    ([{"id": "nf4", "uses": "load_4bit", "from": "baseline"},
      {"id": "q", "uses": "quantize_dynamic", "from": "nf4"}], 2, "quantizing them again"),
    ([{"id": "onnx", "uses": "export_onnx", "from": "baseline"},
      {"id": "q", "uses": "quantize_dynamic", "from": "onnx"}], 2, "does not go back to torch"),
])
def test_refused_orders_fail_validation_naming_the_key(tiny_checkpoint, tiny_data, stages, index, why):
    with pytest.raises(RecipeError) as exc:
        validate_recipe(_recipe(tiny_checkpoint, tiny_data, stages))
    assert exc.value.key == f"stages[{index}].from"
    assert why in exc.value.message


def test_allowed_orders_validate(tiny_checkpoint, tiny_data):
    stages = [
        {"id": "onnx", "uses": "export_onnx", "from": "baseline"},
        {"id": "o2", "uses": "optimize_onnx", "from": "onnx"},
        {"id": "o2_q", "uses": "quantize_onnx", "from": "o2"},
        {"id": "q", "uses": "quantize_onnx", "from": "onnx", "with": {"mode": "static"}},
        {"id": "q_o2", "uses": "optimize_onnx", "from": "q"},
        {"id": "o2_o3", "uses": "optimize_onnx", "from": "o2", "with": {"level": "O3"}},
        {"id": "nf4", "uses": "load_4bit", "from": "baseline"},
    ]
    validate_recipe(_recipe(tiny_checkpoint, tiny_data, stages))


@pytest.fixture(scope="module")
def exported(tiny_classifier, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("order") / "onnx"
    run_kind("export_onnx", {"parity_examples": 16}, tiny_classifier, "hf", tiny_data, out)
    return out


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_optimize_then_quantize_runs(exported, tiny_classifier, tiny_data, tmp_path, level, mode):
    # The fused graph failed ORT's quantizer with a shape inference error before the
    # stage ran symbolic shape inference; every level must now quantize.
    opt = run_kind("optimize_onnx", {"level": level, "parity_examples": 16}, exported, "onnx", tiny_data,
                   tmp_path / "opt", model=tiny_classifier)
    if level != "O1":
        assert opt.operators.get("Attention", 0) >= 1
    q = run_kind("quantize_onnx", {"mode": mode, "calibration_examples": 16, "parity_examples": 32},
                 tmp_path / "opt", "onnx", tiny_data, tmp_path / "q", model=tiny_classifier)
    assert q.quantized, "nothing was quantized"
    assert q.size_bytes["output"] < q.size_bytes["input"]
    if mode == "dynamic" and level != "O1":
        assert "QAttention" in q.quantized


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_quantize_then_optimize_runs(exported, tiny_classifier, tiny_data, tmp_path, mode):
    run_kind("quantize_onnx", {"mode": mode, "calibration_examples": 16, "parity_examples": 16},
             exported, "onnx", tiny_data, tmp_path / "q", model=tiny_classifier)
    opt = run_kind("optimize_onnx", {"level": "O2", "parity_examples": 16}, tmp_path / "q", "onnx", tiny_data,
                   tmp_path / "opt", model=tiny_classifier)
    assert opt.parity["label_agreement"] >= 90


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_every_static_calibration_method_runs(exported, tiny_classifier, tiny_data, tmp_path, method):
    # The histogram methods stack all calibration activations into one array: examples of
    # different lengths made onnxruntime fail with "inhomogeneous shape" until they were padded.
    q = run_kind("quantize_onnx", {"mode": "static", "calibration_method": method, "calibration_examples": 16,
                                   "parity_examples": 16}, exported, "onnx", tiny_data, tmp_path / "q", model=tiny_classifier)
    assert "DequantizeLinear" in q.quantized
    assert q.size_bytes["output"] < q.size_bytes["input"]
