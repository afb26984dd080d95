"""Method metadata: what a method takes and returns, read from its plan without loading it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from etlab.runtime._memory import element_size
from etlab.schema import program as P
from etlab.schema.scalar_type import scalar_type_to_dtype


@dataclass(frozen=True)
class TensorInfo:
    """A tensor input or output: its (upper-bound) sizes, dtype, layout and dynamism."""

    sizes: tuple[int, ...]
    dtype: torch.dtype
    scalar_type: int
    dim_order: tuple[int, ...]
    dynamism: P.TensorShapeDynamism
    nbytes: int
    is_memory_planned: bool

    @property
    def is_dynamic(self) -> bool:
        """Whether the tensor's shape may change between calls (bounded or unbounded dynamism)."""
        return self.dynamism != P.TensorShapeDynamism.STATIC

    def describe(self) -> str:
        """'float32 [2, 3]' (sizes of a dynamic tensor are upper bounds: 'float32 <=[8, 3]'), for messages."""
        bound = "<=" if self.is_dynamic else ""
        return f"{str(self.dtype).replace('torch.', '')} {bound}{list(self.sizes)}"


@dataclass(frozen=True)
class ScalarInfo:
    """A non-tensor input or output: its kind ("Int", "Double", "Bool", "String", "Null")."""

    kind: str

    def describe(self) -> str:
        """The kind, for messages (as TensorInfo.describe)."""
        return self.kind


ValueInfo = TensorInfo | ScalarInfo


@dataclass(frozen=True)
class MethodMeta:
    """Inputs, outputs, planned memory and backends of one method (upstream's MethodMeta)."""

    name: str
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    memory_planned_buffer_sizes: tuple[int, ...]
    backends: tuple[str, ...] = field(default_factory=tuple)

    def num_inputs(self) -> int:
        """How many values `Method.execute` takes (tensors and scalars)."""
        return len(self.inputs)

    def num_outputs(self) -> int:
        """How many values `Method.execute` returns."""
        return len(self.outputs)

    def input_tensor_meta(self, index: int) -> TensorInfo:
        """Input `index` (IndexError out of range; ValueError naming its kind if it is not a tensor)."""
        return _tensor_at(self.inputs, index, "input", self.name)

    def output_tensor_meta(self, index: int) -> TensorInfo:
        """Output `index` (IndexError out of range; ValueError naming its kind if it is not a tensor)."""
        return _tensor_at(self.outputs, index, "output", self.name)

    def num_memory_planned_buffers(self) -> int:
        """How many planned arenas the method needs (memory ids 1.., upstream's count)."""
        return len(self.memory_planned_buffer_sizes)

    def memory_planned_buffer_size(self, index: int) -> int:
        """The size in bytes of planned arena `index` (of `num_memory_planned_buffers()`)."""
        return self.memory_planned_buffer_sizes[index]

    def uses_backend(self, name: str) -> bool:
        """Whether a delegate of the method runs on backend `name`."""
        return name in self.backends


def _tensor_at(infos, index: int, what: str, method: str) -> TensorInfo:
    if not 0 <= index < len(infos):
        raise IndexError(f"method {method!r} has {len(infos)} {what}s; index {index} is out of range")
    info = infos[index]
    if not isinstance(info, TensorInfo):
        raise ValueError(f"method {method!r} {what} {index} is a {info.kind}, not a tensor")
    return info


def value_info(plan: P.ExecutionPlan, slot: int) -> ValueInfo:
    """The metadata of one input or output slot of a method (a TensorInfo for tensors, the kind of scalar otherwise);
    an IndexError naming the method for a slot out of range."""
    values = plan.values or []
    if not 0 <= slot < len(values):
        raise IndexError(f"method {plan.name!r} refers to value {slot}, but has {len(values)} values")
    val = values[slot].val
    if not isinstance(val, P.Tensor):
        return ScalarInfo("Null" if val is None else type(val).__name__)
    dtype = scalar_type_to_dtype(val.scalar_type)
    sizes = tuple(val.sizes or ())
    return TensorInfo(
        sizes=sizes, dtype=dtype, scalar_type=int(val.scalar_type), dim_order=tuple(val.dim_order or ()),
        dynamism=val.shape_dynamism, nbytes=math.prod(sizes) * element_size(dtype),
        is_memory_planned=val.allocation_info is not None,
    )


def method_meta(plan: P.ExecutionPlan) -> MethodMeta:
    """A method's metadata (inputs, outputs, planned buffer sizes) read from its plan, without loading it."""
    return MethodMeta(
        name=plan.name or "",
        inputs=tuple(value_info(plan, s) for s in plan.inputs or ()),
        outputs=tuple(value_info(plan, s) for s in plan.outputs or ()),
        memory_planned_buffer_sizes=tuple((plan.non_const_buffer_sizes or [0])[1:]),
        backends=tuple(dict.fromkeys(d.id or "" for d in plan.delegates or ())),
    )
