import subprocess
import sys

import numpy as np
import torch

from compress.formats import load_predictor, torch_int8
from compress.formats.hf import load_model


def _batch(tok, texts):
    enc = tok(texts, padding=True, return_tensors="np")
    return {k: v.astype(np.int64) for k, v in enc.items()}


def test_roundtrip_without_pickle_gives_identical_logits(tiny_classifier, tmp_path):
    model = load_model(tiny_classifier).eval()
    names = torch_int8.linear_layers(model)
    layers = {n: ("per_channel" if i % 2 else "per_tensor") for i, n in enumerate(names[:-1])}
    torch_int8.quantize(model, layers)
    model.config.save_pretrained(tmp_path)
    torch_int8.save(model, layers, [names[-1]], tmp_path)
    assert {p.suffix for p in tmp_path.iterdir()} <= {".json", ".safetensors"}  # nothing pickled

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_classifier)
    tok.save_pretrained(tmp_path)
    batch = _batch(tok, ["a great film", "the plot was dull and long"])
    with torch.inference_mode():
        expected = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits.numpy()

    pred = load_predictor("torch_int8", tmp_path, "cpu", 1)
    np.testing.assert_allclose(pred(batch), expected, rtol=0, atol=1e-6)
    fp32_size = (tiny_classifier / "model.safetensors").stat().st_size
    assert pred.size_bytes() < fp32_size

    # ... and in a fresh process, as the benchmark loads it.
    np.save(tmp_path / "expected.npy", expected)
    code = (
        "import numpy as np, sys; from compress.formats import load_predictor; "
        "from transformers import AutoTokenizer; p = sys.argv[1]; "
        "tok = AutoTokenizer.from_pretrained(p); "
        "enc = {k: v.astype(np.int64) for k, v in tok(['a great film', 'the plot was dull and long'], padding=True, return_tensors='np').items()}; "
        "out = load_predictor('torch_int8', __import__('pathlib').Path(p), 'cpu', 1)(enc); "
        "np.testing.assert_allclose(out, np.load(p + '/expected.npy'), atol=1e-6)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
