"""torch dynamic INT8 models, stored without pickle.

torch can only serialise a quantized model's packed weights through pickle
(`torch.save`), and loading a pickle can execute code. So this format is written by
hand: the INT8 weights, their scales and zero points go to `quantized.safetensors`, every
other tensor to `model.safetensors`, and `quantization.json` says which Linear layers are
INT8 and how. Loading rebuilds the architecture from config.json, quantizes the same
layers, and puts the stored INT8 weights back: nothing is unpickled.

Folder layout:
    config.json, tokenizer files
    model.safetensors        fp32 tensors (embeddings, norms, layers kept in fp32)
    quantized.safetensors    per INT8 layer NAME: NAME.int8 [out, in] int8, NAME.scale,
                             NAME.zero_point ([] per tensor or [out] per channel), NAME.bias
    quantization.json        {"layers": {NAME: "per_tensor" | "per_channel"}, "fp32_layers": [...]}
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from compress.core.files import write_file

QUANT_FILE = "quantized.safetensors"
FP32_FILE = "model.safetensors"
SPEC_FILE = "quantization.json"


def _torch_ao():
    # torch.ao's eager dynamic quantization is deprecated in favour of torchao, but it
    # is the one path with fast fbgemm/onednn INT8 kernels in eager mode on x86 CPUs.
    warnings.filterwarnings("ignore", message=".*torch.ao.quantization is deprecated.*")
    warnings.filterwarnings("ignore", message=".*quantized tensor creation.*deprecated.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.ao")
    import torch.ao.quantization as tq

    return tq


def quantize(model, layers: dict[str, str]):
    """Dynamic INT8 of the named Linear layers, in place. layers: name -> scheme."""
    tq = _torch_ao()
    qconfigs = {"per_tensor": tq.default_dynamic_qconfig, "per_channel": tq.per_channel_dynamic_qconfig}
    spec = {name: qconfigs[scheme] for name, scheme in layers.items()}
    return tq.quantize_dynamic(model, qconfig_spec=spec, inplace=True)


def linear_layers(model) -> list[str]:
    import torch

    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def save(model, layers: dict[str, str], fp32_layers: list[str], folder: Path) -> None:
    """Writes a model quantized by `quantize` (config and tokenizer are saved by the caller)."""
    import torch
    from safetensors.torch import save_file

    quantized, seen = {}, set()
    modules = dict(model.named_modules())
    for name in layers:
        w = modules[name].weight()  # quantized tensor [out, in]
        b = modules[name].bias()
        quantized[f"{name}.int8"] = w.int_repr().contiguous()
        if w.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            quantized[f"{name}.scale"] = w.q_per_channel_scales().contiguous()
            quantized[f"{name}.zero_point"] = w.q_per_channel_zero_points().contiguous()
        else:
            quantized[f"{name}.scale"] = torch.tensor(w.q_scale(), dtype=torch.float64)
            quantized[f"{name}.zero_point"] = torch.tensor(w.q_zero_point(), dtype=torch.int64)
        if b is not None:
            quantized[f"{name}.bias"] = b.detach().contiguous()

    fp32 = {}
    for key, t in model.state_dict().items():
        if not isinstance(t, torch.Tensor) or "_packed_params" in key or t.is_quantized:
            continue
        if any(key.startswith(name + ".") for name in layers):
            continue
        if t.data_ptr() in seen:  # tied weights are stored once; from_config re-ties them
            continue
        seen.add(t.data_ptr())
        fp32[key] = t.detach().contiguous()
    save_file(quantized, str(folder / QUANT_FILE))
    save_file(fp32, str(folder / FP32_FILE))
    write_file(folder / SPEC_FILE, json.dumps({"layers": layers, "fp32_layers": fp32_layers}, indent=1))


def load_model(folder: Path, trust_remote_code: bool = False, causal: bool = False):
    """The model of a torch_int8 folder (a sequence classifier, or a causal LM when
    `causal`), and its quantization.json."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    spec = json.loads((folder / SPEC_FILE).read_text())
    layers: dict[str, str] = spec["layers"]
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    model = auto.from_config(AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code))
    missing, unexpected = model.load_state_dict(load_file(str(folder / FP32_FILE)), strict=False)
    expected_missing = {k for k in model.state_dict() if any(k.startswith(n + ".") for n in layers)}
    # Tied weights (a causal LM's lm_head and its embedding) are stored once (see save):
    # a key is there when any key sharing its storage in the rebuilt model was loaded.
    state = model.state_dict()
    loaded = {state[k].data_ptr() for k in state if k not in missing}
    expected_missing |= {k for k in missing if state[k].data_ptr() in loaded}
    if unexpected or set(missing) - expected_missing:
        raise ValueError(f"{folder}: weights do not match the config (missing {sorted(set(missing) - expected_missing)[:3]}, unexpected {unexpected[:3]})")
    model.eval()
    quantize(model, layers)

    q = load_file(str(folder / QUANT_FILE))
    modules = dict(model.named_modules())
    for name, scheme in layers.items():
        int8, scale, zp = q[f"{name}.int8"], q[f"{name}.scale"], q[f"{name}.zero_point"]
        if scheme == "per_channel":
            w = torch._make_per_channel_quantized_tensor(int8, scale.double(), zp.long(), 0)
        else:
            w = torch._make_per_tensor_quantized_tensor(int8, float(scale), int(zp))
        modules[name].set_weight_bias(w, q.get(f"{name}.bias"))
    return model, spec


