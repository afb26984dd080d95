"""Which values each instruction of a `.pte` method reads and writes, and which instruction (or method
input) produced each value it reads: the data flow the instruction graph draws, from the file alone.

The emitter's convention (etlab's and upstream's alike) makes it exact for kernel calls: a kernel
call's last argument is its result (the out tensor; the scalar of a symbolic op; for a multi-output
op such as `native_batch_norm.out` or `split_with_sizes_copy.out`, a tensor list of its outputs),
and its out arguments also appear before it; every other argument is read. A delegate call names
its inputs, then its outputs, and the file does not say where one ends: see `_delegate_writes`.
A MoveCall (the end of a `cond` branch) passes its source's producers on to its target; a
JumpFalseCall reads its condition.

Values no instruction writes are method inputs, constants, state (mutable buffers, kept from the
previous run) or static views: a view shares its base's memory and has no instruction of its own
(etlab's emitter elides it), so a read of one is traced to the last instruction that wrote a value
starting at its bytes, which the memory plan guarantees is its base's producer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etlab.facts.pte_memory import members, tensor_bytes
from etlab.schema.program import (
    DelegateCall,
    Instruction,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    Tensor,
    TensorList,
)

# A producer: ("input", value index) for a method input, ("step", instruction position) otherwise.
Source = tuple[str, int]


def _expand(values, idxs) -> list[int]:
    """Values and list members, each once, in order."""
    return list(dict.fromkeys(m for i in idxs for m in members(values, i)))


@dataclass
class Flow:
    """One instruction's data flow: values it reads and writes (lists expanded) and, per value read,
    where it came from (none for constants, state and literals)."""

    step: int
    instruction: Instruction
    reads: list[int] = field(default_factory=list)
    writes: list[int] = field(default_factory=list)
    sources: dict[int, list[Source]] = field(default_factory=dict)


class _Tracker:
    """Producers by value, and the writes to each arena in order (for views: see the module doc)."""

    def __init__(self, values, inputs: list[int], constants: set[int]):
        self.values = values
        self.constants = constants
        self.by_value: dict[int, list[Source]] = {}
        # (mem id, start) -> the latest write there: (start, end, step, source, value). A view starts where
        # its base does (a reshape of the whole), so an exact start finds it in O(1) whatever the plan.
        self.writes: dict[tuple[int, int], tuple[int, int, int, Source, int]] = {}
        self.view_reads: dict[int, list[int]] = {}  # value -> steps that read it through a view
        for i in inputs:
            self.write(i, ("input", i), -1)

    def storage(self, idx: int) -> tuple[int, int, int] | None:
        """(memory id, start, end) of a planned, non-empty tensor value."""
        t = self.values[idx].val if 0 <= idx < len(self.values) else None
        if not isinstance(t, Tensor) or t.allocation_info is None:
            return None
        info = t.allocation_info
        start = int(info.memory_offset_low) + (int(info.memory_offset_high) << 32)
        size = tensor_bytes(t)
        return (int(info.memory_id), start, start + size) if size > 0 else None

    def write(self, idx: int, src: Source, step: int) -> None:
        self.by_value[idx] = [src]
        where = self.storage(idx)
        if where is not None:
            self.writes[where[:2]] = (where[1], where[2], step, src, idx)

    def last_write(self, idx: int) -> tuple[int, int, int, Source, int] | None:
        """The latest write of a value starting at this value's bytes: (start, end, step, source, value),
        or None."""
        where = self.storage(idx)
        if where is None:
            return None
        w = self.writes.get(where[:2])
        return w if w is not None and w[0] < where[2] and where[1] < w[1] else None

    def sources(self, idx: int, step: int, note_view: bool = True) -> list[Source]:
        if idx in self.by_value:
            return self.by_value[idx]
        if idx in self.constants:
            return []
        w = self.last_write(idx)  # a view of what was written there, or state nothing wrote yet
        if w is None:
            return []
        if note_view:
            self.view_reads.setdefault(w[4], []).append(step)
        return [w[3]]


def _constants(values) -> set[int]:
    """Tensor values with data in the program and no planned memory (weights, folded constants)."""
    return {i for i, ev in enumerate(values) if isinstance(ev.val, Tensor) and ev.val.allocation_info is None
            and ev.val.data_buffer_idx > 0}


def _uses(values, instructions) -> dict[int, list[int]]:
    """Value -> positions of the instructions that name it (lists expanded)."""
    uses: dict[int, list[int]] = {}
    for step, ins in enumerate(instructions):
        a = ins.instr_args
        args = list(a.args or ()) if isinstance(a, (KernelCall, DelegateCall)) else []
        for v in _expand(values, [int(x) for x in args]):
            uses.setdefault(v, []).append(step)
    return uses


def _delegate_writes(args: list[int], step: int, tracker: _Tracker, uses: dict[int, list[int]],
                     inputs: set[int], unread_is_live: bool) -> list[int]:
    """A delegate call's outputs: its trailing arguments (at least the last) that are fresh.

    An argument is not fresh when it is a constant, a method input, something an earlier instruction
    wrote, or a view of a live value: its bytes are exactly those of the value last written there, and
    that value is read (directly or through a view) at this step or later, or (`unread_is_live`) never
    read at all but through views delegates read. A fresh output reusing the bytes of a value whose last
    read came before this step is neither."""
    def fresh(v: int) -> bool:
        val = tracker.values[v].val if 0 <= v < len(tracker.values) else None
        if not isinstance(val, (Tensor, TensorList)) or v in inputs or v in tracker.constants or v in tracker.by_value:
            return False
        w, where = tracker.last_write(v), tracker.storage(v)
        if w is None or where is None or (w[0], w[1]) != where[1:]:
            return True
        written_at, base = w[2], w[4]
        later = [s for s in uses.get(base, ()) if s > written_at]
        return all(s < step for s in later) and (bool(later) or not unread_is_live)

    n = 1
    while n < len(args) and fresh(args[-n - 1]):
        n += 1
    return args[-n:] if args else []


@dataclass
class MethodFlow:
    """A method's data flow: one `Flow` per instruction in chain order, and the producers of each output."""

    steps: list[Flow]
    outputs: dict[int, list[Source]]


