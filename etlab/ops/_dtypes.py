"""Element types the kernels support, and the ones no kernel may be handed.

SUPPORTED_DTYPES is what every kernel on the list computes in (the portable kernels' set);
quantized and sub-byte types (`qint8`, `quint4x2`, `bits16`, ...) are refused at load: torch's
kernels assume a quantizer object or a packed layout those tensors do not carry, and crash natively
instead of raising.
"""

from __future__ import annotations

import torch

from etlab.ops._allowlist import ATEN_FLOAT_ONLY

REAL_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
                         torch.float64})
FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
SUPPORTED_DTYPES = frozenset(REAL_DTYPES | FLOAT_DTYPES | {torch.bool})
INDEX_DTYPES = frozenset({torch.int32, torch.int64})
UNSUPPORTED_STORAGE_DTYPES = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4,
                                        torch.bits16})


def dtype_problem(base: str, dtype: torch.dtype) -> str | None:
    """Why the kernel of ATen operator `base` ("add", "convolution") cannot take a tensor of
    `dtype` (None if it can)."""
    if dtype not in SUPPORTED_DTYPES:
        return (f"dtype {dtype} is not supported by the runtime kernels "
                f"(supported: {', '.join(sorted(str(d) for d in SUPPORTED_DTYPES))})")
    if base in ATEN_FLOAT_ONLY and dtype not in FLOAT_DTYPES:
        return f"the runtime kernel computes in floating point only, got {dtype}"
    return None


def storage_dtype_problem(dtype: torch.dtype) -> str | None:
    """Why a tensor of `dtype` cannot be built from file data at all (None if it can)."""
    if dtype in UNSUPPORTED_STORAGE_DTYPES or dtype.is_complex:
        return (f"dtype {dtype} (quantized, sub-byte or complex) is not supported: etlab's kernels take plain "
                "integer, floating and bool tensors; use quantized_decomposed ops on int8 tensors instead")
    return None
