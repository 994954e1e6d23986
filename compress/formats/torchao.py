"""torchao weight-only quantized causal LMs (INT8 or INT4 weights, fp32 activations).

Folder layout:
    config.json, generation_config.json, tokenizer files
    quantized.pt         the quantized model's state dict (torch.save): torchao tensor
                         subclasses holding the packed integer weights and their scales
    quantization.json    {"scheme": "int8" | "int4", "group_size": 32 | 64 | 128 | null,
                          "embedding": bool, "layers": [...], "fp32_layers": [...]}

Why torch.save: torchao's weights are tensor subclasses (INT4 packed for the CPU kernel)
that safetensors cannot hold (torchao's own safetensors bridge knows neither the CPU INT4
tensor nor the embedding's). The file is read back with `torch.load(weights_only=True)`,
torch's restricted unpickler, which rebuilds tensors and the classes torchao registers as
safe, and runs no other code. The file holds the real packed weights, so its size is the
quantized size. Loading rebuilds the architecture from config.json, quantizes it the same
way (so that every module expects the same subclass), then assigns the stored tensors.

Which torchao configs (0.18) and why:
- INT8: `Int8WeightOnlyConfig` (per output channel), the weight-only INT8 of torchao.
- INT4: `PrototypeInt4WeightOnlyConfig` (torchao.prototype.quantization.int4): asymmetric
  groups of `group_size`, packed for torch's CPU int4 kernel
  (aten._weight_int4pack_mm_for_cpu). torchao's stable `Int4WeightOnlyConfig` has no CPU
  packing in 0.18 (its formats need CUDA, XPU or NPU kernels); `IntxWeightOnlyConfig` with
  torch.int4 stores one int8 per weight (no smaller than INT8) and dequantizes the whole
  matrix at every call; `Int8DynamicActivationInt4WeightConfig` needs torchao's da8w4 CPU
  kernel, which the PyPI wheel does not build.
- The token embedding table (a lookup, not a Linear) is optionally stored INT8 per row with
  `IntxWeightOnlyConfig(torch.int8, PerAxis(0))`: in a 135M-parameter model it is a fifth
  of the weights, and left in fp32 it would be most of an INT4 file.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from compress.core.files import write_file

WEIGHTS_FILE = "quantized.pt"
SPEC_FILE = "quantization.json"
GROUP_SIZES = (32, 64, 128)
# Loggers torchao makes noisy on import: "torchao" logs a warning per CUDA-only extension it
# cannot load on a CPU machine ("Failed to load ..._C_mxfp8...so"), and torch's pytree
# logger warns that torchao registers its Enum settings the deprecated way.
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


@contextmanager
def quiet_import():
    """Raises torchao's import-time loggers to ERROR while its modules are imported."""
    import logging

    loggers = [logging.getLogger(n) for n in NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def ao_configs(scheme: str, group_size: int | None):
    """(torchao config for the Linear layers, for the embedding) of a scheme."""
    try:
        with quiet_import():
            import torch
            from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
            from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
            from torchao.quantization.granularity import PerAxis
    except ImportError as exc:
        raise RuntimeError(f"torchao quantization needs the torchao package (pip install torchao): {exc}") from exc
    if scheme == "int4":
        linear = PrototypeInt4WeightOnlyConfig(group_size=group_size or 32, set_inductor_config=False)
    else:
        linear = Int8WeightOnlyConfig(set_inductor_config=False)
    return linear, IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))


def quantize(model, scheme: str, group_size: int | None, embedding: bool, keep_fp32: list[str] = ()) -> dict:
    """Quantizes `model` in place; returns the spec quantization.json records. INT4: Linear
    layers whose input width is not a multiple of the group size, or whose output width is
    not a multiple of 16, stay fp32 (listed in `fp32_layers`)."""
    from fnmatch import fnmatch

    import torch

    with quiet_import():
        from torchao.quantization import quantize_
    linear_cfg, embed_cfg = ao_configs(scheme, group_size)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    kept = [n for n in names if any(fnmatch(n, p) for p in keep_fp32)]
    if embedding:
        # Before the Linear layers: with tied weights the lm_head shares the embedding's
        # Parameter, and quantizing one must not change what the other sees. The embedding
        # gets its own INT8 tensor; the lm_head is quantized from the fp32 matrix below.
        head = model.get_output_embeddings()
        if head is not None and head.weight is model.get_input_embeddings().weight:
            head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
        quantize_(model, embed_cfg, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Embedding))
    # torch's CPU int4 packing takes matrices with a multiple of 16 rows (out features);
    # others (a vocabulary of odd size) stay fp32, as do inputs not a multiple of the group.
    fits = (lambda m: m.out_features % 16 == 0) if scheme == "int4" else (lambda m: True)
    quantize_(model, linear_cfg,
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn not in kept and fits(m))
    modules = dict(model.named_modules())
    plain = [n for n in names if n not in kept and type(modules[n].weight) is torch.nn.Parameter]
    layers = [n for n in names if n not in kept and n not in plain]
    return {"scheme": scheme, "group_size": group_size if scheme == "int4" else None, "embedding": embedding,
            "keep_fp32": list(keep_fp32), "layers": layers, "fp32_layers": kept + plain}


