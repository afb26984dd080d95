"""Quantization facts of an operator, by its name: whether it quantizes or dequantizes, and the
operator without its overload. Plain text helpers (no torch import), so that the Inspector can
read them off an ETRecord's op types without loading torch.

- `qdq_kind("quantized_decomposed.dequantize_per_tensor.default")` -> "dequantize";
  quantize_* and choose_qparams_* -> "quantize"; other operators -> None.
- `op_kind("aten.convolution.default")` -> "aten.convolution": two builds may pick different
  overloads of one operator.
"""

from __future__ import annotations

# the namespaces of PT2E's quantize / dequantize / choose_qparams operators
QUANT_NAMESPACES = ("quantized_decomposed", "torchao")


def op_kind(op_name: str) -> str:
    """An operator's dotted name without its overload ("aten.add.Tensor" -> "aten.add")."""
    return op_name.rsplit(".", 1)[0] if op_name.count(".") >= 2 else op_name


def qdq_kind(op_name: str) -> str | None:
    """"quantize" (quantize_*, choose_qparams_*), "dequantize" (dequantize_*) or None (any other op)."""
    parts = op_name.split(".")
    if len(parts) < 2 or parts[0] not in QUANT_NAMESPACES:
        return None
    if parts[1].startswith("dequantize"):
        return "dequantize"
    if parts[1].startswith(("quantize", "choose_qparams")):
        return "quantize"
    return None
