"""The GPU path: every torch variant on CUDA (fp32 and autocast), ONNX through the CUDA
execution provider, 4-bit on CUDA. Skipped cleanly without a CUDA device (conftest)."""

import shutil

import numpy as np
import pytest

from tests.stages.onnx_helpers import run_kind

pytestmark = pytest.mark.gpu


def _batch(pred, texts):
    enc = pred.tokenizer(texts, padding=True, return_tensors="np")
    return {k: v.astype(np.int64) for k, v in enc.items() if pred.input_names is None or k in pred.input_names}


TEXTS = ["the movie was great", "the plot was dull and the acting poor"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_torch_variant_on_cuda_matches_cpu(tiny_classifier, dtype):
    from compress.formats import load_predictor

    cpu = load_predictor("hf", tiny_classifier, "cpu", 1)
    gpu = load_predictor("hf", tiny_classifier, "cuda", 1, {"cuda_dtype": dtype})
    a, b = cpu(_batch(cpu, TEXTS)), gpu(_batch(gpu, TEXTS))
    gpu.sync()
    assert np.abs(a - b).max() < (1e-4 if dtype == "fp32" else 5e-2)
    assert getattr(gpu, "effective_device", "cuda") == "cuda"


def test_onnx_on_the_cuda_provider(tiny_classifier, tiny_data, tmp_path):
    import onnxruntime as ort

    from compress.formats import load_predictor

    run_kind("export_onnx", {"parity_examples": 8}, tiny_classifier, "hf", tiny_data, tmp_path / "onnx")
    pred = load_predictor("onnx", tmp_path / "onnx", "cuda", 1)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert pred.effective_device == "cpu"  # onnxruntime without CUDA: honest fallback
        pytest.skip("onnxruntime here has no CUDA execution provider (install onnxruntime-gpu)")
    assert pred.effective_device == "cuda"
    cpu = load_predictor("onnx", tmp_path / "onnx", "cpu", 1)
    assert np.abs(cpu(_batch(cpu, TEXTS)) - pred(_batch(pred, TEXTS))).max() < 1e-3

    run_kind("quantize_onnx", {"parity_examples": 8}, tmp_path / "onnx", "onnx", tiny_data, tmp_path / "q",
             model=tiny_classifier)
    q = load_predictor("onnx", tmp_path / "q", "cuda", 1)
    assert q.effective_device == "cpu" and any("INT8" in n for n in q.notes)


def test_4bit_on_cuda(tokenizer_dir, tiny_data, tmp_path):
    import torch
    from transformers import BertForSequenceClassification

    from compress.formats import load_predictor
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    src = tmp_path / "clf64"
    BertForSequenceClassification(tiny_config(hidden_size=64, intermediate_size=128)).save_pretrained(src)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, src)
    result = run_kind("load_4bit", {"compute_dtype": "float16", "parity_examples": 8}, src, "hf", tiny_data,
                      tmp_path / "q4", device="cuda")
    assert result.linear_4bit == 12
    pred = load_predictor("bnb_4bit", tmp_path / "q4", "cuda", 1)
    out = pred(_batch(pred, TEXTS))
    pred.sync()
    assert out.shape == (2, 2) and pred.effective_device == "cuda"
    assert pred.memory_bytes() < load_predictor("hf", src, "cuda", 1).memory_bytes()


def test_gradient_importance_on_cuda_matches_cpu(tiny_classifier):
    """Pruning scores heads and neurons with masks multiplied into the activations: they
    must live on the model's device, and the scores come back on the CPU."""
    import torch
    from transformers import BertForSequenceClassification

    from compress.stages.prune import ARCHS, importance_scores

    x = {"input_ids": torch.randint(3, 100, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long),
         "labels": torch.tensor([0, 1])}
    model = BertForSequenceClassification.from_pretrained(tiny_classifier)
    cpu_heads, cpu_ffn = importance_scores(model, ARCHS["bert"], "gradient", [x])
    heads, ffn = importance_scores(model.to("cuda"), ARCHS["bert"], "gradient",
                                   [{k: v.to("cuda") for k, v in x.items()}])
    assert all(h.device.type == "cpu" for h in heads + ffn)
    for a, b in zip(cpu_heads + cpu_ffn, heads + ffn):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_worker_reports_peak_gpu_memory(tiny_classifier, tmp_path):
    import json

    from compress.bench import worker as bench_worker

    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("".join(json.dumps({"text": f"a fine film number {i}", "label": i % 2}) + "\n" for i in range(8)))
    result = bench_worker.measure({"format": "hf", "path": str(tiny_classifier), "device": "cuda", "threads": 1,
                                   "batch_sizes": [1, 4], "max_length": 32, "warmup": 1, "max_latency_examples": 4,
                                   "eval_file": str(eval_file)})
    assert result.ok and result.effective_device == "cuda"
    assert result.peak_memory_bytes >= result.memory_bytes > 0  # weights plus activations
