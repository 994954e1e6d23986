"""The memory plan's arithmetic, from Llama, GPT-2 and Qwen2 configs."""

from __future__ import annotations

import pytest

from compress.tasks.causal_lm.records import MemoryTierSpec
from compress.tasks.causal_lm.memory_plan import kv_bytes_per_token, kv_shape, memory_plan


def test_llama_grouped_query_kv_bytes():
    from transformers import LlamaConfig

    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims.
    cfg = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, max_position_embeddings=8192)
    assert kv_shape(cfg) == (30, 3, 64)
    assert kv_bytes_per_token(cfg, 2) == 2 * 30 * 3 * 64 * 2 == 23040
    assert kv_bytes_per_token(cfg, 4) == 46080


def test_gpt2_and_qwen2_head_dim_from_hidden():
    from transformers import GPT2Config, Qwen2Config

    assert kv_shape(GPT2Config(n_embd=768, n_layer=12, n_head=12)) == (12, 12, 64)
    assert kv_bytes_per_token(GPT2Config(n_embd=768, n_layer=12, n_head=12)) == 36864
    q = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
    assert kv_shape(q) == (24, 2, 64)
    assert kv_shape({"n_layer": 2, "n_head": 4, "n_embd": 64}) == (2, 4, 16)  # a config.json as a dict


def test_tiers():
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                      head_dim=64, max_position_embeddings=8192)
    plan = memory_plan(cfg, 500_000_000, [MemoryTierSpec(name="big", gb=1.0), MemoryTierSpec(name="small", gb=0.4)],
                       host_bytes=700_000_000)
    assert plan.kv_bytes_per_token == 23040 and plan.kv_dtype == "float16" and plan.context == 8192
    host, big, small = plan.tiers
    assert host.name == "host" and host.bytes == 700_000_000
    # 200 MB free: 8680 tokens, capped at the model's 8192 positions; one full row fits.
    assert (host.max_context_batch1, host.max_batch_at_context, host.spills) == (8192, 1, False)
    assert big.max_batch_at_context == 500_000_000 // 23040 // 8192 == 2
    assert (small.fits_weights, small.max_context_batch1, small.max_batch_at_context, small.spills) == (False, 0, 0, True)
    # Room for the weights but not a full-context row: it fits, and would spill at 8192 tokens.
    tight = memory_plan(cfg, 500_000_000, [], host_bytes=600_000_000).tiers[0]
    assert tight.fits_weights and tight.max_context_batch1 == 100_000_000 // 23040 and tight.spills
    assert tight.max_batch_at_context == 0


def test_bad_config_and_dtype():
    with pytest.raises(ValueError, match="layer or head count"):
        kv_shape({"hidden_size": 8})
    with pytest.raises(ValueError, match="kv_dtype_bytes"):
        memory_plan({"n_layer": 1, "n_head": 1, "n_embd": 4}, 1, [], host_bytes=10, kv_dtype_bytes=3)
