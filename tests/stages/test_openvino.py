"""export_openvino and quantize_openvino on tiny random models, and the OpenVINO loader."""

import json

import numpy as np
import pytest

from compress.core.errors import StageError
from tests.stages.onnx_helpers import run_kind

pytest.importorskip("openvino")
pytest.importorskip("nncf")


@pytest.fixture(scope="module")
def onnx_dir(tiny_classifier, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ov") / "onnx"
    run_kind("export_onnx", {"parity_examples": 16}, tiny_classifier, "hf", tiny_data, out)
    return out


@pytest.fixture(scope="module")
def ov_dir(onnx_dir, tiny_classifier, tiny_data):
    out = onnx_dir.parent / "ov"
    run_kind("export_openvino", {"parity_examples": 40}, onnx_dir, "onnx", tiny_data, out, model=tiny_classifier)
    return out


def _logits(folder_a, fmt_a, folder_b, texts):
    from compress.formats import load_predictor

    a = load_predictor(fmt_a, folder_a, "cpu", 1)
    b = load_predictor("openvino", folder_b, "cpu", 1)
    enc = a.tokenizer(texts, padding=True, return_tensors="np")
    batch = {k: v.astype(np.int64) for k, v in enc.items()}
    pick = lambda p: {k: v for k, v in batch.items() if p.input_names is None or k in p.input_names}  # noqa: E731
    return a(pick(a)), b(pick(b))


def test_export_from_onnx_keeps_parity_and_dynamic_axes(ov_dir, onnx_dir):
    result = json.loads((ov_dir / "result.json").read_text()) if (ov_dir / "result.json").exists() else None
    files = {p.name for p in ov_dir.iterdir()}
    assert {"model.xml", "model.bin", "config.json", "tokenizer.json"} <= files
    assert not any(f.endswith(".onnx") for f in files)
    assert result is None  # run_kind writes no result.json: the runner does
    # Another batch size and length than the parity batches.
    a, b = _logits(onnx_dir, "onnx", ov_dir, ["a", "a much longer sentence than the first one", "mid one"])
    assert a.shape == b.shape == (3, 2)
    assert np.abs(a - b).max() < 1e-4


def test_export_from_torch(tiny_classifier, tiny_data, tmp_path):
    result = run_kind("export_openvino", {"parity_examples": 24}, tiny_classifier, "hf", tiny_data, tmp_path / "ov")
    assert result.source == "torch"
    assert result.parity["max_abs_diff"] < 1e-3 and result.parity["label_agreement"] == 100.0
    assert set(result.inputs) >= {"input_ids", "attention_mask"}
    assert not (tmp_path / "ov" / "model.safetensors").exists()  # the torch weights stay behind
    a, b = _logits(tiny_classifier, "hf", tmp_path / "ov", ["the plot was dull", "a lovely film, really lovely", "ok"])
    assert np.abs(a - b).max() < 1e-4


def test_export_fails_in_one_line_when_parity_is_broken(onnx_dir, tiny_classifier, tiny_data, tmp_path, monkeypatch):
    from compress.formats import openvino as ov_fmt

    original = ov_fmt.OpenVinoPredictor.__call__

    def perturbed(self, batch):  # a conversion that drifts: every logit of class 0 moved by 0.5
        out = original(self, batch).copy()
        out[:, 0] += 0.5
        return out

    monkeypatch.setattr(ov_fmt.OpenVinoPredictor, "__call__", perturbed)
    with pytest.raises(StageError) as exc:
        run_kind("export_openvino", {"parity_examples": 16}, onnx_dir, "onnx", tiny_data, tmp_path / "ov",
                 model=tiny_classifier)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "does not match its onnx source" in msg and "max |logit diff| 0.5" in msg and "tolerance" in msg


def test_loader_records_its_settings_and_counts_weights(ov_dir, onnx_dir):
    from compress.formats import load_predictor

    pred = load_predictor("openvino", ov_dir, "cpu", 2)
    onnx = load_predictor("onnx", onnx_dir, "cpu", 2)
    assert pred.input_names == tuple(i for i in onnx.input_names)
    note = " ".join(pred.notes)
    assert "LATENCY hint" in note and "2 threads" in note and "f32 inference precision" in note
    # Weights as the graph holds them: constant folding trims a few (a sliced position table),
    # as the ONNX count does; no shape or index constants are counted.
    assert abs(pred.num_params() - onnx.num_params()) < 0.001 * onnx.num_params()
    assert pred.size_bytes() >= (ov_dir / "model.bin").stat().st_size
    assert pred.memory_bytes() > 0
    # Asked for the GPU: runs on the CPU and says so (the benchmark never asks; see CPU_ONLY).
    gpu = load_predictor("openvino", ov_dir, "cuda", 1)
    assert gpu.effective_device == "cpu" and any("no CUDA plugin" in n for n in gpu.notes)


def test_quantize_int8_calibrated(ov_dir, tiny_classifier, tiny_data, tmp_path):
    from compress.formats import load_predictor

    out = tmp_path / "int8"
    result = run_kind("quantize_openvino", {"calibration_examples": 32, "parity_examples": 32}, ov_dir, "openvino",
                      tiny_data, out, model=tiny_classifier)
    assert result.mode == "int8"
    assert result.operations["FakeQuantize"] > 0
    assert "i8" in result.operations["weights"] or "u8" in result.operations["weights"]
    assert result.fp32_layers == []  # every Linear layer quantized (no accuracy control, nothing kept)
    assert result.size_bytes["output"] < result.size_bytes["input"] / 2
    assert result.parity["examples"] == 32 and result.parity["label_agreement"] > 50
    assert {"model.xml", "model.bin", "tokenizer.json", "config.json"} <= {p.name for p in out.iterdir()}
    # The INT8 weights count as parameters, their scales and the activation ranges do not
    # (SmoothQuant's per-channel factors, a few hundred here, do).
    fp32, int8 = (load_predictor("openvino", d, "cpu", 1).num_params() for d in (ov_dir, out))
    assert fp32 <= int8 < fp32 * 1.001


def test_quantize_int8_keep_fp32_leaves_layers_in_float(ov_dir, tiny_classifier, tiny_data, tmp_path):
    result = run_kind("quantize_openvino", {"calibration_examples": 16, "parity_examples": 8,
                                            "keep_fp32": ["*layer.1/output/dense*"]},
                      ov_dir, "openvino", tiny_data, tmp_path / "int8", model=tiny_classifier)
    assert result.fp32_layers and all("layer.1/output/dense" in n for n in result.fp32_layers)


def test_quantize_int8_with_accuracy_control(ov_dir, tiny_classifier, tiny_data, tmp_path):
    result = run_kind("quantize_openvino", {"calibration_examples": 16, "accuracy_control": True,
                                            "validation_examples": 48, "max_iterations": 2, "parity_examples": 8},
                      ov_dir, "openvino", tiny_data, tmp_path / "int8", model=tiny_classifier)
    control = result.accuracy_control
    assert control["examples"] == 48 and control["target_drop"] == 2.5  # half of the tiny recipe's 5-point budget
    assert 0 <= control["int8_accuracy"] <= 100 and 0 <= control["fp32_accuracy"] <= 100
    assert control["met"] == (control["fp32_accuracy"] - control["int8_accuracy"] <= 2.5)


@pytest.mark.parametrize("mode, bits", [("weights_int8", {"u8"}), ("weights_int4", {"i4"})])
def test_quantize_weights_only(ov_dir, tiny_classifier, tiny_data, tmp_path, mode, bits):
    result = run_kind("quantize_openvino", {"mode": mode, "parity_examples": 16}, ov_dir, "openvino", tiny_data,
                      tmp_path / mode, model=tiny_classifier)
    assert result.operations["FakeQuantize"] == 0  # activations stay float
    assert bits <= set(result.operations["weights"])
    assert result.size_bytes["output"] < result.size_bytes["input"] / 2
    assert result.parity["examples"] == 16
    # Compressed weights count as the parameters they were, their scales and zero points not at all.
    from compress.formats import load_predictor

    fp32, small = (load_predictor("openvino", d, "cpu", 1).num_params() for d in (ov_dir, tmp_path / mode))
    assert small == fp32


def test_benchmark_worker_measures_an_openvino_variant(ov_dir, tiny_classifier, tmp_path):
    # The benchmark's loader path: the worker measures an OpenVINO folder as it measures the
    # others (same inputs, batch 1 and a larger batch), and a later round pairs it with a
    # torch baseline in one process.
    from compress.bench import worker as bench_worker

    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"text": f"a {'fine ' * (i % 4)}film {i}", "label": i % 2}) + "\n"
                                 for i in range(10)))
    spec = {"format": "openvino", "path": str(ov_dir), "device": "cpu", "threads": 1, "batch_sizes": [1, 4],
            "max_length": 32, "warmup": 1, "max_latency_examples": 6, "eval_file": str(eval_file)}
    result = bench_worker.measure(spec)
    assert result.ok and len(result.predictions) == 10 and result.latency_ms.n == 6
    assert {b.batch_size for b in result.batches} == {1, 4}
    assert any("LATENCY hint, 1 threads" in n for n in result.notes)
    assert result.params > 0 and result.size_bytes > 0
    # The same labels as the ONNX graph it came from, sentence by sentence.
    onnx = bench_worker.measure({**spec, "format": "onnx", "path": str(ov_dir.parent / "onnx")})
    assert result.predictions == onnx.predictions
    paired = bench_worker.measure_paired({**spec, "latency_only": True,
                                          "pair": {"format": "hf", "path": str(tiny_classifier), "options": {}}})
    assert paired.ok and len(paired.sentence_ms) == len(paired.pair_sentence_ms) == 6


