"""ONNX model folders, run with onnxruntime.

Folder layout (written by export_onnx, optimize_onnx and quantize_onnx):
    model.onnx        the graph, inputs input_ids / attention_mask [/ token_type_ids], each
                      int64 [batch, sequence] (both axes dynamic), output logits [batch, labels]
    config.json       the transformers config (labels, model type) for tools that want it
    tokenizer files

Also home of the helpers the ONNX stages share: the session options every ONNX
variant runs with, and the parity comparison of two predictors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compress.formats import Predictor, model_inputs

MODEL_FILE = "model.onnx"

# Operators of an INT8 graph. onnxruntime's CUDA execution provider has no kernel for
# most of them (dynamic quantization in particular), so it hands them to the CPU.
INT8_OPS = {
    "DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
    "QAttention", "QEmbedLayerNormalization", "QGemm", "QLinearMatMul", "QLinearAdd", "QLinearMul",
    "QLinearConv", "QLinearSoftmax", "QuantizeLinear", "QOrderedMatMul", "ConvInteger",
}
# Of those, the ones the CUDA execution provider has no kernel for. A QDQ graph (static
# INT8) keeps only QuantizeLinear/DequantizeLinear, which CUDA runs (as float arithmetic
# around float MatMuls: INT8 kernels come with TensorRT, not the CUDA provider).
CPU_INT8_OPS = INT8_OPS - {"QuantizeLinear", "QOrderedMatMul"}


def model_file(folder: Path) -> Path:
    path = Path(folder) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {MODEL_FILE}; not an ONNX model folder")
    return path


def session(path: Path, device: str, threads: int, spin_wait: bool = True):
    """An InferenceSession with the benchmark's thread settings: `threads` intra-op
    threads, one inter-op thread (a BERT graph is a chain; parallel branches buy nothing).
    spin_wait=False: the intra-op threads sleep when a call ends instead of spinning for
    the next one (ORT's default), for sessions that take turns with another model."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: ORT warns about every node it places on the CPU
    if not spin_wait:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = ["CPUExecutionProvider"]
    # Asking for a provider this onnxruntime build lacks only warns; the predictor then
    # reads the session's providers and reports where it really runs.
    if device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        _load_cuda_libraries(ort)
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers)


def _load_cuda_libraries(ort) -> None:
    """onnxruntime-gpu (>= 1.19) finds the CUDA and cuDNN libraries of pip's nvidia-* wheels
    only when they are loaded before the session starts; otherwise the CUDA provider fails
    to load and the session quietly runs on the CPU. Importing torch loads them (the way
    onnxruntime's documentation gives for environments with PyTorch); preload_dlls()
    (onnxruntime >= 1.21) does it without torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()


def graph_ops(path: Path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


class OnnxPredictor(Predictor):
    def __init__(self, path: Path, device: str, threads: int, options: dict):
        from transformers import AutoTokenizer

        super().__init__(path)
        self.file = model_file(path)
        self.device = device
        self.ops = graph_ops(self.file)
        self.int8 = bool(self.ops & INT8_OPS)
        # A dynamic INT8 graph on the CUDA provider would run split: its INT8 operators on
        # the CPU, the rest on the GPU, with a copy at every boundary, a figure that is
        # neither device's. It runs on the CPU instead, and is reported as a fallback.
        cpu_int8 = device == "cuda" and bool(self.ops & CPU_INT8_OPS)
        self.session = session(self.file, "cpu" if cpu_int8 else device, threads,
                               spin_wait=bool(options.get("spin_wait", True)))
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(options.get("trust_remote_code", False)))
        # The worker feeds only what the graph takes (e.g. no token_type_ids for DistilBERT).
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output = "logits" if "logits" in [o.name for o in self.session.get_outputs()] else self.session.get_outputs()[0].name
        self.effective_device = device
        if device == "cuda":
            if cpu_int8:
                self.effective_device = "cpu"
                self.notes.append("INT8 operators have no CUDA kernels in onnxruntime; ran on the CPU")
            elif "CUDAExecutionProvider" not in self.session.get_providers():
                self.effective_device = "cpu"
                self.notes.append("onnxruntime has no CUDA execution provider here; ran on the CPU")
            elif self.int8:
                self.notes.append("QDQ INT8 graph: CUDA runs its quantize/dequantize pairs around float "
                                  "MatMuls (INT8 kernels need TensorRT)")
            if options.get("cuda_dtype", "fp32") != "fp32":
                self.notes.append("ONNX graph runs in its stored precision (cuda_dtype applies to torch)")

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        # session.run copies the outputs to host memory, so it returns after the device
        # work is done: no separate synchronisation is needed.
        feed = {k: np.ascontiguousarray(batch[k], dtype=np.int64) for k in self.input_names}
        return self.session.run([self.output], feed)[0]

    def _initializers(self):
        import onnx

        return onnx.load(str(self.file)).graph.initializer

    def num_params(self) -> int:
        # Weights only: quantization scales and zero points are bookkeeping, not parameters.
        total = 0
        for t in self._initializers():
            if t.name.endswith(("_scale", "_zero_point")):
                continue
            total += int(np.prod(t.dims)) if len(t.dims) else 1
        return total

    def memory_bytes(self) -> int:
        from onnx import numpy_helper

        return int(sum(numpy_helper.to_array(t).nbytes for t in self._initializers()))


def load(path: Path, device: str, threads: int, options: dict) -> OnnxPredictor:
    return OnnxPredictor(Path(path), device, threads, options)


# ---------------------------------------------------------------------------------------
# Parity: how far one variant's logits are from another's on the same sentences.


def compare(reference: Predictor, candidate: Predictor, split, max_length: int, batch_size: int = 16) -> dict:
    """Runs both predictors on the texts of `split` (padded batches [B, T] int64, the
    reference's tokenizer) and returns the largest absolute logit difference, the share
    of examples whose predicted label agrees (percent) and the number of examples."""
    tok = reference.tokenizer
    diffs, agree = [], 0
    n = len(split.texts)
    for start in range(0, n, batch_size):
        texts = split.texts[start : start + batch_size]
        pairs = split.pairs[start : start + batch_size] if split.pairs is not None else None
        enc = tok(texts, pairs, truncation=True, max_length=max_length, padding=True, return_tensors="np")
        batch = {k: v.astype(np.int64) for k, v in model_inputs(enc).items()}
        a = reference(model_inputs(batch, reference.input_names))
        b = candidate(model_inputs(batch, candidate.input_names))
        diffs.append(float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
    return {"examples": n, "max_abs_diff": max(diffs) if diffs else 0.0, "label_agreement": 100.0 * agree / max(n, 1)}
