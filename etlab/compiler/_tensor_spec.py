"""TensorSpec: what the memory planner and the emitter know about one tensor value of a method."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from etlab.compiler._shapes import dim_order_of, upper_bound

ALIGNMENT = 16  # every planned tensor starts on a 16-byte boundary


def align(n: int, alignment: int = ALIGNMENT) -> int:
    """`n` rounded up to a multiple of `alignment` (the planner's and emitter's byte alignment).

    >>> align(1), align(16), align(17, 8)
    (16, 16, 24)
    """
    return (n + alignment - 1) // alignment * alignment


@dataclass(eq=False)
class TensorSpec:
    """One tensor value. Shapes are upper bounds (symbolic dims evaluated from export's ranges).

    `mem_id`/`mem_offset` are set by memory planning (mem_id None: not planned, e.g. constants and
    unplanned inputs). `storage` points at the spec whose memory this one shares (views, control-flow
    outputs); lifetimes are [first step, last step] in emission order.
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    dim_order: tuple[int, ...]
    dynamic: bool = False
    const: bool = False
    name: str = ""
    mem_id: int | None = 1
    mem_offset: int | None = None
    lifetime: list[int] = field(default_factory=lambda: [-1, -1])
    storage: TensorSpec | None = None
    requires_grad: bool = False
    data: torch.Tensor | None = field(default=None, repr=False)  # constant contents
    fqn: str | None = None  # constant's name in the module (parameter/buffer path)

    @property
    def numel(self) -> int:
        """The element count of the shape (its upper bound when the shape is dynamic)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes the tensor's data takes (numel times the dtype's size), before alignment."""
        return self.numel * self.dtype.itemsize

    @property
    def allocated_memory(self) -> int:
        """The bytes memory planning reserves for the tensor: `nbytes` rounded up to the planner's alignment."""
        return align(self.nbytes)

    def root(self) -> TensorSpec:
        """The spec that owns the storage this one views (itself when it owns its own)."""
        spec = self
        while spec.storage is not None:
            spec = spec.storage
        return spec

    def __repr__(self) -> str:
        where = f"mem {self.mem_id}@{self.mem_offset}" if self.mem_offset is not None else "unplanned"
        return f"TensorSpec({self.name}: {self.dtype} {list(self.shape)}, life {self.lifetime}, {where})"


def spec_from_val(val: torch.Tensor, range_constraints: dict, name: str = "") -> TensorSpec:
    """The TensorSpec of a traced value (a node's meta['val']), symbolic dimensions replaced by the upper bound export's
    range constraints give; a ValueError naming the value when a dimension is unbounded, since memory planning needs
    a size."""
    shape, dynamic = [], False
    for s in val.shape:
        if isinstance(s, int):
            shape.append(s)
        else:
            dynamic = True
            bound = upper_bound(s, range_constraints)
            if bound is None:
                raise ValueError(f"{name}: dimension {s} has no upper bound")
            shape.append(bound)
    return TensorSpec(dtype=val.dtype, shape=tuple(shape), dim_order=tuple(dim_order_of(val)), dynamic=dynamic,
                      name=name, requires_grad=bool(getattr(val, "requires_grad", False)))
