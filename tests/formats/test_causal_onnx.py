"""The onnxruntime causal-LM predictor against torch on tiny random Llama and Qwen2 models:
logprobs within float tolerance, prefill + steps equal to a full forward, greedy identical,
batches with left padding."""

from __future__ import annotations

import numpy as np

from tests.tasks.causal_lm.test_export import tiny_lm, tiny_lm_onnx  # noqa: F401 (fixtures)


def _pair(hf_dir, onnx_dir):
    from compress.formats import causal, causal_onnx

    return causal.load_hf(hf_dir, "cpu", 1, {}), causal_onnx.load(onnx_dir, "cpu", 1, {})


def _prompts(tok, n=5):
    from compress.tasks.causal_lm import export as lm_export

    return lm_export.tokenizer_prompts(tok, n)


def test_logprobs_equal_torch(tiny_lm, tiny_lm_onnx):
    from compress.formats import causal

    ref, cand = _pair(tiny_lm, tiny_lm_onnx)
    seqs = [p + p[::-1] for p in _prompts(ref.tokenizer)]  # unequal lengths: right padding
    ids, mask = causal.right_pad(seqs, 3)
    a, b = ref.logprobs(ids, mask), cand.logprobs(ids, mask)
    assert a.shape == b.shape == (len(seqs), ids.shape[1] - 1) and b.dtype == np.float32
    valid = mask[:, 1:].astype(bool)
    assert np.abs(a[valid] - b[valid]).max() < 1e-4
    assert (b[valid] < 0).all()


def test_start_step_match_torch_and_greedy_identical_with_left_padding(tiny_lm, tiny_lm_onnx):
    from compress.formats import causal

    ref, cand = _pair(tiny_lm, tiny_lm_onnx)
    ids, mask = causal.left_pad(_prompts(ref.tokenizer), 3)
    assert (mask == 0).any()  # some rows are padded
    la, sa = ref.start(ids, mask)
    lb, sb = cand.start(ids, mask)
    assert lb.shape == (ids.shape[0], ref.config.vocab_size)
    assert np.abs(la - lb).max() < 1e-4
    tok = la.argmax(-1)
    for _ in range(3):
        la, sa = ref.step(tok, sa)
        lb, sb = cand.step(tok, sb)
        assert np.abs(la - lb).max() < 1e-4
        tok = la.argmax(-1)
    a = causal.greedy(ref, ids, mask, 12, stop_at_eos=False)
    b = causal.greedy(cand, ids, mask, 12, stop_at_eos=False)
    assert a.shape == (ids.shape[0], 12) and (a == b).all()


def test_steps_equal_a_full_forward(tiny_lm_onnx):
    # The KV cache carried between steps gives what one pass over the whole sequence gives.
    from compress.formats import causal, causal_onnx

    cand = causal_onnx.load(tiny_lm_onnx, "cpu", 1, {})
    seq = _prompts(cand.tokenizer, 1)[0]
    ids, mask = causal.right_pad([seq], 3)
    full = cand.logprobs(ids, mask)[0]  # [T-1]
    logits, state = cand.start(ids[:, :2], mask[:, :2])
    got = []
    for t in range(2, len(seq)):
        lp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        got.append(lp[0, seq[t]])
        logits, state = cand.step(np.array([seq[t]]), state)
    assert np.allclose(got, full[1:], atol=1e-4)


def test_size_params_and_notes(tiny_lm, tiny_lm_onnx):
    ref, cand = _pair(tiny_lm, tiny_lm_onnx)
    assert cand.num_params() == ref.num_params()
    assert 0.9 < cand.memory_bytes() / (4 * cand.num_params()) < 1.1  # fp32 initializers (a few weights are Constant nodes)
    assert 0 < cand.size_bytes() and cand.notes == []
    from compress.formats import causal_onnx

    assert causal_onnx.load(tiny_lm_onnx, "cuda", 1, {}).notes  # says it ran on the CPU