def test_export_from_a_fused_onnx_graph(onnx_dir, tiny_classifier, tiny_data, tmp_path):
    # onnxruntime's fused operators (Attention, SkipLayerNormalization, BiasGelu) are read too.
    fused = tmp_path / "o2"
    opt = run_kind("optimize_onnx", {"level": "O2", "parity_examples": 8}, onnx_dir, "onnx", tiny_data, fused,
                   model=tiny_classifier)
    assert opt.operators.get("Attention", 0) == 2
    result = run_kind("export_openvino", {"parity_examples": 16}, fused, "onnx", tiny_data, tmp_path / "ov",
                      model=tiny_classifier)
    assert result.source == "onnx" and result.parity["max_abs_diff"] < 1e-3


# --- A tampered or truncated IR (issue "Hostile inputs, third round", item 9) ----------------

@pytest.mark.parametrize("damage, needle", [
    ("external_entity", "declares a DTD or entities"),
    ("xml_cut", "truncated (it does not end its <net> element)"),
    ("bin_cut", "truncated"),
    ("bin_empty", "truncated"),
])
def test_a_tampered_or_truncated_ir_is_one_line_and_never_loaded(ov_dir, tmp_path, damage, needle):
    """Outside a run's sealed folders (a folder copied out, a library call): the IR is checked
    before OpenVINO reads it. Inside a run the checksums catch the same edits (rebuilt)."""
    import shutil

    from compress.core.errors import ArtifactError
    from compress.formats import load_predictor

    folder = tmp_path / "ov"
    shutil.copytree(ov_dir, folder)
    xml, weights = folder / "model.xml", folder / "model.bin"
    if damage == "external_entity":
        text = xml.read_text()
        head, _, rest = text.partition("?>")
        xml.write_text(head + '?>\n<!DOCTYPE net [<!ENTITY leak SYSTEM "file:///etc/passwd">]>' + rest.replace(
            'name="', 'name="&leak;', 1))
    elif damage == "xml_cut":
        xml.write_bytes(xml.read_bytes()[: xml.stat().st_size // 2])
    elif damage == "bin_cut":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size - 16])
    else:
        weights.write_bytes(b"")
    with pytest.raises(ArtifactError) as exc:
        load_predictor("openvino", folder, "cpu", 1)
    message = str(exc.value)
    assert needle in message and "\n" not in message
    assert ("model.xml" if damage in ("external_entity", "xml_cut") else "model.bin") in message