def _int8_numel(model, layers) -> int:
    """Weights and biases held by the dynamic INT8 layers (they are not nn.Parameters)."""
    modules = dict(model.named_modules())
    return sum(modules[n].weight().numel() + (modules[n].bias().numel() if modules[n].bias() is not None else 0)
               for n in layers)


def load(path: Path, device: str, threads: int, options: dict):
    from transformers import AutoTokenizer

    from compress.formats.hf import TorchPredictor

    if device != "cpu":
        raise RuntimeError("torch dynamic INT8 runs on the CPU only (no CUDA kernels)")
    trust = bool(options.get("trust_remote_code", False))
    model, spec = load_model(path, trust)
    pred = TorchPredictor(path, model, AutoTokenizer.from_pretrained(path, trust_remote_code=trust), "cpu")
    n_fp32 = sum(p.numel() for p in model.parameters())
    n_int8 = _int8_numel(model, spec["layers"])
    pred.num_params = lambda: n_fp32 + n_int8  # type: ignore[method-assign]
    pred.memory_bytes = lambda: sum(p.numel() * p.element_size() for p in model.parameters()) + n_int8  # type: ignore[method-assign]
    if spec.get("fp32_layers"):
        pred.notes.append(f"{len(spec['fp32_layers'])} Linear layers kept in fp32")
    return pred


def load_causal(path: Path, device: str, threads: int, options: dict):
    """A torch_int8 folder holding a causal LM -> compress.formats.causal.TorchCausal."""
    from transformers import AutoTokenizer

    from compress.formats.causal import TorchCausal

    if device != "cpu":
        raise RuntimeError("torch dynamic INT8 runs on the CPU only (no CUDA kernels)")
    trust = bool(options.get("trust_remote_code", False))
    model, spec = load_model(path, trust, causal=True)
    pred = TorchCausal(path, model, AutoTokenizer.from_pretrained(path, trust_remote_code=trust), "cpu")
    n_fp32 = sum(p.numel() for p in model.parameters())
    n_int8 = _int8_numel(model, spec["layers"])
    pred.num_params = lambda: n_fp32 + n_int8  # type: ignore[method-assign]
    # INT8 weights take a byte each; parameters() holds only what stayed in fp32.
    pred.memory_bytes = lambda: sum(p.numel() * p.element_size() for p in model.parameters()) + n_int8  # type: ignore[method-assign]
    if spec.get("fp32_layers"):
        pred.notes.append(f"{len(spec['fp32_layers'])} Linear layers kept in fp32 ({', '.join(spec['fp32_layers'][:3])})")
    return pred