def _move(tracker: _Tracker, flow: Flow, src: int, dst: int, step: int) -> None:
    """Both branches of a cond move into the same value: its readers depend on either branch's producer."""
    flow.reads = [src]
    flow.sources = {src: tracker.sources(src, step)}
    have = tracker.by_value.get(dst, [])
    tracker.by_value[dst] = have + [s for s in flow.sources[src] if s not in have]


def _run(plan, uses: dict[int, list[int]], unread_is_live: bool) -> tuple[MethodFlow, dict[int, list[int]]]:
    """One pass over the instructions; also returns, per value, the steps of kernels that read it through
    a view."""
    values = plan.values or ()
    instructions = [ins for chain in plan.chains or () for ins in chain.instructions or ()]
    inputs = [int(i) for i in plan.inputs or () if 0 <= int(i) < len(values)]
    tracker = _Tracker(values, inputs, _constants(values))
    flows = []
    for step, ins in enumerate(instructions):
        a = ins.instr_args
        flow = Flow(step, ins)
        flows.append(flow)
        if isinstance(a, MoveCall):
            _move(tracker, flow, int(a.move_from), int(a.move_to), step)
            continue
        if isinstance(a, KernelCall) and a.args:
            args = [int(x) for x in a.args]
            flow.writes = _expand(values, args[-1:])
            flow.reads = [v for v in _expand(values, args[:-1]) if v not in flow.writes]
        elif isinstance(a, DelegateCall) and a.args:
            args = [int(x) for x in a.args]
            out = _delegate_writes(args, step, tracker, uses, set(inputs), unread_is_live)
            flow.writes = _expand(values, out)
            flow.reads = [v for v in _expand(values, args[:len(args) - len(out)]) if v not in flow.writes]
        elif isinstance(a, JumpFalseCall):
            flow.reads = [int(a.cond_value_index)]
        delegate = isinstance(a, DelegateCall)  # its reads of views are what is being guessed
        flow.sources = {r: tracker.sources(r, step, note_view=not delegate) for r in flow.reads}
        for w in flow.writes:
            tracker.write(w, ("step", step), step)
    end = len(instructions)
    outputs = {int(o): tracker.sources(int(o), end) for o in plan.outputs or () if 0 <= int(o) < len(values)}
    return MethodFlow(flows, outputs), tracker.view_reads


def instruction_flow(plan) -> MethodFlow:
    """The data flow of every instruction of a method (see the module doc). Two passes: the first takes
    a delegate argument over the bytes of a value nothing reads as an output and notes which values
    kernels read through views; the second, knowing those reads, takes a value still unread as one
    only delegates read through views (`_delegate_writes`)."""
    values = plan.values or ()
    instructions = [ins for chain in plan.chains or () for ins in chain.instructions or ()]
    uses = _uses(values, instructions)
    for v in plan.outputs or ():  # read after the last instruction
        uses.setdefault(int(v), []).append(len(instructions))
    if not any(isinstance(ins.instr_args, DelegateCall) for ins in instructions):
        return _run(plan, uses, unread_is_live=True)[0]
    _, view_reads = _run(plan, uses, unread_is_live=False)
    for v, steps in view_reads.items():
        uses.setdefault(v, []).extend(steps)
    return _run(plan, uses, unread_is_live=True)[0]
