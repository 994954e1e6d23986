"""OpenVINO model folders (IR), run with OpenVINO's CPU plugin.

Folder layout (written by export_openvino and quantize_openvino):
    model.xml, model.bin  the IR: inputs input_ids / attention_mask [/ token_type_ids], each
                          int64 [batch, sequence] (both axes dynamic), output logits [batch, labels]
    config.json           the transformers config (labels, model type) for tools that want it
    tokenizer files

The benchmark compiles every OpenVINO variant the same way, and each row records how:
- the LATENCY performance hint (one stream, one request at a time, as the benchmark calls
  every runtime) with `threads` inference threads, as onnxruntime gets `threads` intra-op
  threads;
- f32 inference precision. The CPU plugin's default is bf16 wherever the CPU has bf16
  instructions (AMX or AVX-512 BF16, e.g. c7i): a lower precision that onnxruntime and
  torch do not get, which would mix a precision change into the runtime comparison. An
  INT8 IR still runs its INT8 kernels under f32 (the hint covers the float parts).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from compress.formats import Predictor

MODEL_FILE = "model.xml"
WEIGHTS_FILE = "model.bin"

# Element types of weights stored compressed (NNCF's INT8 / INT4 weights and their zero points).
_LOW_BIT = {"i8", "u8", "i4", "u4", "nf4"}
_FLOAT = {"f32", "f16", "bf16"}


def model_file(folder: Path) -> Path:
    """The IR's model.xml, after check_ir."""
    path = Path(folder) / MODEL_FILE
    if not path.is_file() or not (Path(folder) / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{folder}: no {MODEL_FILE} and {WEIGHTS_FILE}; not an OpenVINO model folder")
    check_ir(Path(folder))
    return path


# A <data> element of an IR's Const layer: where its weights lie in model.bin.
_DATA_TAG = re.compile(rb"<data\b[^>]*>")
_OFFSET = re.compile(rb'\boffset="(\d+)"')
_SIZE = re.compile(rb'\bsize="(\d+)"')


def check_ir(folder: Path) -> None:
    """ArtifactError naming the file when an IR was cut short or tampered with, before
    OpenVINO reads it: a model.xml that declares a DTD or entities (OpenVINO never writes
    one; an external entity would point the parser at another file), that does not end its
    <net> element (truncated), or whose weights lie past the end of model.bin (truncated)."""
    from compress.core.errors import ArtifactError

    xml_path, bin_path = folder / MODEL_FILE, folder / WEIGHTS_FILE
    xml = xml_path.read_bytes()
    upper = xml.upper()
    if b"<!DOCTYPE" in upper or b"<!ENTITY" in upper:
        raise ArtifactError(f"{xml_path}: declares a DTD or entities, which OpenVINO never writes: the IR was edited; "
                            f"rebuild it (run the stage again) rather than load it")
    if not xml.rstrip().endswith(b"</net>"):
        raise ArtifactError(f"{xml_path}: truncated (it does not end its <net> element); rebuild it")
    needed = 0
    for tag in _DATA_TAG.findall(xml):
        offset, size = _OFFSET.search(tag), _SIZE.search(tag)
        if offset and size:
            needed = max(needed, int(offset.group(1)) + int(size.group(1)))
    have = bin_path.stat().st_size
    if have < needed:
        raise ArtifactError(f"{bin_path}: {have} bytes, but {MODEL_FILE} reads weights up to byte {needed}: truncated; "
                            f"rebuild it")


def compile_config(threads: int) -> dict:
    """The CPU plugin's settings for every OpenVINO variant (see the module docstring)."""
    return {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": int(threads), "INFERENCE_PRECISION_HINT": "f32"}


def save(model, folder: Path) -> Path:
    """Writes the IR as model.xml + model.bin, weights in their own precision:
    openvino.save_model would otherwise store fp32 weights as fp16 (its default)."""
    import openvino as ov

    path = Path(folder) / MODEL_FILE
    ov.save_model(model, str(path), compress_to_fp16=False)
    return path


def weight_constants(model) -> list:
    """The Constant nodes that hold weights: floating point or low-bit tensors of rank >= 1,
    without the ranges of FakeQuantize nodes and the scales and zero points of compressed
    weights (bookkeeping, not parameters, as quantize_onnx's scales are for ONNX)."""
    out = []
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        etype, shape = op.get_element_type().get_type_name(), op.get_output_shape(0)
        if (etype not in _FLOAT and etype not in _LOW_BIT) or len(shape) == 0:
            continue
        targets = list(op.output(0).get_target_inputs())
        if targets and all(t.get_node().get_type_name() == "FakeQuantize" and t.get_index() > 0 for t in targets):
            continue  # a FakeQuantize's input or output range
        if shape[-1] == 1 and targets and all(_decompression_param(t.get_node()) for t in targets):
            continue  # a scale or zero point of a compressed weight ([out, 1] or [out, groups, 1])
        out.append(op)
    return out


def _decompression_param(user) -> bool:
    """Whether a constant used by `user` is a scale or zero point of a compressed weight: it
    feeds, directly or through a Convert, the Subtract or Multiply that decompresses one."""
    if user.get_type_name() == "Convert":
        return all(_decompression_param(t.get_node()) for t in user.output(0).get_target_inputs())
    return user.get_type_name() in ("Subtract", "Multiply") and _decompresses(user)


def _decompresses(node) -> bool:
    """Whether one input of `node` is a converted low-bit weight (Convert of an INT8 / INT4
    constant, not itself a per-channel parameter), or such a weight with its zero point subtracted."""
    for value in node.input_values():
        src = value.get_node()
        if src.get_type_name() == "Subtract" and _decompresses(src):
            return True
        if src.get_type_name() == "Convert":
            inner = src.input_value(0).get_node()
            shape = inner.get_output_shape(0) if inner.get_type_name() == "Constant" else []
            if len(shape) >= 2 and shape[-1] > 1 and inner.get_element_type().get_type_name() in _LOW_BIT:
                return True
    return False


class OpenVinoPredictor(Predictor):
    def __init__(self, path: Path, device: str, threads: int, options: dict):
        import openvino as ov
        from transformers import AutoTokenizer

        super().__init__(path)
        self.file = model_file(path)
        self.core = ov.Core()
        self.model = self.core.read_model(str(self.file))
        config = compile_config(threads)
        self.compiled = self.core.compile_model(self.model, "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(options.get("trust_remote_code", False)))
        self.device = device
        self.input_names = tuple(i.get_any_name() for i in self.compiled.inputs)
        names = [o.get_names() for o in self.compiled.outputs]
        self.output = next((o for o, n in zip(self.compiled.outputs, names) if "logits" in n), self.compiled.outputs[0])
        # What the plugin made of the settings (a hint is a request; the compiled model says what it chose).
        streams = self.compiled.get_property("NUM_STREAMS")
        precision = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        precision = getattr(precision, "get_type_name", lambda: str(precision))()
        self.notes.append(
            f"OpenVINO {ov.get_version().split('-')[0]} CPU plugin: {config['PERFORMANCE_HINT']} hint, "
            f"{self.compiled.get_property('INFERENCE_NUM_THREADS')} threads, {streams} stream(s), "
            f"{precision} inference precision"
            + (", threads pinned to cores" if self.compiled.get_property("ENABLE_CPU_PINNING") else "")
        )
        self.effective_device = device
        if device != "cpu":  # the benchmark sends OpenVINO to the CPU only (formats.CPU_ONLY)
            self.effective_device = "cpu"
            self.notes.append("OpenVINO has no CUDA plugin; ran on the CPU")
        self.config = config

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        # A synchronous call on one infer request: one request at a time, as every runtime
        # is called by the benchmark. The result is copied out of the request's buffer.
        feed = {k: np.ascontiguousarray(batch[k], dtype=np.int64) for k in self.input_names}
        return np.array(self.request.infer(feed)[self.output], copy=True)

    def num_params(self) -> int:
        return int(sum(int(np.prod(op.get_output_shape(0))) for op in weight_constants(self.model)))

    def memory_bytes(self) -> int:
        return int(sum(op.get_byte_size() for op in self.model.get_ops() if op.get_type_name() == "Constant"))


def load(path: Path, device: str, threads: int, options: dict) -> OpenVinoPredictor:
    return OpenVinoPredictor(Path(path), device, threads, options)
