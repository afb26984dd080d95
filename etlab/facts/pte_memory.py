"""The memory plan of a `.pte` method, from the verified file alone (no torch graph): each planned
tensor's arena, offset, bytes and the instruction steps it is live for.

A step is an instruction of the method (chains in order). A tensor is live from the first
instruction that names it (an argument, or a member of a list argument) to the last; method inputs
from step 0, outputs to the last step. The JupyterLab `.pte` viewer and `etlab report --pte` (the
Memory tab) both read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etlab.schema.program import DelegateCall, IntList, KernelCall, OptionalTensorList, Tensor, TensorList

# Element sizes by ScalarType value (upstream's scalar_type.fbs order); unknown types count 1 byte.
ELEMENT_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 12: 1, 13: 1,
                 14: 4, 15: 2, 16: 1, 17: 1, 22: 2, 23: 1, 24: 1, 25: 1, 26: 1, 27: 2, 28: 4, 29: 8}


@dataclass
class PlannedBlock:
    """One planned tensor of the memory plan: where it lives and the instruction steps it is live for."""

    value: int
    memory_id: int
    offset: int
    size: int
    first: int
    last: int
    shape: list[int] = field(default_factory=list)
    dtype: str = ""


def tensor_bytes(t: Tensor) -> int:
    """Bytes of a tensor value's storage (its declared sizes, upper bounds when dynamic, times the element size)."""
    n = 1
    for s in t.sizes or ():
        n *= max(int(s), 0)
    return n * ELEMENT_BYTES.get(int(t.scalar_type), 1)


def dtype_name(t: Tensor) -> str:
    """"float", "long", ... : the tensor's ScalarType name in lower case."""
    st = t.scalar_type
    return getattr(st, "name", str(st)).lower()


def members(values, idx: int) -> list[int]:
    """A value and, for a list (tensors, optional tensors, ints: a cat's inputs, a split's outputs, a
    shape of symbolic sizes), the values it lists; nothing for an index outside the value table."""
    if not 0 <= idx < len(values):
        return []
    v = values[idx].val
    if isinstance(v, (TensorList, OptionalTensorList, IntList)):
        return [idx, *(int(i) for i in v.items or () if 0 <= int(i) < len(values))]
    return [idx]


def call_args(args) -> list[int]:
    """The value indices a kernel or delegate call names (nothing for other instructions)."""
    return [int(a) for a in (args.args or ())] if isinstance(args, (KernelCall, DelegateCall)) else []


def instructions(plan) -> list:
    """The method's instructions, chains in order: step i is the i-th."""
    return [ins for chain in plan.chains or () for ins in chain.instructions or ()]


def memory_plan(plan) -> list[PlannedBlock]:
    """Planned (non-constant) tensors of one method with the first and last instruction step that
    touches them; method inputs are live from step 0, outputs to the last step."""
    values = plan.values or ()
    steps = instructions(plan)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for step, ins in enumerate(steps):
        for a in {m for arg in call_args(ins.instr_args) for m in members(values, arg)}:
            first.setdefault(a, step)
            last[a] = step
    end = max(len(steps) - 1, 0)
    for a in plan.inputs or ():
        first[int(a)] = 0
    for a in plan.outputs or ():
        last[int(a)] = end
    blocks = []
    for idx, ev in enumerate(values):
        t = ev.val
        if not isinstance(t, Tensor) or t.allocation_info is None or idx not in first:
            continue
        info = t.allocation_info
        blocks.append(PlannedBlock(idx, int(info.memory_id), int(info.memory_offset_low) +
                                   (int(info.memory_offset_high) << 32), tensor_bytes(t), first[idx],
                                   last.get(idx, first[idx]), [int(s) for s in t.sizes or ()], dtype_name(t)))
    return blocks
