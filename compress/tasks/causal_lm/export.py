"""ONNX techniques for causal LMs: export with a KV cache (Optimum), the greedy parity check
against the torch source, and onnxruntime's weight quantizers (INT4 MatMulNBits with the
embedding and lm_head included, INT8 dynamic).

Layer 3 (a technique): the stages export_onnx_lm and quantize_onnx_lm call it; the ORT
predictor it checks against is compress.formats.causal_onnx.

Graph layout of an export (Optimum, task `text-generation-with-past`), one file model.onnx:
    inputs   input_ids [B, T], attention_mask [B, P+T], position_ids [B, T] (most families),
             past_key_values.{i}.key / .value [B, kv_heads, P, head_dim] float32
    outputs  logits [B, T, V], present.{i}.key / .value [B, kv_heads, P+T, head_dim]
P = 0 (empty past) runs the prefill; the same graph runs every decode step.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Literal

import numpy as np

MODEL_FILE = "model.onnx"

# Sentence starts for the parity check when the stage is given no prompts: plain English
# of several registers, so that greedy continuations are not all the same near-tie.
BUILTIN_PROMPTS = [
    "The history of the Roman Empire", "Photosynthesis is the process by which", "My favourite recipe for bread",
    "The best way to learn a new language is", "In 1969, the first humans", "A good night's sleep helps",
    "Write a short poem about the sea.", "What is the capital of France?", "Explain how a bicycle works.",
    "The stock market fell sharply today after", "Once upon a time, in a small village,", "The theory of relativity states",
    "To install the package, run", "def fibonacci(n):", "Dear customer, thank you for", "The main causes of climate change are",
    "She opened the door and saw", "Three tips for staying healthy:", "The recipe calls for two cups of",
    "Machine learning models are trained by", "The football match ended in", "Translate to French: good morning",
    "Summarize the plot of Hamlet.", "Water boils at", "The meeting is scheduled for", "How do vaccines work?",
    "The old lighthouse keeper", "List the planets of the solar system.", "A triangle has three", "Coffee or tea?",
    "The museum's new exhibition", "Why is the sky blue?", "In the year 2050, cities will", "The chef tasted the soup and",
    "Give me a reason to read more books.", "The train to London departs", "Electric cars are becoming popular because",
    "The mountain trail was steep and", "Describe your ideal weekend.", "The first step in solving an equation is",
    "He played the violin every evening", "The internet changed the way people", "What makes a good teacher?",
    "The river flooded the town after", "My grandmother always said", "The rules of chess are simple:",
    "A healthy breakfast includes", "The scientist looked at the results and", "How many legs does a spider have?",
    "The library closes at",
]


def export(src: Path, out: Path, opset: int | None = None) -> dict:
    """Exports the transformers causal LM in `src` to `out` with Optimum (KV-cache inputs and
    outputs, dynamic batch and lengths) and copies its tokenizer and generation config.
    Returns {"opset", "inputs", "outputs"} of the graph."""
    import onnx
    from optimum.exporters.onnx import main_export

    # Optimum's own validation runs random inputs and only logs a mismatch; the caller runs
    # `parity` on real prompts instead and fails on it.
    main_export(str(src), out, task="text-generation-with-past", opset=opset, do_validation=False, device="cpu",
                library_name="transformers")
    _copy_side_files(src, out)
    graph = onnx.load(str(out / MODEL_FILE), load_external_data=False)
    return {
        "opset": next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")),
        "inputs": [i.name for i in graph.graph.input],
        "outputs": [o.name for o in graph.graph.output],
    }


def _copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer, config, generation config and chat template beside the graph (files `dst`
    does not have yet; never weights)."""
    for f in Path(src).iterdir():
        if f.is_file() and not f.suffix in (".safetensors", ".bin", ".onnx", ".pt", ".data") \
                and f.name not in ("result.json", "_complete.json") and not (Path(dst) / f.name).exists():
            shutil.copy2(f, Path(dst) / f.name)


