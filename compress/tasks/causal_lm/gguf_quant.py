"""GGUF variants made by llama.cpp's own quantizer (llama_model_quantize), and what compress adds
to it: an importance matrix measured on calibration text, and a per-tensor type mix chosen by
measured sensitivity to a size budget.

- Stock types (`Q4_K_M`, `Q8_0`, ...) are llama.cpp's mixes, exactly as `llama-quantize` makes
  them; from a GGUF that is already quantized, as `llama-quantize --allow-requantize` does (each
  tensor dequantized, then quantized again; a tensor already of its target type is copied).
- The importance matrix is llama-imatrix's statistic: per input column of every matrix, the mean
  square of the activations it multiplies, over calibration tokens. llama-cpp-python's wheel
  ships no llama-imatrix, so it is measured here with the torch model's forward hooks (the same
  numbers up to the runtime's rounding), and handed to llama.cpp through the C API.
- The mix: every quantizable tensor is written at each candidate type (llama.cpp, importance
  matrix on), its error against the source weights is measured as the importance-weighted
  squared error sum_j imp[j] * sum_i (W_q - W)[i, j]^2 (the expected squared error of the
  tensor's output, the quantity GPTQ and llama.cpp's imatrix quantizers minimise), and types are
  raised greedily by error removed per byte until the budget is spent. A tensor already stored
  on a candidate's grid costs nothing at that type (the quantizer copies it), which llama.cpp's
  own mixes, made for float sources, cannot see.
"""

from __future__ import annotations

import ctypes
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compress.formats.llamacpp import library
from compress.tasks.causal_lm.gguf import read_header

# llama.cpp's file types (llama_ftype) a stage may ask for: the ones users pick.
FTYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0", "IQ4_NL", "IQ4_XS")
# Tensor types a mix may choose among (ggml_type names).
TENSOR_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
# Pure files written for the mix's candidates: the llama_ftype whose default tensor type it is.
_PURE_FTYPE = {"Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0", "Q4_K": "Q4_K_M",
               "Q5_K": "Q5_K_M", "Q6_K": "Q6_K", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS"}

# transformers module name (Llama, Mistral, Qwen2, Gemma shapes) -> GGUF tensor name.
_HF_TO_GGUF = [
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.q_proj$"), "blk.{}.attn_q.weight"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.k_proj$"), "blk.{}.attn_k.weight"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.v_proj$"), "blk.{}.attn_v.weight"),
    (re.compile(r"^model\.layers\.(\d+)\.self_attn\.o_proj$"), "blk.{}.attn_output.weight"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.gate_proj$"), "blk.{}.ffn_gate.weight"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.up_proj$"), "blk.{}.ffn_up.weight"),
    (re.compile(r"^model\.layers\.(\d+)\.mlp\.down_proj$"), "blk.{}.ffn_down.weight"),
]


def gguf_name(module: str, tied: bool) -> str | None:
    """The GGUF tensor a transformers Linear's weight becomes, or None (not mapped)."""
    if module == "lm_head":
        return "token_embd.weight" if tied else "output.weight"  # a tied head multiplies by the token table
    for pattern, name in _HF_TO_GGUF:
        m = pattern.match(module)
        if m:
            return name.format(m.group(1))
    return None


