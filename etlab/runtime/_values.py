"""The value table of a loaded method: one live Python object per EValue of the plan.

Tensors are built once at load time and keep their identity for the life of the method, so
kernels can be bound to the tensor objects themselves: planned tensors are views into the
method's arenas, constants are views of the program's data, unplanned tensors (inputs the plan
leaves to the caller, views) are placeholders that get re-pointed with `Tensor.set_` at run time.
Scalars and lists are plain Python values. A slot whose content changes while the method runs
(a scalar written by a kernel, a scalar input, a move target) is *dynamic*: kernels read it
through a resolver instead of capturing it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from etlab import ops
from etlab.runtime._errors import LoadError
from etlab.runtime._memory import Arenas, check_dim_order, data_tensor, fixed_empty, nbytes_of, planned_tensor
from etlab.schema import program as P
from etlab.schema.scalar_type import scalar_type_to_dtype

# EValue kinds, by the schema class name of EValue.val.
TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, INT_LIST = "Tensor", "TensorList", "OptionalTensorList", "IntList"
SCALAR_KINDS = {"Null", "Int", "Bool", "Double", "String"}


@dataclass
class DataSources:
    """The bytes a program's tensors can point at: constants, mutable-buffer initial data, named data."""

    pte: P.PteFile
    named: dict[str, Any] = field(default_factory=dict)  # key -> bytes (external .ptd entries and in-file named data)
    what: str = "program"

    def constant(self, index: int, nbytes: int, what: str) -> tuple[Any, int]:
        """The buffer and offset of constant `index` (constant segment or inline buffers); a LoadError naming the
        tensor when it does not exist."""
        prog = self.pte.program
        seg = prog.constant_segment
        if seg is not None and seg.offsets:
            if index >= len(seg.offsets):
                raise LoadError(f"{what}: constant buffer {index} does not exist (the constant segment has "
                                f"{len(seg.offsets)} entries)")
            return self._segment(seg.segment_index, what), seg.offsets[index]
        buffers = prog.constant_buffer or []
        if index >= len(buffers):
            raise LoadError(f"{what}: constant buffer {index} does not exist ({len(buffers)} inline buffers)")
        return buffers[index].storage or b"", 0

    def mutable_initial(self, segment_idx: int, index: int, what: str) -> tuple[Any, int]:
        """The buffer and offset of a mutable buffer's initial data; a LoadError when the segment or entry does not
        exist."""
        segs = self.pte.program.mutable_data_segments or []
        if segment_idx >= len(segs) or index >= len(segs[segment_idx].offsets or ()):
            raise LoadError(f"{what}: initial data {index} of mutable data segment {segment_idx} does not exist")
        seg = segs[segment_idx]
        return self._segment(seg.segment_index, what), seg.offsets[index]

    def external(self, key: str, what: str):
        """The data of an external tensor by key, from the .ptd files given; a LoadError names the key and suggests
        data_files=[...]."""
        if key not in self.named:
            known = ", ".join(sorted(self.named)[:5]) or "none"
            raise LoadError(f"{what}: external tensor {key!r} is in none of the data files given "
                            f"(pass the .ptd with data_files=[...]; keys found: {known})")
        return self.named[key]

    def _segment(self, index: int, what: str):
        if index >= len(self.pte.segments):
            raise LoadError(f"{what}: data segment {index} does not exist ({len(self.pte.segments)} segments)")
        return self.pte.segments[index]


def scalar_value(val) -> Any:
    """The Python value of a scalar EValue (None, int, bool, float or str)."""
    kind = type(val).__name__
    if val is None or kind == "Null":
        return None
    return {"Int": lambda v: v.int_val, "Bool": lambda v: v.bool_val, "Double": lambda v: v.double_val,
            "String": lambda v: v.string_val}[kind](val)


@dataclass
class ValueTable:
    """Live values of one method plus what the binder needs to know about each slot."""

    method: str
    values: list
    kinds: list[str]
    specs: list  # the schema value (P.Tensor, P.Int, ...) per slot
    planned: set[int] = field(default_factory=set)
    constant: set[int] = field(default_factory=set)
    mutable_initialized: set[int] = field(default_factory=set)
    dynamic: set[int] = field(default_factory=set)   # content changes while running
    rebound: set[int] = field(default_factory=set)   # tensor re-pointed (set_) while running
    list_members: dict[int, list[int]] = field(default_factory=dict)  # IntList / TensorList slot -> member slots
    # What one execute may use (`Runtime.load_program(memory_budget=...)`, None: no budget) and the
    # method's planned arena bytes, which count against it (`_kernel_args`).
    memory_budget: int | None = None
    planned_bytes: int = 0
    # Layout copies of constant data computed at load (`_direct_kernels`), by what they compute: the same
    # copy written once per use (Edge emits a `permute_copy` of a recurrent weight at every time step)
    # shares one result.
    folded: dict = field(default_factory=dict)

    def slot_name(self, slot: int) -> str:
        """How error messages name a slot: its index and kind."""
        return f"value {slot} ({self.kinds[slot]})"

    def check_slot(self, slot: int, what: str) -> None:
        """A LoadError naming `what` when an instruction refers to a slot the method does not have."""
        if not 0 <= slot < len(self.values):
            raise LoadError(f"{what}: refers to value {slot}, but the method has {len(self.values)} values")

    def resolver(self, slot: int) -> Callable[[], Any] | None:
        """None when values[slot] can be captured at bind time, else a zero-argument getter."""
        if slot in self.dynamic:
            return functools.partial(self.values.__getitem__, slot)
        members = self.list_members.get(slot)
        if members is not None and any(m in self.dynamic for m in members):
            values = self.values
            if self.kinds[slot] == OPT_TENSOR_LIST:
                return lambda: [None if m < 0 else values[m] for m in members]
            return lambda: [values[m] for m in members]
        return None

    def is_static_shape(self, slot: int) -> bool:
        """Whether the slot holds a tensor whose shape never changes (kernels may then skip resizing it)."""
        spec = self.specs[slot]
        return (self.kinds[slot] == TENSOR and slot not in self.rebound
                and spec.shape_dynamism == P.TensorShapeDynamism.STATIC)