# ---------------------------------------------------------------------------------------
# Parity


def tokenizer_prompts(tokenizer, n: int) -> list[list[int]]:
    """`n` prompts built from BUILTIN_PROMPTS with the model's own tokenizer (its chat
    template when it has one: an instruct model is run that way), cycling if n > 50."""
    out = []
    for i in range(n):
        text = BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)]
        if i >= len(BUILTIN_PROMPTS):  # a cycled prompt differs from its first use
            text = f"{text} ({i // len(BUILTIN_PROMPTS) + 1})"
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        out.append([int(t) for t in ids] or [int(tokenizer.eos_token_id or 0)])
    return out


def parity(reference, candidate, prompts: list[list[int]], new_tokens: int, batch_size: int = 1) -> dict:
    """Greedy decoding of every prompt by both predictors (compress.formats.causal.CausalLM),
    `new_tokens` tokens each, eos ignored. Returns prompts, new_tokens, identical (prompts
    whose tokens are all equal), token_agreement (percent of positions before a row's first
    difference, over all positions), max_abs_diff (largest |logit difference| over the steps
    where both had been fed the same tokens) and first_mismatch (prompt index or None)."""
    from compress.formats.causal import greedy, left_pad, pad_id

    identical, agree, total, max_diff, first = 0, 0, 0, 0.0, None
    pid = pad_id(reference.tokenizer)
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        ids, mask = left_pad(chunk, pid)
        ref_logits, cand_logits = [], []
        a = greedy(_Recorder(reference, ref_logits), ids, mask, new_tokens, stop_at_eos=False)  # [b, n]
        b = greedy(_Recorder(candidate, cand_logits), ids, mask, new_tokens, stop_at_eos=False)
        same = a == b  # [b, n]
        # A row's steps agree up to its first differing token; logits after it were computed
        # from different inputs and are not compared.
        prefix = np.cumprod(same, axis=1).astype(bool)  # [b, n]
        for step, (la, lb) in enumerate(zip(ref_logits, cand_logits)):  # [b, V] each
            rows = prefix[:, step - 1] if step else np.ones(len(chunk), dtype=bool)
            if rows.any():
                max_diff = max(max_diff, float(np.abs(la[rows].astype(np.float64) - lb[rows]).max()))
        identical += int(same.all(axis=1).sum())
        agree += int(prefix.sum())
        total += same.size
        if first is None and not same.all():
            first = start + int(np.argmin(same.all(axis=1)))
    return {"prompts": len(prompts), "new_tokens": new_tokens, "identical": identical,
            "token_agreement": 100.0 * agree / max(total, 1), "max_abs_diff": max_diff, "first_mismatch": first}


class _Recorder:
    """A predictor seen through greedy(), keeping every logits array it returns ([B, V])."""

    def __init__(self, pred, sink: list):
        self.pred, self.sink = pred, sink

    def start(self, ids, mask):
        logits, state = self.pred.start(ids, mask)
        self.sink.append(np.array(logits, dtype=np.float32))
        return logits, state

    def step(self, tokens, state):
        logits, state = self.pred.step(tokens, state)
        self.sink.append(np.array(logits, dtype=np.float32))
        return logits, state


# ---------------------------------------------------------------------------------------
# Quantization


