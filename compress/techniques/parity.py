"""The parity check of the export stages (export_onnx, export_openvino): a conversion
that changes the model's answers fails the stage, it is never only a warning.

The comparison itself (largest logit difference, label agreement) is
compress.formats.onnx.compare, which takes any two predictors.
"""

from __future__ import annotations


def require(parity: dict, *, stage_id: str, what: str, tolerance: float, min_label_agreement: float,
            hint: str) -> None:
    """Raises StageError (one line, saying what to do) when `parity` (from compare) is beyond
    the limits: a logit difference above `tolerance` or a label agreement (percent) below
    `min_label_agreement`. `what` names the two sides, e.g. "ONNX export does not match its
    torch source"."""
    from compress.core.errors import StageError

    if parity["max_abs_diff"] > tolerance or parity["label_agreement"] < min_label_agreement:
        raise StageError(
            f"{stage_id}: {what}: max |logit diff| {parity['max_abs_diff']:.3g} (tolerance {tolerance:g}), "
            f"label agreement {parity['label_agreement']:.2f}% (minimum {min_label_agreement:g}%); {hint}"
        )
