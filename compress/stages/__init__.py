"""Stage kinds, registered by explicit name. Each module is small and imports no
framework at module level, so listing and validating stays fast."""

from compress.registry import StageKind
from compress.stages import finetune, quantize_dynamic
from compress.stages import cascade
from compress.stages import distill, prune, trim_vocab
from compress.stages import export_onnx, load_4bit, optimize_onnx, quantize_onnx
from compress.stages import export_openvino, quantize_openvino

STAGES: dict[str, StageKind] = {
    kind.name: kind
    for kind in (
        finetune.KIND,
        quantize_dynamic.KIND,
        cascade.KIND,
        distill.KIND,
        prune.KIND,
        trim_vocab.KIND,
        export_onnx.KIND,
        optimize_onnx.KIND,
        quantize_onnx.KIND,
        export_openvino.KIND,
        quantize_openvino.KIND,
        load_4bit.KIND,
    )
}