def untie_lm_head(model) -> list[str]:
    """A tied lm_head is exported as MatMul(hidden, Transpose(embedding table)): its weight is
    computed, not a constant, so no weight-only quantizer sees it (and it stays fp32: 28M of
    SmolLM2-135M's 135M parameters). Folds every Transpose of an initializer that feeds a
    MatMul into a constant of its own ([hidden, vocab]) in place; returns the MatMul names.
    The embedding Gather keeps the original table and is quantized on its own."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    untied = []
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in inits:
            continue
        users = consumers.get(node.output[0], [])
        if not users or any(u.op_type != "MatMul" or u.input[1] != node.output[0] for u in users):
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        table = numpy_helper.to_array(inits[node.input[0]])
        weight = np.ascontiguousarray(table.transpose(perm) if perm else table.T)
        graph.initializer.append(numpy_helper.from_array(weight, node.output[0]))
        graph.node.remove(node)
        untied += [u.name for u in users]
    return untied


def quantize_int4(src: Path, out: Path, *, algorithm: Literal["rtn", "hqq", "minmax"] = "rtn", block_size: int = 32,
                  symmetric: bool = True, accuracy_level: int | None = 4, embeddings: bool = True,
                  lm_head: bool = True, lm_head_bits: Literal[4, 8] | None = None, bits: Literal[4, 8] = 4,
                  exclude: list[str] | None = None) -> dict:
    """Weight-only quantization of the graph in folder `src` into folder `out` with
    onnxruntime's MatMulNBitsQuantizer: every constant MatMul weight -> MatMulNBits (`bits`-bit
    blocks of `block_size` along the input dimension, fp32 scales), and with `embeddings` the
    embedding Gather -> GatherBlockQuantized (4-bit: the only width the quantizer has for it).
    `lm_head` unties a tied output projection first (see untie_lm_head) so it is quantized
    too, with `lm_head_bits` (None: `bits`; 8: the logits are the most sensitive product). accuracy_level 4:
    the kernel quantizes activations to INT8 per block and runs an INT8 dot product (the fast
    CPU path); None or 0: fp32 activations. `hqq`: half-quadratic scales and float zero points
    (MatMuls; the Gather is then quantized round-to-nearest, HQQ has no Gather path). A model
    whose weights came from a GGUF Q4_1 file sits on a grid of 32-weight blocks with a float
    minimum: `minmax` (each block's min and max, float zero point, no fit) with block 32
    reproduces it exactly; rtn's integer zero point cannot (9% mean weight error on SmolLM2).
    Returns what was done."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig, HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer,
    )

    # The quantizer logs every node it visits (thousands of lines) and warns that it raises
    # the opset to 21 for the INT4 Gather (intended: GatherBlockQuantized needs it).
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    lm_head_bits = lm_head_bits or bits
    model = onnx.load(str(Path(src) / MODEL_FILE))
    untied = untie_lm_head(model) if lm_head else []
    exclude = list(exclude or [])
    heads = [n.name for n in model.graph.node if n.op_type == "MatMul" and "logits" in n.output]
    body_exclude = exclude + (heads if (not lm_head or lm_head_bits != bits) else [])

    def default(op_types, nbits):
        return DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level,
                                            op_types_to_quantize=op_types, bits=nbits)

    # (config, nodes to exclude, nodes to include) per pass
    passes = []
    if algorithm in ("hqq", "minmax"):
        passes.append((HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits, op_types_to_quantize=("MatMul",)),
                       body_exclude, None))
    else:
        passes.append((default(("MatMul",), bits), body_exclude, None))
    if lm_head and lm_head_bits != bits and heads:
        passes.append((default(("MatMul",), lm_head_bits), exclude, heads))
    if embeddings:
        passes.append((default(("Gather",), 4), exclude, None))
    for algo, skip, only in passes:
        q = MatMulNBitsQuantizer(model, block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level,
                                 nodes_to_exclude=skip, nodes_to_include=only, algo_config=algo)
        if algorithm == "minmax" and isinstance(algo, HQQWeightOnlyQuantConfig):
            q.node_quantizer = _minmax_quantizer(algo)
        q.process()
        model = q.model.model
    offsets = _fold_float_zero_points(model) if algorithm == "minmax" else 0
    if accuracy_level is not None:
        # HQQ's config takes no accuracy level; set it on every MatMulNBits.
        for n in model.graph.node:
            if n.op_type == "MatMulNBits":
                attrs = [a for a in n.attribute if a.name == "accuracy_level"]
                if attrs:
                    attrs[0].i = accuracy_level
                else:
                    n.attribute.append(onnx.helper.make_attribute("accuracy_level", accuracy_level))
    return _save(model, src, out, untied=untied, float_zero_points_folded=offsets)


