import json
import subprocess
import sys

import numpy as np
import pytest

from tests.stages.onnx_helpers import run_kind


def _bnb_cpu_problem() -> str | None:
    try:
        from compress.formats.bnb_4bit import check_backend

        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        return f"bitsandbytes unavailable: {exc}"
    return check_backend("cpu")


@pytest.fixture(scope="module")
def trained(tokenizer_dir, tiny_data, tmp_path_factory):
    """A fine-tuned tiny classifier whose Linear shapes suit the 4-bit CPU kernels
    (multiples of 64 inputs and 32 outputs)."""
    import shutil

    import torch
    from transformers import BertModel

    from compress.recipe.schema import validate_recipe
    from compress.run.runner import run_recipe
    from tests.conftest import tiny_config, tiny_recipe

    torch.manual_seed(0)
    ckpt = tmp_path_factory.mktemp("ckpt64")
    BertModel(tiny_config(hidden_size=64, intermediate_size=128)).save_pretrained(ckpt)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, ckpt)
    raw = tiny_recipe(ckpt, tiny_data)
    raw["stages"] = raw["stages"][:1]
    raw["benchmark"]["batch_sizes"] = [1]
    raw["benchmark"]["max_latency_examples"] = 4
    root = tmp_path_factory.mktemp("bnb")
    run_recipe(validate_recipe(raw), root, log=lambda m: None, threads=1)
    return root / "tiny" / "baseline"


SCRIPT = """
import json, sys, numpy as np, torch
torch.set_num_threads(1)
from compress.formats import load_predictor
path, texts = sys.argv[1], json.loads(sys.argv[2])
out = {}
for fmt, p in (("hf", sys.argv[3]), ("bnb_4bit", path)):
    pred = load_predictor(fmt, __import__("pathlib").Path(p), "cpu", 1)
    enc = pred.tokenizer(texts, padding=True, return_tensors="np")
    out[fmt] = pred({k: v.astype(np.int64) for k, v in enc.items()}).tolist()
    out[fmt + "_params"] = pred.num_params()
    out[fmt + "_memory"] = pred.memory_bytes()
print(json.dumps(out))
"""


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_round_trips_through_a_fresh_process(trained, tiny_data, tmp_path, quant_type):
    problem = _bnb_cpu_problem()
    if problem:
        pytest.skip(problem)
    out = tmp_path / "q4"
    result = run_kind("load_4bit", {"quant_type": quant_type, "parity_examples": 64}, trained, "hf", tiny_data, out)
    assert result.linear_4bit == 2 * 6  # q, k, v, attention output, intermediate, output per layer
    assert result.parity["label_agreement"] >= 90
    files = {p.name for p in out.iterdir()}
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt")) for f in files)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["bnb_4bit_quant_type"] == quant_type

    texts = ["the movie was great", "the plot was dull and the acting poor", "a lovely film"]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(out), json.dumps(texts), str(trained)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    ref, q = np.array(got["hf"]), np.array(got["bnb_4bit"])
    assert np.abs(ref - q).max() < 0.25 * np.abs(ref).max() + 0.05
    assert (ref.argmax(-1) == q.argmax(-1)).all()
    # Parameters counted as the original weights; the memory is the packed one.
    assert got["bnb_4bit_params"] == got["hf_params"]
    assert got["bnb_4bit_memory"] < got["hf_memory"]


def test_4bit_keeps_the_head_in_full_precision(trained, tiny_data, tmp_path):
    problem = _bnb_cpu_problem()
    if problem:
        pytest.skip(problem)
    import torch

    from compress.formats import bnb_4bit

    run_kind("load_4bit", {"parity_examples": 8}, trained, "hf", tiny_data, tmp_path / "q4")
    pred = bnb_4bit.load(tmp_path / "q4", "cpu", 1, {})
    assert pred.model.classifier.weight.dtype == torch.float32
    assert pred.model.bert.embeddings.word_embeddings.weight.dtype == torch.float32
    assert type(pred.model.classifier).__name__ == "Linear"


def test_old_bitsandbytes_is_refused_with_a_reason(monkeypatch):
    import importlib.metadata

    from compress.formats import bnb_4bit

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.45.0")
    assert "no CPU 4-bit kernels" in bnb_4bit.check_backend("cpu")
    assert bnb_4bit.check_backend("cuda") is None


def test_layers_the_cpu_kernels_cannot_tile_stay_in_full_precision(tiny_classifier, tiny_data, tmp_path):
    problem = _bnb_cpu_problem()
    if problem:
        pytest.skip(problem)
    # hidden 32: every layer reading the hidden state has 32 inputs, not a multiple of 64.
    result = run_kind("load_4bit", {"parity_examples": 8}, tiny_classifier, "hf", tiny_data, tmp_path / "q4")
    assert result.linear_4bit == 2  # the two FFN output layers (64 inputs, 32 outputs)
    assert any("kept in full precision" in n for n in result.notes)


def test_missing_bitsandbytes_fails_validation_with_the_fix(tiny_classifier, tiny_data, monkeypatch):
    import importlib.util

    from compress.core.errors import RecipeError
    from compress.recipe.schema import validate_recipe
    from tests.conftest import tiny_recipe

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    raw = tiny_recipe(tiny_classifier, tiny_data)
    raw["stages"] = [{"id": "nf4", "uses": "load_4bit"}]
    raw["budget"] = {"baseline": "model"}
    with pytest.raises(RecipeError) as exc:
        validate_recipe(raw)
    assert exc.value.key.startswith("stages[0].with") and "pip install" in exc.value.message