def _tensor(spec: P.Tensor, slot: int, arenas: Arenas, data: DataSources, table: ValueTable, what: str):
    where = f"{what}: value {slot}"
    try:
        dtype = scalar_type_to_dtype(spec.scalar_type)
    except ValueError as e:
        raise LoadError(f"{where}: {e}") from None
    problem = ops.storage_dtype_problem(dtype)
    if problem is not None:
        raise LoadError(f"{where}: {problem}")
    sizes = list(spec.sizes or [])
    dim_order = list(spec.dim_order or [])
    check_dim_order(sizes, dim_order, where)
    extra = spec.extra_tensor_info
    if spec.allocation_info is not None:
        info = spec.allocation_info
        t = planned_tensor(arenas, info.memory_id, info.memory_offset, sizes, dim_order, dtype, where)
        table.planned.add(slot)
        if spec.data_buffer_idx:
            # A mutable buffer with an initial state: copy it into the planned memory once.
            seg_idx = extra.mutable_data_segments_idx if extra else 0
            if data.pte.program.mutable_data_segments:
                buf, off = data.mutable_initial(seg_idx, spec.data_buffer_idx, where)
            else:
                buf, off = data.constant(spec.data_buffer_idx, nbytes_of(sizes, dtype), where)
            t.copy_(data_tensor(buf, off, sizes, dim_order, dtype, where))
            table.mutable_initialized.add(slot)
        return t
    if extra is not None and extra.location == P.TensorDataLocation.EXTERNAL:
        if not extra.fully_qualified_name:
            raise LoadError(f"{where}: external tensor without a fully_qualified_name")
        t = data_tensor(data.external(extra.fully_qualified_name, where), 0, sizes, dim_order, dtype, where)
        table.constant.add(slot)
        return t
    if spec.data_buffer_idx:
        buf, off = data.constant(spec.data_buffer_idx, nbytes_of(sizes, dtype), where)
        table.constant.add(slot)
        return data_tensor(buf, off, sizes, dim_order, dtype, where)
    # Unplanned: memory comes from the caller (inputs) or from another tensor (views) at run time.
    table.rebound.add(slot)
    return fixed_empty(dtype)


def build_value_table(plan: P.ExecutionPlan, arenas: Arenas, data: DataSources, what: str) -> ValueTable:
    """Every value of a method materialized: planned tensors as views of the arenas, constants from their segments,
    scalars and lists; errors name the value."""
    evalues = plan.values or []
    table = ValueTable(method=plan.name or "?", values=[None] * len(evalues), kinds=["Null"] * len(evalues),
                       specs=[None] * len(evalues))
    lists = []
    for i, ev in enumerate(evalues):
        val = ev.val
        kind = "Null" if val is None else type(val).__name__
        table.kinds[i], table.specs[i] = kind, val
        if kind in SCALAR_KINDS:
            table.values[i] = scalar_value(val)
        elif kind == TENSOR:
            table.values[i] = _tensor(val, i, arenas, data, table, what)
        elif kind in ("DoubleList", "BoolList"):
            table.values[i] = list(val.items or [])
        else:  # IntList, TensorList, OptionalTensorList hold value indices; resolved once all slots exist
            lists.append(i)
    for i in lists:
        members = list(table.specs[i].items or [])
        kind = table.kinds[i]
        for m in members:
            if kind == OPT_TENSOR_LIST and m == -1:
                continue
            table.check_slot(m, f"{what}: {kind} value {i}")
            want = {INT_LIST: ("Int",), TENSOR_LIST: (TENSOR,), OPT_TENSOR_LIST: (TENSOR, "Null")}[kind]
            if table.kinds[m] not in want:
                raise LoadError(f"{what}: {kind} value {i} lists value {m}, a {table.kinds[m]} (expected {want[0]})")
        table.list_members[i] = members
        table.values[i] = [None if m < 0 else table.values[m] for m in members]
    return table
