import shutil

import numpy as np
import pytest

from compress.core.errors import StageError
from tests.conftest import tiny_config
from tests.stages.onnx_helpers import run_kind


def _torch_and_onnx_logits(torch_dir, onnx_dir, texts):
    from compress.formats import hf, onnx as onnx_fmt

    ref = hf.load(torch_dir, "cpu", 1, {})
    exp = onnx_fmt.load(onnx_dir, "cpu", 1, {})
    enc = ref.tokenizer(texts, padding=True, return_tensors="np")
    batch = {k: v.astype(np.int64) for k, v in enc.items()}
    return ref(batch), exp({k: v for k, v in batch.items() if k in exp.input_names})


def test_export_parity_passes_and_writes_a_complete_folder(tiny_classifier, tiny_data, tmp_path):
    out = tmp_path / "onnx"
    result = run_kind("export_onnx", {"parity_examples": 40}, tiny_classifier, "hf", tiny_data, out)
    files = {p.name for p in out.iterdir()}
    assert {"model.onnx", "config.json", "tokenizer.json"} <= files
    assert result.parity["examples"] == 40
    assert result.parity["max_abs_diff"] < 1e-3 and result.parity["label_agreement"] == 100.0
    assert set(result.inputs) >= {"input_ids", "attention_mask"}

    # Dynamic axes: another batch size and length than anything seen at export.
    a, b = _torch_and_onnx_logits(tiny_classifier, out, ["a", "a much longer sentence than the first one", "mid one"])
    assert a.shape == b.shape == (3, 2)
    assert np.abs(a - b).max() < 1e-4


def test_export_fails_in_one_line_when_parity_is_broken(tiny_classifier, tiny_data, tmp_path, monkeypatch):
    from compress.formats import onnx as onnx_fmt

    original = onnx_fmt.OnnxPredictor.__call__

    def perturbed(self, batch):  # an export that drifts: every logit of class 0 moved by 0.5
        out = original(self, batch).copy()
        out[:, 0] += 0.5
        return out

    monkeypatch.setattr(onnx_fmt.OnnxPredictor, "__call__", perturbed)
    with pytest.raises(StageError) as exc:
        run_kind("export_onnx", {"parity_examples": 16}, tiny_classifier, "hf", tiny_data, tmp_path / "onnx")
    msg = str(exc.value)
    assert "\n" not in msg
    assert "max |logit diff| 0.5" in msg and "label agreement" in msg and "tolerance" in msg


def test_export_fails_with_tolerance_zero_and_agreement_limit(tiny_classifier, tiny_data, tmp_path, monkeypatch):
    # Tolerance 0 is impossible as soon as the two runtimes round differently.
    from compress.formats import onnx as onnx_fmt

    monkeypatch.setattr(onnx_fmt, "compare", lambda *a, **k: {"examples": 8, "max_abs_diff": 1e-7, "label_agreement": 100.0})
    with pytest.raises(StageError, match=r"max \|logit diff\| 1e-07 \(tolerance 0\)"):
        run_kind("export_onnx", {"parity_examples": 8, "tolerance": 0}, tiny_classifier, "hf", tiny_data, tmp_path / "o")


def test_export_of_pruned_fewer_layer_model(tokenizer_dir, tiny_data, tmp_path):
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config(num_hidden_layers=1, intermediate_size=48, vocab_size=30522))
    model.prune_heads({0: [0, 2]})  # 2 of 4 heads left in the only layer
    src = tmp_path / "pruned"
    model.save_pretrained(src)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, src)
    result = run_kind("export_onnx", {"parity_examples": 24}, src, "hf", tiny_data, tmp_path / "onnx")
    assert result.parity["max_abs_diff"] < 1e-3
    a, b = _torch_and_onnx_logits(src, tmp_path / "onnx", ["the plot was dull", "a lovely film"])
    assert np.abs(a - b).max() < 1e-4


def test_export_of_uneven_heads_across_layers(tokenizer_dir, tiny_data, tmp_path):
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config(num_hidden_layers=2))
    model.prune_heads({0: [1], 1: [0, 1, 3]})  # 3 heads, then 1
    src = tmp_path / "pruned"
    model.save_pretrained(src)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, src)
    result = run_kind("export_onnx", {"parity_examples": 24}, src, "hf", tiny_data, tmp_path / "onnx")
    assert result.parity["max_abs_diff"] < 1e-3
    # The fused graph (attention fusion reads each layer's head count) stays exact too.
    opt = run_kind("optimize_onnx", {"level": "O2", "parity_examples": 16}, tmp_path / "onnx", "onnx", tiny_data,
                   tmp_path / "o2", model=src)
    assert opt.operators.get("Attention", 0) == 2
    assert opt.parity["max_abs_diff"] < 1e-4


def test_export_of_trimmed_vocabulary(tiny_classifier, tiny_data, tmp_path):
    from tests.conftest import run_stage

    trimmed = tmp_path / "trimmed"
    run_stage(tiny_classifier, tiny_data, trimmed, "trim_vocab", {})
    import json

    vocab = json.loads((trimmed / "config.json").read_text())["vocab_size"]
    assert vocab < 30522
    result = run_kind("export_onnx", {"parity_examples": 24}, trimmed, "hf", tiny_data, tmp_path / "onnx")
    assert result.parity["max_abs_diff"] < 1e-3
    a, b = _torch_and_onnx_logits(trimmed, tmp_path / "onnx", ["the plot was dull", "a lovely film"])
    assert np.abs(a - b).max() < 1e-4
