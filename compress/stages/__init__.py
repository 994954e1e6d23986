"""Stage kinds, registered by explicit name. Each module is small and imports no
framework at module level, so listing and validating stays fast."""

from compress.registry import StageKind
from compress.stages import finetune, quantize_dynamic

STAGES: dict[str, StageKind] = {
    kind.name: kind
    for kind in (
        finetune.KIND,
        quantize_dynamic.KIND,
    )
}
