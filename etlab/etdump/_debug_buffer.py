"""Intermediate and output tensors recorded in the debug buffer, as torch tensors.

An ETDump debug event stores only a tensor's metadata (scalar type, sizes, strides) and a byte
offset; the bytes live in a separate debug-buffer file. Tensors are zero-copy views of that file
(memory-mapped copy-on-write, so writing to a tensor never touches the file). Every offset is
bounds-checked against the buffer's length; a tensor reaching past the end raises `FormatError`
naming the buffer file. Without a buffer, tensors come back on the "meta" device: shape and
dtype are right, and any attempt to read values fails loudly instead of showing made-up zeros.
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from etlab.errors import FormatError
from etlab.etdump._reader import ETDumpColumns
from etlab.schema import check_intact, map_file
from etlab.schema.scalar_type import ScalarType, scalar_type_to_dtype

if TYPE_CHECKING:
    import torch

_VT_INT, _VT_BOOL, _VT_FLOAT, _VT_DOUBLE, _VT_TENSOR, _VT_TENSOR_LIST = 1, 2, 3, 4, 5, 6


@dataclass
class DebugBuffer:
    """The bytes of a debug-buffer file (or bytes-like) and its name for error messages."""

    data: memoryview | bytes
    what: str
    writable: bool

    def __len__(self) -> int:
        return len(self.data)


def load_debug_buffer(source, etdump: ETDumpColumns | None = None) -> DebugBuffer:
    """A debug buffer from a path (memory-mapped) or bytes-like (used as is); with the `etdump` it was
    written with, checked to be that ETDump's buffer (`check_pair`)."""
    buffer = _load(source)
    if etdump is not None:
        check_pair(etdump, buffer)
    return buffer


def _load(source) -> DebugBuffer:
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source).cast("B")
        return DebugBuffer(view, f"<debug buffer of {len(view)} bytes>", not view.readonly)
    # Copy-on-write: tensors may be written to without changing the file. Files past 1 MiB stay
    # mapped (a runtime's buffer is mostly unused space: only the ETDump's ranges are ever read);
    # tensor_from_debug_buffer checks they were not truncated (no SIGBUS).
    path = Path(source)
    try:
        view, name = map_file(path, copy_on_write=True, small_file_bytes=1 << 20)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (debug buffer)") from None
    except FormatError:
        raise FormatError(f"{path}: is a directory, not a debug-buffer file") from None
    return DebugBuffer(view, name, True)


def check_pair(etdump: ETDumpColumns, buffer: DebugBuffer) -> None:
    """FormatError (naming both files) unless `buffer` can be the debug buffer `etdump` was written with.

    An ETDump etlab wrote records its buffer's size and SHA-256: any other buffer is refused (a
    process stopped between the two files' writes leaves a pair from two runs, which would show one
    run's values as the other's). Upstream's ETDumps record nothing of the kind; for them (and for
    ours too) every tensor the ETDump points to must lie inside the buffer, with sizes and strides
    that make sense for its dtype.
    """
    digest = etdump.debug_buffer_digest
    if digest is not None:
        sha = hashlib.sha256(buffer.data).digest() if len(buffer) == digest.size else None
        if sha != (bytes(digest.sha256) if digest.sha256 is not None else None):
            recorded = bytes(digest.sha256 or b"").hex()[:16]
            got = f"SHA-256 {sha.hex()[:16]}..." if sha is not None else f"{len(buffer)} bytes"
            raise FormatError(f"{buffer.what} is not the debug buffer {etdump.what} was written with: the ETDump "
                              f"records {digest.size} bytes with SHA-256 {recorded}..., this buffer has {got} "
                              "(a buffer left by another run?); pass the pair written together")
    if etdump.values is not None:
        _check_extents(etdump, buffer)


def _check_extents(etdump: ETDumpColumns, buffer: DebugBuffer) -> None:
    t = etdump.values.tensors
    _, itemsizes = _dtypes()
    for i, (st, offset) in enumerate(zip(t.scalar_type.tolist(), t.offset.tolist())):
        sizes, strides = t.shape(i), t.stride(i)
        where = f"{buffer.what} does not hold the tensors {etdump.what} points to: tensor {i}"
        if any(s < 0 for s in sizes) or (strides and len(strides) == len(sizes) and any(s < 0 for s in strides)):
            raise FormatError(f"{where} has negative sizes {sizes} or strides {strides}")
        if offset == -1 or 0 in sizes:
            continue  # not kept by the runtime, or empty
        contiguous = not strides or len(strides) != len(sizes)
        extent = math.prod(sizes) if contiguous else 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
        end = offset + extent * itemsizes[st]
        if offset < 0 or end > len(buffer):
            raise FormatError(f"{where} ({ScalarType(st).name} {sizes}) needs bytes [{offset}, {end}), but the "
                              f"buffer holds {len(buffer)} bytes (a debug buffer of another run or program?)")


