"""Program-wide data shared by all methods: constant tensors (segment or .ptd) and delegate blobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from etlab.compiler._tensor_spec import TensorSpec, align
from etlab.schema import dtype_to_scalar_type
from etlab.schema import flat_tensor as FT
from etlab.schema import program as P

DEFAULT_EXTERNAL_FILE = "_default_external_constant"  # upstream's name for the .ptd of external constants


@dataclass
class ConstantValue:
    """Where a constant tensor's data went: its index in the program's constant buffers, or (with `external_name`)
    its entry in a .ptd."""

    buffer_index: int
    external_name: str | None = None


def tensor_bytes(t: torch.Tensor, dim_order: tuple[int, ...] | list[int]) -> memoryview:
    """A tensor's contents laid out in `dim_order` (contiguous when the order is 0..n-1)."""
    t = t.detach()
    if list(dim_order) != sorted(dim_order):
        t = t.permute(*dim_order)
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return memoryview(t.view(torch.uint8).numpy())


@dataclass
class ConstantStore:
    """Deduplicated constants. Buffer index 0 is reserved (the empty buffer); data_buffer_idx >= 1."""

    alignment: int = 16
    external: bool | Callable[[TensorSpec], bool] = False
    buffers: list[memoryview] = field(default_factory=list)
    external_data: dict[str, tuple[memoryview, FT.TensorLayout]] = field(default_factory=dict)
    _index: dict[tuple, ConstantValue] = field(default_factory=dict)

    def _is_external(self, spec: TensorSpec) -> bool:
        if callable(self.external):
            return bool(self.external(spec))
        return bool(self.external) and spec.fqn is not None

    def lookup(self, spec: TensorSpec) -> ConstantValue:
        """The placement of a constant's data, adding it on first sight: tensors viewing the same storage, shape,
        strides, dtype and dim order share one buffer, so tied weights are stored once."""
        t = spec.data
        if t is None:
            raise ValueError(f"constant {spec.name} has no data")
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
               tuple(spec.dim_order), self._is_external(spec))
        value = self._index.get(key)
        if value is not None:
            return value
        data = tensor_bytes(t, spec.dim_order)
        if self._is_external(spec):
            name = spec.fqn or spec.name
            layout = FT.TensorLayout(scalar_type=FT.ScalarType(int(dtype_to_scalar_type(t.dtype))),
                                     sizes=list(spec.shape), dim_order=list(spec.dim_order))
            self.external_data[name] = (data, layout)
            value = ConstantValue(len(self.external_data) - 1, external_name=name)
        else:
            self.buffers.append(data)
            value = ConstantValue(len(self.buffers))
        self._index[key] = value
        return value

    def segment(self) -> tuple[P.Pieces | None, list[int]]:
        """The constant segment (its tensors and padding, copied into the file once by serialize_pte) and its offsets
        table ([0] for the reserved buffer, then one per buffer)."""
        offsets, end = [0], 0
        for data in self.buffers:
            off = align(end, self.alignment)
            offsets.append(off)
            end = off + data.nbytes
        if not self.buffers:
            return None, offsets
        parts, pos = [], 0
        for off, data in zip(offsets[1:], self.buffers):
            parts += [bytes(off - pos), data]
            pos = off + data.nbytes
        return P.Pieces(tuple(parts), end), offsets


@dataclass
class DelegateStore:
    """Delegate payloads, deduplicated by content."""

    blobs: list[bytes] = field(default_factory=list)
    _index: dict[bytes, int] = field(default_factory=dict)

    def add(self, data: bytes) -> int:
        """The index of a delegate payload, storing it unless identical bytes are there already (two identical
        partitions share one blob)."""
        data = bytes(data)
        if data not in self._index:
            self._index[data] = len(self.blobs)
            self.blobs.append(data)
        return self._index[data]
