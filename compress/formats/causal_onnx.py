"""Causal LMs exported to ONNX (compress.tasks.causal_lm.export), run with a raw onnxruntime session.

Why a loop by hand rather than Optimum's ORTModelForCausalLM: its forward converts every
KV tensor to and from torch on every step, builds position ids and masks in torch, and
goes through transformers' generation machinery (logits processors, stopping criteria):
a fixed cost per token that on a 135M model is a large share of a ~20 ms step. Here the
KV cache stays in onnxruntime as OrtValues bound with IOBinding (present.* of one step is
bound as past_key_values.* of the next, no copy), and only the [B, V] logits cross to
numpy. eval/peer_llm.py measures the difference.

Graph (see compress.tasks.causal_lm.export): input_ids [B, T], attention_mask [B, P+T], position_ids
[B, T] (absent in some families), past_key_values.{i}.key/.value [B, H_kv, P, D] ->
logits [B, T, V], present.{i}.key/.value [B, H_kv, P+T, D].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compress.formats.causal import CausalLM

MODEL_FILE = "model.onnx"


class OnnxCausal(CausalLM):
    def __init__(self, path: Path, device: str, threads: int, options: dict):
        import onnxruntime as ort
        from transformers import AutoConfig, AutoTokenizer

        from compress.formats import onnx as onnx_fmt

        super().__init__(path)
        self.file = onnx_fmt.model_file(path)
        self.device = "cpu"
        if device != "cpu":
            self.notes.append("the ONNX causal-LM predictor runs on the CPU (its KV cache is bound to host memory)")
        self.session = onnx_fmt.session(self.file, "cpu", threads, spin_wait=bool(options.get("spin_wait", True)))
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        self.config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        self._ort = ort
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = [n for n in inputs if n.startswith("past_key_values.")]
        self.present_names = ["present." + n[len("past_key_values."):] for n in self.past_names]
        self.has_positions = "position_ids" in inputs
        if self.past_names:
            shape = inputs[self.past_names[0]].shape  # [B, H_kv, P, D]
            self.kv_heads, self.head_dim = int(shape[1]), int(shape[3])
            self.kv_dtype = np.float16 if "float16" in inputs[self.past_names[0]].type else np.float32
        else:
            raise ValueError(f"{path}: the graph has no past_key_values inputs; export it with a KV cache "
                             "(task text-generation-with-past)")

    # -- one forward pass

    def _run(self, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: list | None):
        """ids, pos [B, T]; mask [B, P+T]; past: OrtValues in past_names order or None (P = 0)
        -> (logits OrtValue [B, T, V], presents list of OrtValues)."""
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids, dtype=np.int64))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(mask, dtype=np.int64))
        if self.has_positions:
            binding.bind_cpu_input("position_ids", np.ascontiguousarray(pos, dtype=np.int64))
        if past is None:
            empty = np.zeros((ids.shape[0], self.kv_heads, 0, self.head_dim), dtype=self.kv_dtype)
            for name in self.past_names:
                binding.bind_cpu_input(name, empty)
        else:
            for name, value in zip(self.past_names, past):
                binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")
        for name in self.present_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        outs = binding.get_outputs()  # logits, then presents, in bind order
        return outs[0], list(outs[1:])

    # -- the contract

    def logprobs(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 want: np.ndarray | None = None) -> np.ndarray:  # every column: the graph computes them all
        pos = np.clip(attention_mask.cumsum(-1) - 1, 0, None)
        logits, _ = self._run(input_ids, attention_mask, pos, None)
        x = logits.numpy()[:, :-1]  # [B, T-1, V]
        nxt = input_ids[:, 1:, None].astype(np.int64)  # [B, T-1, 1]
        top = x.max(-1, keepdims=True)
        lse = np.log(np.exp(x - top).sum(-1, keepdims=True)) + top  # [B, T-1, 1]
        return (np.take_along_axis(x, nxt, axis=-1) - lse)[..., 0].astype(np.float32)

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        mask = np.ascontiguousarray(attention_mask, dtype=np.int64)
        # Left padding: a row's positions count from its first real token.
        pos = np.clip(mask.cumsum(-1) - 1, 0, None)  # [B, T]
        logits, presents = self._run(input_ids, mask, pos, None)
        return logits.numpy()[:, -1].astype(np.float32, copy=False), (presents, mask, pos[:, -1:])

    def step(self, tokens: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        past, mask, last = state
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), dtype=np.int64)], axis=1)  # [B, P+1]
        pos = last + 1  # [B, 1]
        logits, presents = self._run(np.asarray(tokens, dtype=np.int64)[:, None], mask, pos, past)
        return logits.numpy()[:, -1], (presents, mask, pos)

    # -- size

    def _graph(self, external: bool):
        import onnx

        return onnx.load(str(self.file), load_external_data=external)

    def num_params(self) -> int:
        """Parameters of the model the graph computes, counted on its transformers config (a
        model built on the meta device: no memory): the graph cannot tell them reliably (a
        quantized weight is packed, the exporter stores some weights as Constant nodes, and a
        tied table may appear twice)."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config)
        return sum(p.numel() for p in model.parameters())

    def memory_bytes(self) -> int:
        """Bytes of the stored weights (packed INT4 counts half a byte per weight)."""
        from onnx import TensorProto, helper

        four_bit = {TensorProto.INT4, TensorProto.UINT4}
        total = 0
        for t in self._graph(external=False).graph.initializer:
            n = int(np.prod(t.dims)) if len(t.dims) else 1
            total += (n + 1) // 2 if t.data_type in four_bit else n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        return total


def load(path: Path, device: str, threads: int, options: dict) -> OnnxCausal:
    return OnnxCausal(Path(path), device, threads, options)