def _fold_float_zero_points(model) -> int:
    """onnxruntime's CPU MatMulNBits has its fast kernels (accuracy_level 4: INT8 products)
    only for integer zero points; with float ones (hqq's layout, used by minmax) it runs a
    generic path ~50x slower (12.6 ms against 0.25 ms for a 576 x 1536 matrix at batch 1).
    So the float zero point z of each block is moved out of the kernel:
        W[k, n] = s[n, b] (q[n, k] - z[n, b]) = s[n, b] (q[n, k] - m) + s[n, b] (m - z[n, b])
    the first term is a MatMulNBits without zero points (implied zero point m: 8 for 4 bits,
    128 for 8), the
    second adds, per output, each block's input sum times an offset:
        y = MatMulNBits(x) + ReduceSum(x viewed [.., K/B, B], -1) @ C,   C [K/B, N] = s (m - z)
    C is stored in fp16 (a Cast the session folds at load): it is a sixteenth of the
    weight bytes. A block sum is computed once per distinct input (q, k and v share one; gate
    and up share one). Returns the number of nodes changed."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    sums: dict[str, str] = {}
    new_nodes, changed = [], 0
    for node in list(graph.node):
        if node.op_type != "MatMulNBits" or len(node.input) < 4 or node.input[3] not in inits \
                or inits[node.input[3]].data_type != TensorProto.FLOAT:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        k, n, block, bits = attrs["K"], attrs["N"], attrs["block_size"], attrs.get("bits", 4)
        blocks = (k + block - 1) // block
        if k % block or bits not in (4, 8):
            continue
        mid = float(1 << (bits - 1))  # the zero point MatMulNBits implies when none is given
        scales = numpy_helper.to_array(inits[node.input[2]]).reshape(n, blocks)
        zeros = numpy_helper.to_array(inits[node.input[3]]).reshape(n, blocks)
        offset = (scales * (mid - zeros)).T.astype(np.float16)  # [K/B, N]
        x, y = node.input[0], node.output[0]
        if x not in sums:
            # x [..., K] -> [..., K/B, B]: the leading dims from Shape(x) (any rank), then sum.
            tail = helper.make_tensor(f"{x}_blocktail", TensorProto.INT64, [2], [blocks, block])
            axes = helper.make_tensor(f"{x}_blockaxes", TensorProto.INT64, [1], [-1])
            graph.initializer.extend([tail, axes])
            new_nodes += [
                helper.make_node("Shape", [x], [f"{x}_lead"], end=-1, name=f"{x}_lead"),
                helper.make_node("Concat", [f"{x}_lead", tail.name], [f"{x}_blockshape"], axis=0,
                                 name=f"{x}_blockshape"),
                helper.make_node("Reshape", [x, f"{x}_blockshape"], [f"{x}_blocks"], name=f"{x}_blocks"),
                helper.make_node("ReduceSum", [f"{x}_blocks", axes.name], [f"{x}_blocksum"], keepdims=0,
                                 name=f"{x}_blocksum"),
            ]
            sums[x] = f"{x}_blocksum"
        c = node.name + "_offsets"
        graph.initializer.append(numpy_helper.from_array(offset, c + "_fp16"))
        del node.input[3:]
        node.output[0] = y + "_nozp"
        new_nodes += [
            helper.make_node("Cast", [c + "_fp16"], [c], to=TensorProto.FLOAT, name=c + "_cast"),
            helper.make_node("MatMul", [sums[x], c], [c + "_out"], name=c + "_matmul"),
            helper.make_node("Add", [y + "_nozp", c + "_out"], [y], name=c + "_add"),
        ]
        changed += 1
    graph.node.extend(new_nodes)
    _toposort(graph)
    names = {t.name for t in graph.initializer}
    used = {i for nd in graph.node for i in nd.input}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(names):
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return changed


def _toposort(graph) -> None:
    """Orders graph.node so that every node comes after the producers of its inputs (nodes
    appended at the end must move before their consumers)."""
    produced = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for nd in pending:
            if all(i in produced for i in nd.input):
                ordered.append(nd)
                produced.update(nd.output)
            else:
                rest.append(nd)
        if len(rest) == len(pending):
            raise RuntimeError("graph has a cycle or an input nobody produces; cannot order it")
        pending = rest
    del graph.node[:]
    graph.node.extend(ordered)


def _minmax_quantizer(config):
    """onnxruntime's HQQ node writer (MatMulNBits with float scales and float zero points)
    with its fit turned off: scale = (max - min) / 15 and zero = -min / scale per block, not
    rounded. onnxruntime offers no such algorithm (its rtn rounds the zero point to an
    integer, HQQ rounds it and then moves scales away from the block's range); the node
    layout is theirs, only the two numbers per block are chosen here."""
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantizer

    class MinMax(HQQWeightOnlyQuantizer):
        def quantize_internal(self, tensor, bits=4, channel_wise=True, group_size=64, optimize=True, round_zero=True,
                              axis=1):
            return super().quantize_internal(tensor, bits=bits, channel_wise=channel_wise, group_size=group_size,
                                             optimize=False, round_zero=False, axis=axis)

    return MinMax(config)


def quantize_int8(src: Path, out: Path, *, per_channel: bool = True, embeddings: bool = False, lm_head: bool = True,
                  exclude: list[str] | None = None, reduce_range: bool | None = None) -> dict:
    """Dynamic INT8 of the graph in `src` into `out` (onnxruntime.quantization.quantize_dynamic):
    MatMul weights INT8 ahead of time (per output channel with `per_channel`), activations
    quantized per call (DynamicQuantizeLinear + MatMulInteger). `lm_head` unties a tied output
    projection first so it is quantized too; `embeddings` quantizes the Gather table as well.
    `reduce_range` (7-bit weights; None: on CPUs whose int8 kernels saturate, see
    compress.core.manifest.int8_saturates)."""
    from compress.core.manifest import int8_saturates

    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(Path(src) / MODEL_FILE))
    untied = untie_lm_head(model) if lm_head else []
    ops = ["MatMul", "Gather"] if embeddings else ["MatMul"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quantize_int8-") as tmp:
        quantize_dynamic(model, Path(tmp) / MODEL_FILE, op_types_to_quantize=ops, per_channel=per_channel,
                         weight_type=QuantType.QInt8, nodes_to_exclude=list(exclude or []),
                         reduce_range=int8_saturates() if reduce_range is None else reduce_range,
                         extra_options={"MatMulConstBOnly": True})
        quantized = onnx.load(str(Path(tmp) / MODEL_FILE))
    return _save(quantized, src, out, untied=untied)


def _save(model, src: Path, out: Path, **record) -> dict:
    import collections

    import onnx

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # One file when it fits protobuf's 2 GB; past that, the weights go to model.onnx.data.
    large = model.ByteSize() > 1_900_000_000
    onnx.save_model(model, str(out / MODEL_FILE), save_as_external_data=large,
                    location=MODEL_FILE + ".data" if large else None)
    _copy_side_files(src, out)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    sizes = {"input": _graph_bytes(Path(src)), "output": _graph_bytes(out)}
    quantized = {k: v for k, v in sorted(ops.items()) if k in (
        "MatMulNBits", "GatherBlockQuantized", "MatMulInteger", "DynamicQuantizeLinear", "MatMul", "Gather")}
    return {**record, "operators": quantized, "size_bytes": sizes}


def _graph_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.name.startswith(MODEL_FILE))