def save(model, spec: dict, folder: Path) -> None:
    """Writes the quantized weights and the spec (config and tokenizer: the caller)."""
    import torch

    torch.save(model.state_dict(), folder / WEIGHTS_FILE)
    write_file(folder / SPEC_FILE, json.dumps(spec, indent=1) + "\n")


def load_model(folder: Path, trust_remote_code: bool = False):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = json.loads((folder / SPEC_FILE).read_text())
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    with torch.device("meta"):  # no fp32 copy in memory: every tensor comes from the file
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    model.to_empty(device="cpu")
    with torch.no_grad():  # defined values to quantize (overwritten by the file's below)
        for t in model.parameters():
            t.zero_()
    quantize(model, spec["scheme"], spec["group_size"], spec["embedding"], spec.get("keep_fp32", []))
    with quiet_import():
        state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    # Buffers that are not saved (rotary inv_freq) are recomputed from the config.
    missing = [k for k in missing if k in dict(model.named_parameters())]
    if missing or unexpected:
        raise ValueError(f"{folder / WEIGHTS_FILE}: weights do not match config.json (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}); rebuild the artifact")
    _reset_rotary(model)
    return model.eval(), spec


def _reset_rotary(model) -> None:
    """Rotary embeddings keep inv_freq as a non-persistent buffer, computed at construction:
    built on the meta device it holds nothing, so it is computed again here."""
    for m in model.modules():
        if hasattr(m, "rope_init_fn") and hasattr(m, "inv_freq"):
            inv_freq, scaling = m.rope_init_fn(m.config, "cpu")
            m.register_buffer("inv_freq", inv_freq, persistent=False)
            m.original_inv_freq = inv_freq
            m.attention_scaling = scaling


def packed_bytes(model) -> int:
    """Bytes the loaded weights take, counting the tensors inside torchao's subclasses
    (packed integers, scales, zero points) rather than the logical fp32 shape."""
    import torch

    def size(t) -> int:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            return sum(size(getattr(t, n)) for n in names)
        return t.numel() * t.element_size()

    return sum(size(t) for t in list(model.parameters()) + list(model.buffers()))


def load_causal(path: Path, device: str, threads: int, options: dict):
    """A `torchao` folder -> compress.formats.causal.TorchCausal (INT4: CPU only)."""
    from transformers import AutoTokenizer

    from compress.formats.causal import TorchCausal

    trust = bool(options.get("trust_remote_code", False))
    spec = json.loads((path / SPEC_FILE).read_text())
    if device != "cpu" and spec.get("scheme") == "int4":
        raise RuntimeError("torchao INT4 here is packed for torch's CPU kernel; benchmark it on the CPU")
    model, spec = load_model(path, trust)
    pred = TorchCausal(path, model, AutoTokenizer.from_pretrained(path, trust_remote_code=trust), device)
    n = sum(p.numel() for p in model.parameters())  # logical sizes: a packed INT4 [N, K] counts N*K
    pred.num_params = lambda: n  # type: ignore[method-assign]
    pred.memory_bytes = lambda: packed_bytes(model)  # type: ignore[method-assign]
    what = f"torchao {spec['scheme'].upper()} weights" + (f", groups of {spec['group_size']}" if spec.get("group_size") else "")
    pred.notes.append(what + (", INT8 embedding" if spec.get("embedding") else ""))
    if spec.get("fp32_layers"):
        pred.notes.append(f"{len(spec['fp32_layers'])} Linear layers kept in fp32")
    return pred