def importance(model_folder: Path, chunks: list[list[int]], threads: int, log=lambda m: None) -> dict[str, np.ndarray]:
    """GGUF tensor name -> mean x^2 per input column [in_features] float32, over every token of
    `chunks` (token id lists, each run alone, no padding), from the fp32 transformers model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32, trust_remote_code=False,
                                                 use_safetensors=True).eval()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    hooks = []

    def hook(name: str):
        def f(_mod, args, _out):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()  # [tokens, in]
            sums[name] = sums.get(name, 0) + (x * x).sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return f

    head = model.get_output_embeddings()
    for mod_name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and mod is not head:
            name = gguf_name(mod_name, tied)
            if name is not None:
                hooks.append(mod.register_forward_hook(hook(name)))
    # The output projection's input is the decoder's last hidden state [1, T, hidden]: read it
    # there, never computing the [T, vocab] logits (Gemma-3: 262,144 columns, most of the time).
    head_name = gguf_name("lm_head", tied)
    record_head = hook(head_name) if head is not None and head_name is not None else None
    try:
        with torch.inference_mode():
            for ids in chunks:
                hidden = model.get_decoder()(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state
                if record_head is not None:
                    record_head(head, (hidden,), None)
    finally:
        for h in hooks:
            h.remove()
    log(f"  importance matrix: {len(sums)} tensors, {sum(len(c) for c in chunks)} calibration tokens")
    return {name: (s / counts[name]).numpy().astype(np.float32) for name, s in sums.items()}


def _ggml_type(L, name: str) -> int:
    value = getattr(L, f"GGML_TYPE_{name}", None)
    if value is None:
        raise ValueError(f"llama.cpp has no tensor type {name}")
    return int(value)


def quantize(src: Path, out: Path, ftype: str, threads: int, imatrix: dict[str, np.ndarray] | None = None,
             types: dict[str, str] | None = None) -> Path:
    """llama.cpp's quantizer from `src` to `out` at file type `ftype`, requantizing a quantized
    source; `imatrix` (see importance) and per-tensor `types` (GGUF name -> ggml type name;
    the token table through llama.cpp's own token_embedding_type) where given."""
    L = library()
    code = getattr(L, f"LLAMA_FTYPE_MOSTLY_{ftype}", None)
    if code is None:
        raise ValueError(f"llama.cpp has no file type {ftype}")
    p = L.llama_model_quantize_default_params()
    p.ftype, p.nthread, p.allow_requantize = int(code), int(threads), True
    keep = []  # every buffer the C call reads stays alive until it returns
    if imatrix:
        entries = (L.llama_model_imatrix_data * (len(imatrix) + 1))()  # NULL-name terminated
        for i, (name, values) in enumerate(imatrix.items()):
            arr = np.ascontiguousarray(values, dtype=np.float32)
            keep.append(arr)
            entries[i].name = name.encode()
            entries[i].data = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = arr.size
        keep.append(entries)
        p.imatrix = ctypes.cast(entries, type(p.imatrix))
    if types:
        rest = {n: t for n, t in types.items() if n != "token_embd.weight"}
        if "token_embd.weight" in types:
            p.token_embedding_type = _ggml_type(L, types["token_embd.weight"])
        overrides = (L.llama_model_tensor_override * (len(rest) + 1))()
        for i, (name, t) in enumerate(rest.items()):
            pattern = f"^{re.escape(name)}$".encode()
            keep.append(pattern)
            overrides[i].pattern = pattern
            overrides[i].type = _ggml_type(L, t)
        keep.append(overrides)
        p.tt_overrides = ctypes.cast(overrides, type(p.tt_overrides))
    rc = L.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(p))
    if rc != 0 or not out.is_file():
        raise RuntimeError(f"llama.cpp could not quantize {src.name} to {ftype} (code {rc})")
    return out


@dataclass(frozen=True)
class Tensor:
    type: str
    bytes: int


def tensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of a GGUF file: its type and bytes."""
    return {t.name: Tensor(t.type, t.n_bytes) for t in read_header(path).tensors.values()}


def _weights(path: Path, names: set[str]) -> dict[str, np.ndarray]:
    """The named tensors of a GGUF file dequantized: [rows, cols] float32 (cols = the input dim)."""
    header = read_header(path)
    return {n: header.weights(n) for n in names if n in header.tensors}


@dataclass
class Mix:
    """The types chosen per tensor and what they cost."""

    types: dict[str, str]  # GGUF tensor name -> ggml type
    tensor_bytes: int  # of every tensor of the file, mixed or not
    budget_bytes: int
    error: float  # importance-weighted squared error summed over the mixed tensors
    counts: dict[str, int] = field(default_factory=dict)  # type -> tensors


def choose(src: Path, candidates: list[str], budget_bytes: int, imatrix: dict[str, np.ndarray], threads: int,
           log=lambda m: None) -> Mix:
    """The per-tensor types of least importance-weighted error whose file's tensors fit
    `budget_bytes` (greedy on error removed per byte; see the module docstring)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    src_tensors = tensors(src)
    names = sorted(n for n in imatrix if n in src_tensors)
    cols = {n: int(imatrix[n].size) for n in names}
    ref = _weights(src, set(names))
    options: dict[str, dict[str, tuple[int, float]]] = {n: {} for n in names}  # name -> type -> (bytes, error)
    with tempfile.TemporaryDirectory(prefix="compress-gguf-mix-") as tmp:
        for cand in candidates:
            # A type only takes rows that are whole blocks (K types: 256 values): other tensors
            # are not offered it (llama.cpp would fall back, but not for the token table).
            block = GGML_QUANT_SIZES[GGMLQuantizationType[cand]][0]
            fit = [n for n in names if cols[n] % block == 0]
            if not fit:
                continue
            path = quantize(src, Path(tmp) / f"{cand}.gguf", _PURE_FTYPE[cand], threads, imatrix,
                            types={n: cand for n in fit})
            got = tensors(path)
            deq = _weights(path, set(fit))
            for n in fit:
                t = got[n]  # llama.cpp falls back to another type where a row length does not fit the blocks
                err = float(((deq[n] - ref[n]) ** 2).sum(0) @ imatrix[n]) if t.type != src_tensors[n].type else 0.0
                options[n][t.type] = (t.bytes, err)
            path.unlink()
            log(f"  mix candidate {cand}: {sum(got[n].bytes for n in fit) / 1e6:.1f} MB over {len(fit)} tensors")
    fixed = sum(t.bytes for n, t in src_tensors.items() if n not in options)  # norms, ... as the source has them
    return pick(options, fixed, budget_bytes)


def pick(options: dict[str, dict[str, tuple[int, float]]], fixed: int, budget_bytes: int) -> Mix:
    """Per tensor, one of its options {type: (bytes, error)}: least summed error with `fixed` +
    the chosen bytes <= `budget_bytes`. Each tensor's options are cut to their lower convex hull
    of (bytes, error); from the smallest of every tensor, the step of most error removed per
    byte that still fits is taken, until none is left (the greedy of the knapsack relaxation:
    optimal up to the last step that did not fit)."""
    hull: dict[str, list[tuple[int, float, str]]] = {}
    for n, opts in options.items():
        keep: list[tuple[int, float, str]] = []
        for p in sorted((b, e, t) for t, (b, e) in opts.items()):
            if keep and p[1] >= keep[-1][1]:
                continue  # bigger and no better
            while len(keep) >= 2 and (keep[-1][1] - p[1]) * (keep[-1][0] - keep[-2][0]) >= \
                    (keep[-2][1] - keep[-1][1]) * (p[0] - keep[-1][0]):
                keep.pop()  # the middle point lies on or above the line between its neighbours
            keep.append(p)
        hull[n] = keep
    at = {n: 0 for n in hull}
    total = fixed + sum(h[0][0] for h in hull.values())
    if total > budget_bytes:
        raise ValueError(f"even the smallest candidate types take {total / 1e6:.1f} MB, over the budget "
                         f"{budget_bytes / 1e6:.1f} MB; add a smaller type to candidates")
    while True:
        best, gain = None, 0.0
        for n, h in hull.items():
            i = at[n]
            if i + 1 < len(h):
                db, de = h[i + 1][0] - h[i][0], h[i][1] - h[i + 1][1]
                if total + db <= budget_bytes and de / max(db, 1) > gain:
                    best, gain = n, de / max(db, 1)
        if best is None:
            break
        i = at[best]
        total += hull[best][i + 1][0] - hull[best][i][0]
        at[best] = i + 1
    types = {n: hull[n][at[n]][2] for n in hull}
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    return Mix(types=types, tensor_bytes=int(total), budget_bytes=int(budget_bytes),
               error=float(sum(hull[n][at[n]][1] for n in hull)), counts=counts)
