"""torch variants of causal LMs: dynamic INT8 (torch_int8) and torchao weight-only INT8 /
INT4 (torchao), each quantized by its stage, saved, loaded back through its causal loader,
and checked against the fp32 model: log-probs, greedy tokens, size on disk."""

from __future__ import annotations

import numpy as np
import pytest

from compress.formats import causal, torch_int8
from compress.formats import torchao as ao
from compress.core.registry import get_stage
from tests.stages.causal_helpers import causal_ctx
from tests.tiny_tokenizers import tiny_causal

pytest.importorskip("torchao")

TEXTS = ["the film was outstanding", "a cinema with zebras and a café"]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    return tiny_causal(tmp_path_factory.mktemp(request.param) / "m", request.param)


def _inputs(pred):
    seqs = [pred.tokenizer(t).input_ids for t in TEXTS]
    pad = causal.pad_id(pred.tokenizer)
    return causal.right_pad(seqs, pad), causal.left_pad(seqs, pad)


def _greedy(pred, n=12):
    _, (ids, mask) = _inputs(pred)
    return causal.greedy(pred, ids, mask, n, stop_at_eos=False)


def _weights_bytes(folder):
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".safetensors", ".pt"))


def _compare(pred, fp32, tol):
    (ids, mask), _ = _inputs(fp32)
    lp, ref = pred.logprobs(ids, mask), fp32.logprobs(ids, mask)  # [B, T-1]
    valid = mask[:, 1:].astype(bool)
    assert lp.shape == ref.shape and np.isfinite(lp[valid]).all()
    assert np.abs(lp - ref)[valid].max() < tol
    return np.abs(lp - ref)[valid].max()


def test_dynamic_int8_of_a_causal_lm_round_trips(tiny, tmp_path):
    out = tmp_path / "int8"
    result = get_stage("quantize_dynamic").run(causal_ctx(get_stage("quantize_dynamic"), tiny, out, keep_fp32=[]))
    assert result.format == "torch_int8" and result.fp32_layers == [] and result.quantized_layers == 15  # 2 x 7 + lm_head
    pred = torch_int8.load_causal(out, "cpu", 1, {})
    fp32 = causal.load_hf(tiny, "cpu", 1, {})
    _compare(pred, fp32, tol=0.05)
    # A random tiny model's logits are nearly flat, so one INT8 rounding can flip an argmax:
    # the first tokens agree, and the loop runs the KV cache through every step.
    a, b = _greedy(pred), _greedy(fp32)
    assert a.shape == b.shape == (2, 12) and (a[:, :3] == b[:, :3]).all()
    assert _weights_bytes(out) < 0.7 * _weights_bytes(tiny)
    assert pred.num_params() == fp32.num_params() + fp32.model.lm_head.weight.numel()  # lm_head's own INT8 copy
    assert pred.memory_bytes() < fp32.memory_bytes()


def test_dynamic_int8_keeps_down_projections_and_the_tied_head_fp32_by_default(tiny, tmp_path):
    out = tmp_path / "int8"
    kind = get_stage("quantize_dynamic")
    result = kind.run(causal_ctx(kind, tiny, out, mode="all"))
    assert result.fp32_layers == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj", "lm_head"]
    pred = torch_int8.load_causal(out, "cpu", 1, {})
    # Stored once, tied again on load.
    assert pred.model.lm_head.weight.data_ptr() == pred.model.get_input_embeddings().weight.data_ptr()
    _compare(pred, causal.load_hf(tiny, "cpu", 1, {}), tol=0.05)


def test_accuracy_aware_is_refused_for_a_causal_lm(tiny, tmp_path):
    kind = get_stage("quantize_dynamic")
    with pytest.raises(ValueError, match="use mode: all"):
        kind.run(causal_ctx(kind, tiny, tmp_path / "o", mode="accuracy_aware"))
    assert kind.check_model(kind.config(mode="accuracy_aware"), {"architectures": ["LlamaForCausalLM"]})
    assert kind.check_model(kind.config(), {"architectures": ["LlamaForCausalLM"]}) is None


@pytest.mark.parametrize("scheme,group,tol", [("int8", None, 0.05), ("int4", 32, 0.5), ("int4", 64, 0.5)])
def test_torchao_weight_only_round_trips(tiny, tmp_path, scheme, group, tol):
    out = tmp_path / scheme
    kind = get_stage("quantize_weights")
    result = kind.run(causal_ctx(kind, tiny, out, scheme=scheme, **({"group_size": group} if group else {})))
    assert result.format == "torchao" and result.fp32_layers == [] and result.quantized_layers == 15
    assert result.torchao == ("Int8WeightOnlyConfig" if scheme == "int8" else "PrototypeInt4WeightOnlyConfig")
    pred = ao.load_causal(out, "cpu", 1, {})
    fp32 = causal.load_hf(tiny, "cpu", 1, {})
    diff = _compare(pred, fp32, tol)
    assert diff > 0  # quantized for real
    # The reloaded model is the saved one: the stage's own model gives the same log-probs.
    again = ao.load_causal(out, "cpu", 1, {})
    (ids, mask), _ = _inputs(fp32)
    assert np.array_equal(again.logprobs(ids, mask), pred.logprobs(ids, mask))
    g = _greedy(pred)
    assert g.shape == (2, 12)
    if scheme == "int8":
        assert (g[:, :3] == _greedy(fp32)[:, :3]).all()
    ratio = _weights_bytes(out) / _weights_bytes(tiny)
    assert ratio < (0.45 if scheme == "int8" else 0.35), ratio  # tiny tensors: pickle and scales weigh more than at scale
    assert pred.memory_bytes() < 0.4 * fp32.memory_bytes()
    assert pred.num_params() == fp32.num_params() + fp32.model.lm_head.weight.numel()  # head untied from the table


def test_int4_group_wider_than_the_model_leaves_layers_fp32_and_says_so(tiny, tmp_path):
    kind = get_stage("quantize_weights")
    result = kind.run(causal_ctx(kind, tiny, tmp_path / "o", scheme="int4", group_size=128))
    # hidden 64: no Linear whose input is 64 wide can be grouped by 128; the MLP's down
    # projection (input 128) can.
    assert result.quantized_layers == 2 and len(result.fp32_layers) == 13
    assert "not a multiple of group_size 128" in result.notes[0]
    assert kind.check_model(kind.config(scheme="int4", group_size=128), {"hidden_size": 576, "intermediate_size": 1536}) is None
    assert "divides none" in kind.check_model(kind.config(scheme="int4", group_size=128), {"hidden_size": 100})


def test_quantize_weights_config_is_checked_before_any_model_loads():
    from pydantic import ValidationError

    cfg = get_stage("quantize_weights").config
    with pytest.raises(ValidationError, match="group_size applies to scheme int4 only"):
        cfg(scheme="int8", group_size=32)
    with pytest.raises(ValidationError):
        cfg(scheme="int4", group_size=48)
    with pytest.raises(ValidationError):
        cfg(scheme="int2")
    assert cfg(scheme="int4").group_size is None


def test_torchao_imports_quietly():
    # torchao logs a "Failed to load ...so" warning per CUDA-only extension on a CPU machine,
    # and torch's pytree logger warns about its Enum registrations: quiet_import hides both.
    import subprocess
    import sys

    code = "from compress.formats import torchao as ao; ao.ao_configs('int4', 32); print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-500:]
    assert "Failed to load" not in out.stderr and "_pytree" not in out.stderr, out.stderr[-500:]
