"""Tensors and plain values in an ETRecord, stored without pickle.

Tensors: one blob (`tensors.bin`) of raw little-endian bytes plus a JSON index giving each
tensor's dtype, shape, strides, offset and byte count. Identical bytes are stored once (by
SHA-256), so the weights shared by the ATen program, the edge program and the lowered modules
take their space once.

Values (inputs, outputs, example inputs): JSON where a tensor is `{"tensor": index}` and tuples,
lists, dicts and non-finite floats are tagged, so decoding gives back the same Python types.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass

import numpy as np
import torch

from etlab.errors import FormatError

_ALIGNMENT = 16  # every tensor starts on a multiple of this (>= any element size)
_MAX_DEPTH = 64  # nesting limit when decoding values

DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "uint16": torch.uint16, "uint32": torch.uint32,
    "uint64": torch.uint64, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "complex64": torch.complex64, "complex128": torch.complex128,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - every platform etlab runs on is little-endian
    raise ImportError("etlab.etrecord stores tensors little-endian and supports only little-endian hosts")


@dataclass(frozen=True)
class TensorEntry:
    """Where one stored tensor's bytes are in the record's blob (offset, size) and how to view them (dtype, shape,
    strides)."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    nbytes: int


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _is_dense(shape, strides) -> bool:
    """Whether the layout covers each element exactly once (a permutation of contiguous strides)."""
    dims = sorted((s, n) for s, n in zip(strides, shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


class TensorStore:
    """Collects tensors (and byte strings) for writing; identical contents are stored once."""

    def __init__(self):
        self.entries: list[TensorEntry] = []
        self._chunks: list[memoryview] = []
        self._size = 0
        self._region: dict[bytes, tuple[int, int]] = {}  # digest -> (offset, nbytes)
        self._entry_index: dict[TensorEntry, int] = {}

    def _region_for(self, data: memoryview) -> tuple[int, int]:
        digest = hashlib.sha256(data).digest()
        region = self._region.get(digest)
        if region is None:
            pad = -self._size % _ALIGNMENT
            if pad:
                self._chunks.append(memoryview(bytes(pad)))
                self._size += pad
            region = (self._size, data.nbytes)
            self._chunks.append(data)
            self._size += data.nbytes
            self._region[digest] = region
        return region

    def _add_entry(self, entry: TensorEntry) -> int:
        index = self._entry_index.get(entry)
        if index is None:
            index = self._entry_index[entry] = len(self.entries)
            self.entries.append(entry)
        return index

    def add(self, tensor: torch.Tensor, what: str = "tensor") -> int:
        """Stores a tensor; returns its index."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what}: expected a tensor, got {type(tensor).__name__}")
        if tensor.is_quantized or tensor.layout != torch.strided or tensor.device.type == "meta":
            raise ValueError(f"{what}: only dense tensors with data can be recorded "
                             f"(got layout {tensor.layout}, device {tensor.device}, quantized={tensor.is_quantized})")
        if tensor.dtype not in DTYPE_NAMES:
            raise ValueError(f"{what}: dtype {tensor.dtype} cannot be recorded (supported: {sorted(DTYPES)})")
        t = tensor.detach().cpu()
        flat = t.contiguous().reshape(-1)
        data = memoryview(flat.view(torch.uint8).numpy()).cast("B") if flat.numel() else memoryview(b"")
        offset, nbytes = self._region_for(data)
        return self._add_entry(TensorEntry(DTYPE_NAMES[t.dtype], tuple(t.shape), tuple(t.stride()), offset, nbytes))

    def add_bytes(self, data: bytes, what: str = "bytes") -> int:
        """Stores a byte string as a uint8 tensor; returns its index."""
        return self.add(torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else
                        torch.empty(0, dtype=torch.uint8), what)

    def index_json(self) -> list[dict]:
        """The tensor index as JSON (one entry per stored tensor)."""
        return [{"dtype": e.dtype, "shape": list(e.shape), "strides": list(e.strides), "offset": e.offset,
                 "nbytes": e.nbytes} for e in self.entries]

    def blob(self) -> bytes:
        """All stored tensors' bytes, concatenated in index order."""
        return b"".join(self._chunks)


def _int_list(value, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value) or len(value) > 64:
        raise FormatError(f"{where}: {what} must be a list of at most 64 non-negative integers, got {value!r:.80}")
    return tuple(value)


class TensorTable:
    """The tensors of a file: validated when read, built (as views of one buffer) on first use."""

    def __init__(self, index, blob: bytearray, where: str):
        self.where = where
        self._blob = blob
        if not isinstance(index, list):
            raise FormatError(f"{where}: the tensor index must be a list of tensor entries")
        self.entries = [self._check(i, e) for i, e in enumerate(index)]
        self._built: dict[int, torch.Tensor] = {}

    def _check(self, i: int, e) -> TensorEntry:
        where = f"{self.where}: tensor {i}"
        if not isinstance(e, dict):
            raise FormatError(f"{where} is not an object")
        dtype = e.get("dtype")
        if not isinstance(dtype, str) or dtype not in DTYPES:  # (a list or dict from JSON is unhashable)
            raise FormatError(f"{where} has unknown dtype {dtype!r}")
        shape = _int_list(e.get("shape"), "shape", where)
        strides = _int_list(e.get("strides"), "strides", where)
        if len(strides) != len(shape):
            raise FormatError(f"{where}: {len(strides)} strides for {len(shape)} dimensions")
        offset, nbytes = e.get("offset"), e.get("nbytes")
        if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
            raise FormatError(f"{where}: offset and nbytes must be non-negative integers")
        itemsize = DTYPES[dtype].itemsize
        if math.prod(shape) * itemsize != nbytes:
            raise FormatError(f"{where}: shape {list(shape)} of {dtype} needs {math.prod(shape) * itemsize} bytes, "
                              f"the index says {nbytes}")
        if offset % itemsize:
            raise FormatError(f"{where}: offset {offset} is not a multiple of the {dtype} element size")
        if offset + nbytes > len(self._blob):
            raise FormatError(f"{where}: bytes {offset}..{offset + nbytes} lie past the end of tensors.bin "
                              f"({len(self._blob)} bytes)")
        return TensorEntry(dtype, shape, strides, offset, nbytes)

    def __len__(self) -> int:
        return len(self.entries)

    def check_index(self, index, what: str) -> int:
        """A tensor index an entry refers to, if the file has it; a FormatError naming the entry otherwise."""
        if type(index) is not int or not 0 <= index < len(self.entries):
            raise FormatError(f"{self.where}: {what} refers to tensor {index!r}, but the file has "
                              f"{len(self.entries)} tensors")
        return index

    def tensor(self, index, what: str = "a value") -> torch.Tensor:
        """Tensor `index`, a view of the file's buffer built on first use and cached."""
        index = self.check_index(index, what)
        cached = self._built.get(index)
        if cached is None:
            cached = self._built[index] = self._build(self.entries[index])
        return cached

    def raw_bytes(self, index, what: str) -> bytes:
        """The bytes of stored entry `index` (a byte string stored as a tensor)."""
        e = self.entries[self.check_index(index, what)]
        return bytes(self._blob[e.offset:e.offset + e.nbytes])

    def _build(self, e: TensorEntry) -> torch.Tensor:
        dtype = DTYPES[e.dtype]
        if e.nbytes == 0:
            return torch.empty(e.shape, dtype=dtype)
        flat = torch.frombuffer(self._blob, dtype=torch.uint8, count=e.nbytes, offset=e.offset)
        t = flat.view(dtype).reshape(e.shape)
        if e.strides != _contiguous_strides(e.shape) and _is_dense(e.shape, e.strides):
            strided = torch.empty_strided(e.shape, e.strides, dtype=dtype)
            strided.copy_(t)
            t = strided
        return t


# -- plain values ---------------------------------------------------------------------------------------


def encode_value(value, store: TensorStore, what: str = "value"):
    """A Python value (tensors, numbers, str, None, and lists/tuples/dicts of them) as JSON."""
    if isinstance(value, torch.Tensor):
        return {"tensor": store.add(value, what)}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, np.ndarray):
        return {"tensor": store.add(torch.from_numpy(np.ascontiguousarray(value)), what)}
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v, store, what) for v in value]}
    if isinstance(value, list):
        return {"list": [encode_value(v, store, what) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"{what}: only dicts with str keys can be recorded")
        return {"dict": [[k, encode_value(v, store, what)] for k, v in value.items()]}
    raise ValueError(f"{what}: a {type(value).__name__} cannot be recorded (tensors, numbers, str, None and "
                     "lists/tuples/dicts of them can)")


_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def decode_value(data, tensors: TensorTable, what: str, depth: int = 0):
    """A JSON value of the record with its tensor references resolved (nesting bounded, so a hostile file cannot
    recurse without end)."""
    if depth > _MAX_DEPTH:
        raise FormatError(f"{tensors.where}: {what} is nested more than {_MAX_DEPTH} levels deep")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, dict) and len(data) == 1:
        (tag, inner), = data.items()
        if tag == "tensor":
            return tensors.tensor(inner, what)
        if tag == "float" and isinstance(inner, str) and inner in _NON_FINITE:
            return _NON_FINITE[inner]
        if tag in ("tuple", "list") and isinstance(inner, list):
            items = [decode_value(v, tensors, what, depth + 1) for v in inner]
            return tuple(items) if tag == "tuple" else items
        if tag == "dict" and isinstance(inner, list) and all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in inner):
            return {k: decode_value(v, tensors, what, depth + 1) for k, v in inner}
    raise FormatError(f"{tensors.where}: {what} holds a value etlab does not know: {str(data)[:80]}")
