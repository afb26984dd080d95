"""ScalarType (the schema's element-type enum) <-> torch.dtype."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from etlab.schema._codec import make_enum

if TYPE_CHECKING:
    import torch

ScalarType = make_enum("scalar_type.ScalarType")
ScalarType.__doc__ = """A tensor's element type as ExecuTorch files store it (c10's numbering: FLOAT is 6, LONG 4);
`scalar_type_to_dtype` / `dtype_to_scalar_type` convert to and from torch.

>>> ScalarType(6).name
'FLOAT'
"""

@functools.cache
def _tables() -> tuple[dict, dict]:
    """ScalarType -> dtype and back, built on first use: reading a file needs no torch until a tensor is made."""
    import torch

    to_dtype = {
        ScalarType.BYTE: torch.uint8, ScalarType.CHAR: torch.int8, ScalarType.SHORT: torch.int16,
        ScalarType.INT: torch.int32, ScalarType.LONG: torch.int64, ScalarType.HALF: torch.float16,
        ScalarType.FLOAT: torch.float32, ScalarType.DOUBLE: torch.float64, ScalarType.BOOL: torch.bool,
        ScalarType.QINT8: torch.qint8, ScalarType.QUINT8: torch.quint8, ScalarType.QINT32: torch.qint32,
        ScalarType.BFLOAT16: torch.bfloat16, ScalarType.QUINT4X2: torch.quint4x2, ScalarType.QUINT2X4: torch.quint2x4,
        ScalarType.BITS16: torch.bits16, ScalarType.FLOAT8E5M2: torch.float8_e5m2,
        ScalarType.FLOAT8E4M3FN: torch.float8_e4m3fn, ScalarType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
        ScalarType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz, ScalarType.UINT16: torch.uint16,
        ScalarType.UINT32: torch.uint32, ScalarType.UINT64: torch.uint64,
    }
    return to_dtype, {d: s for s, d in to_dtype.items()}



def scalar_type_to_dtype(st: int) -> torch.dtype:
    """The torch dtype of an ExecuTorch file's scalar type; a ValueError names a value without one.

    >>> scalar_type_to_dtype(6)
    torch.float32
    """
    try:
        return _tables()[0][ScalarType(st)]
    except (KeyError, ValueError):
        raise ValueError(f"scalar type {st} has no torch dtype") from None


def dtype_to_scalar_type(dtype: torch.dtype) -> ScalarType:
    """The scalar type a file stores `dtype` as; a ValueError names a dtype no ExecuTorch file can hold.

    >>> import torch
    >>> dtype_to_scalar_type(torch.int8)
    <ScalarType.CHAR: 1>
    """
    try:
        return _tables()[1][dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot be stored in an ExecuTorch file") from None