@functools.cache
def _dtypes() -> tuple[dict[int, torch.dtype], dict[int, int]]:
    """Per scalar type: the dtype a recorded tensor is read as, and its element size. Built on first
    use, so that reading an ETDump without tensors needs no torch."""
    import torch

    # Quantized and bit types hold plain integers in memory; read them as such.
    storage = {ScalarType.QINT8: torch.int8, ScalarType.QUINT8: torch.uint8, ScalarType.QINT32: torch.int32,
               ScalarType.BITS16: torch.uint16}
    # packed sub-byte elements: expose the raw bytes' element type
    packed = {ScalarType.QUINT4X2: torch.uint8, ScalarType.QUINT2X4: torch.uint8}
    dtypes = {int(st): storage.get(st) or packed.get(st) or scalar_type_to_dtype(st) for st in ScalarType}
    return dtypes, {k: torch.empty((), dtype=d).element_size() for k, d in dtypes.items()}


def tensor_from_debug_buffer(buffer: DebugBuffer | None, scalar_type: int, sizes: list[int],
                             strides: list[int] | None, offset: int, ctx: str) -> torch.Tensor:
    """One recorded tensor: a view of the buffer with the recorded strides, bounds-checked."""
    import torch

    dtypes, itemsizes = _dtypes()
    dtype = dtypes[scalar_type]
    what = buffer.what if buffer is not None else "debug buffer"
    if any(s < 0 for s in sizes):
        raise FormatError(f"{what}: {ctx} has negative sizes {sizes}")
    contiguous = not strides or len(strides) != len(sizes)
    if not contiguous and any(s < 0 for s in strides):
        raise FormatError(f"{what}: {ctx} has negative strides {strides}")
    if math.prod(s for s in sizes if s) * itemsizes[scalar_type] >= 1 << 62:  # torch's strides would overflow
        raise FormatError(f"{what}: {ctx} has sizes {sizes}, too large for any tensor")
    numel = math.prod(sizes)
    if numel == 0:
        return torch.empty(sizes, dtype=dtype)
    if buffer is None or offset == -1:  # no buffer, or the runtime did not keep this tensor's data
        return torch.empty(sizes, dtype=dtype, device="meta")
    extent = numel if contiguous else 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
    nbytes = extent * itemsizes[scalar_type]
    if offset < 0 or offset + nbytes > len(buffer):
        raise FormatError(f"{what}: {ctx} needs bytes [{offset}, {offset + nbytes}) but the debug buffer "
                          f"holds {len(buffer)} bytes")
    check_intact(buffer.data)
    if buffer.writable:
        flat = torch.frombuffer(buffer.data, dtype=dtype, count=extent, offset=offset)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only input: the tensor shares it
            flat = torch.frombuffer(buffer.data, dtype=dtype, count=extent, offset=offset)
    return flat.view(sizes) if contiguous else flat.as_strided(sizes, strides)


def debug_value(columns: ETDumpColumns, row: int, buffer: DebugBuffer | None):
    """The debug_entry of the `row`-th debug event as a Python value: a tensor, a list of tensors,
    an int/float/bool, or None."""
    v = columns.values
    ctx = f"debug event {row}"
    if v is None or not v.present[row]:
        return None
    kind = int(v.val[row])
    t = v.tensors

    def tensor(i: int) -> torch.Tensor:
        return tensor_from_debug_buffer(buffer, int(t.scalar_type[i]), t.shape(i), t.stride(i), int(t.offset[i]),
                                        f"{ctx} (tensor of {columns.what})")

    if kind == _VT_TENSOR:
        if v.tensor[row] < 0:
            raise FormatError(f"{columns.what}: {ctx} is a Tensor value without a tensor")
        return tensor(int(v.tensor[row]))
    if kind == _VT_TENSOR_LIST:
        if not v.has_tensor_list[row]:
            raise FormatError(f"{columns.what}: {ctx} is a TensorList value without a tensor_list")
        return [tensor(i) for i in v.tensor_list[row] or ()]
    if kind in (_VT_INT, _VT_BOOL, _VT_FLOAT, _VT_DOUBLE):
        return v.scalar[row]
    return None


def debug_rows_of(columns: ETDumpColumns) -> np.ndarray:
    """Map event row -> debug row (-1 for events that are not debug events)."""
    out = np.full(len(columns), -1, dtype=np.int64)
    out[columns.has_debug] = np.arange(int(columns.has_debug.sum()))
    return out
