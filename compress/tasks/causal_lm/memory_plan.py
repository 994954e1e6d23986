"""What a causal LM needs in memory besides its weights: the KV cache, which grows with every
token of every sequence held, and what that leaves room for on a device of a given size.

Arithmetic only, from the model's config: no library computes this from a config without
building the model on a device. Activations and the runtime's own workspace are left out
(a few MB for a small model at batch 1), so a tier that fits "just" may not in practice.
"""

from __future__ import annotations

from typing import Any

from compress.tasks.causal_lm.records import MemoryPlan, MemoryTier, MemoryTierSpec

KV_DTYPES = {1: "int8", 34 / 32: "q8_0", 2: "float16", 4: "float32"}  # q8_0: 32 int8 values + an fp16 scale


def _get(config: Any, *names: str) -> Any:
    """The first of `names` the config sets (a transformers config object or its dict)."""
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a decoder config: Llama, Mistral, Qwen2 (num_key_value_heads,
    head_dim) or GPT-2 (n_layer, n_head, n_embd; every head keeps its own K and V)."""
    layers = _get(config, "num_hidden_layers", "n_layer")
    heads = _get(config, "num_attention_heads", "n_head")
    hidden = _get(config, "hidden_size", "n_embd")
    if layers is None or heads is None:
        raise ValueError("the model config names no layer or head count (num_hidden_layers / n_layer, "
                         "num_attention_heads / n_head); a memory plan needs them")
    kv_heads = _get(config, "num_key_value_heads") or heads  # grouped-query attention shares K/V heads
    head_dim = _get(config, "head_dim") or int(hidden) // int(heads)
    return int(layers), int(kv_heads), int(head_dim)


def kv_bytes_per_token(config: Any, dtype_bytes: float = 2) -> int:
    """One token of one sequence: K and V, every layer, every KV head."""
    layers, kv_heads, head_dim = kv_shape(config)
    return int(round(2 * layers * kv_heads * head_dim * dtype_bytes))


def max_context(config: Any) -> int:
    return int(_get(config, "max_position_embeddings", "n_positions", "n_ctx") or 2048)


def tier(name: str, size: int, weights_bytes: int, per_token: int, context: int) -> MemoryTier:
    """What fits a device of `size` bytes: the weights, then the KV cache in what is left."""
    free = size - weights_bytes
    fits = free > 0
    tokens = max(free, 0) // per_token
    return MemoryTier(name=name, bytes=int(size), fits_weights=fits,
                      max_context_batch1=int(min(tokens, context)),  # a row never holds more than the model's context
                      max_batch_at_context=int(tokens // context),
                      spills=weights_bytes + per_token * context > size)


def memory_plan(config: Any, weights_bytes: int, tiers: list[MemoryTierSpec], host_bytes: int | None = None,
                kv_dtype_bytes: float = 2) -> MemoryPlan:
    """The plan for this machine's memory (`host_bytes`, tier "host"; None: read with psutil)
    and the recipe's tiers (GB = 1e9 bytes). `kv_dtype_bytes`: 2 for a float16 cache as GPU
    runtimes keep it, 4 for the float32 cache a CPU fp32 model keeps."""
    if kv_dtype_bytes not in KV_DTYPES:
        raise ValueError(f"kv_dtype_bytes must be one of {sorted(KV_DTYPES)}, not {kv_dtype_bytes}")
    if host_bytes is None:
        import psutil

        host_bytes = int(psutil.virtual_memory().total)
    per_token = kv_bytes_per_token(config, kv_dtype_bytes)
    context = max_context(config)
    rows = [tier("host", host_bytes, weights_bytes, per_token, context)]
    rows += [tier(t.name, int(t.gb * 1e9), weights_bytes, per_token, context) for t in tiers]
    return MemoryPlan(weights_bytes=int(weights_bytes), kv_bytes_per_token=per_token,
                      kv_dtype=KV_DTYPES[kv_dtype_bytes], context=context, tiers=rows)
