"""Instructions whose every input is constant data, computed once at load instead of at every run.

Edge programs recompute input-independent values on each call: a causal attention mask (`full`, `arange`,
`sub`, `le`, `logical_and`, `scalar_tensor`, `where` on constants), the sampling grids of a bicubic or
bilinear resize (`arange`, casts, `add`, `mul`, `floor`, `clamp` of index tensors), position ids and their
embeddings. Eager pays those too, but fused into one kernel (scaled-dot-product attention, upsample) where a
portable program pays ~1 us per decomposed step. Computed at load, such an instruction becomes a step that
does nothing (as `_direct_kernels` already does for layout copies of weights): its result is moved into memory
of its own and counts as constant from then on, so the instructions reading only it fold in turn (the slot is
not added to the table's constants: `_direct_kernels` folds layout copies of those without the checks below).

Only what cannot change the results: an ATen out-variant (or a dim-order copy) with one tensor result and no
other argument written, not random, every argument fixed at load (no value that changes while running), every
tensor input constant, static shapes, the result written by this instruction alone in the whole plan and not a
method input or output, at most `MAX_FOLDED_BYTES`. A kernel that fails at load is left to run (and fail) as
before. Results are the same bits: the same kernel computed them, once.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field

import torch

from etlab.runtime._direct_kernels import folded_at_load
from etlab.runtime._registry import KernelEntry, Step, operator_key
from etlab.runtime._values import TENSOR, ValueTable
from etlab.schema import program as P

enabled = True
"""Whether methods loaded from now on fold constant instructions (tests turn it off to compare)."""

MAX_FOLDED_BYTES = 8 << 20  # a folded result lives outside the planned arena, for the method's life

# Operators whose result is not a function of their arguments (random draws, uninitialized memory).
_IMPURE = re.compile(r"rand|normal|uniform|bernoulli|dropout|multinomial|exponential|cauchy|geometric|"
                     r"poisson|empty|_local_scalar")
# Pure operators outside ATen's namespace that programs use on constant data (casts of index tensors).
_PURE_EXTRA = frozenset({"dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out"})


@functools.cache
def _schema(name: str):
    from etlab.runtime._torch_kernels import _resolve

    op = _resolve(name)
    return getattr(op, "_schema", None)


def _written(name: str, slots: list[int]) -> list[int] | None:
    """The argument slots a kernel call may write (None: unknown, so any of them)."""
    schema = _schema(name)
    if schema is None:
        return None
    n = len(schema.arguments)
    out = [s for p, s in zip(schema.arguments, slots) if p.alias_info is not None and p.alias_info.is_write]
    return out + slots[n:]


@dataclass
class Writers:
    """What folding must know of the whole plan before it moves any result out of the arena."""

    count: Counter  # slot -> instructions that may write it
    position: dict[tuple[int, int], int]  # (chain, instruction) -> its place in plan order
    writes: list[list[tuple[int, int]]]  # per instruction in plan order: the planned bytes [lo, hi) it writes
    aliases: list[tuple[int, int, list[int], int]]  # planned tensors no instruction writes: bytes, reads, slot
    folded: set[int] = field(default_factory=set)  # results computed at load: constant from then on


def _members(table: ValueTable, slot: int) -> list[int]:
    if not 0 <= slot < len(table.kinds):
        return []
    return [slot, *(m for m in table.list_members.get(slot, []) if m >= 0)]


def plan_writers(plan: P.ExecutionPlan, table: ValueTable, kernels: dict[str, KernelEntry]) -> Writers:
    """How many instructions of the plan may write each slot (list members counted as their list); the
    method's inputs and outputs, and the sources of views (`et_view` points its result into its source's
    memory when the method loads, before this pass moves anything), count as written twice: never folded.
    Also the planned tensors no instruction writes and where they are read: the emitter turns a static
    `view_copy` into a tensor sharing its source's memory and no instruction, so a folded result such a tensor
    reads while it holds that result takes the view along (`_views_of`). A plan with jumps folds nothing: plan
    order is then not the order instructions run in."""
    ops = plan.operators or []
    writers: Counter = Counter()
    reads: dict[int, list[int]] = {}
    position: dict[tuple[int, int], int] = {}
    written_at: list[list[int]] = []
    jumps = False
    for c, chain in enumerate(plan.chains or []):
        for i, instr in enumerate(chain.instructions or []):
            position[(c, i)] = k = len(written_at)
            args = instr.instr_args
            wrote: list[int] = []
            if isinstance(args, P.KernelCall):
                slots = list(args.args or [])
                op = ops[args.op_index] if 0 <= args.op_index < len(ops) else None
                name = operator_key(op.name or "", op.overload) if op is not None else ""
                entry = kernels.get(name)
                if entry is not None and entry.rebinds is not None and slots:
                    writers.update(_members(table, slots[0]) * 2)
                written = _written(name, slots) if entry is not None and _pure(entry) else None
                wrote = list(dict.fromkeys(slots if written is None else written))  # out is also the result
                for s in slots:
                    for m in _members(table, s):
                        reads.setdefault(m, []).append(k)
            elif isinstance(args, P.DelegateCall):
                wrote = list(args.args or [])
                for s in wrote:
                    for m in _members(table, s):
                        reads.setdefault(m, []).append(k)
            elif isinstance(args, P.MoveCall):
                writers.update(_members(table, args.move_from) * 2)
                wrote = [args.move_to]
            elif isinstance(args, P.FreeCall):
                wrote = [args.value_index]
            elif isinstance(args, P.JumpFalseCall):
                jumps = True
            members = [m for s in wrote for m in _members(table, s)]
            writers.update(members)
            written_at.append([m for m in members if m in table.planned and table.kinds[m] == TENSOR])
    for s in [*(plan.inputs or []), *(plan.outputs or [])]:
        writers.update(_members(table, s) * 2)
    if jumps:
        writers.update({s: 2 for s in range(len(table.kinds))})
    writes = [[_byte_range(table.values[m]) for m in slots if table.values[m].numel() > 0] for slots in written_at]
    aliases = [(*_byte_range(table.values[s]), reads.get(s, []), s) for s in table.planned
               if writers.get(s, 0) == 0 and table.kinds[s] == TENSOR and table.values[s].numel() > 0]
    return Writers(writers, position, writes, aliases)


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    lo = t.data_ptr()
    return lo, lo + (last + 1) * t.element_size()


def _views_of(writers: Writers, table: ValueTable, at: int, lo: int, hi: int) -> list[int] | None:
    """The views with no instruction of their own (slots) that read bytes [lo, hi) while the result written
    there by instruction `at` still holds them (until the next instruction writing any of those bytes): they
    move with a folded result. None when one cannot: it also reads those bytes at another time (holding
    another value then), or it reaches outside them, or its shape may change."""
    end = len(writers.writes)
    for k in range(at + 1, len(writers.writes)):
        if any(a < hi and lo < b for a, b in writers.writes[k]):
            end = k
            break
    views = []
    for a, b, read_at, slot in writers.aliases:
        if not (a < hi and lo < b and any(at < r <= end for r in read_at)):
            continue
        if (a < lo or b > hi or not all(at < r <= end for r in read_at) or slot in table.dynamic
                or slot in table.rebound or not table.is_static_shape(slot)
                or (a - lo) % table.values[slot].element_size()):
            return None
        views.append(slot)
    return views


def _move(out: torch.Tensor, views: list[torch.Tensor]) -> None:
    """Moves a folded result into memory of its own, and the views reading it to the same place in that memory."""
    lo = _byte_range(out)[0]
    offsets = [_byte_range(v)[0] - lo for v in views]
    out.set_(out.clone(memory_format=torch.preserve_format))
    storage, base = out.untyped_storage(), out.storage_offset() * out.element_size()
    for v, offset in zip(views, offsets):
        v.set_(storage, (base + offset) // v.element_size(), v.shape, v.stride())


def _pure(entry: KernelEntry) -> bool:
    if entry.name in _PURE_EXTRA:
        return True
    return entry.origin == "torch" and entry.name.startswith("aten::") and not _IMPURE.search(entry.name)


def fold_if_constant(entry: KernelEntry, table: ValueTable, slots: list[int], step: Step, writers: Writers,
                     where: tuple[int, int]) -> Step:
    """`folded_at_load` (the result computed now) for a constant instruction, else `step` unchanged."""
    if not enabled or not slots or not _pure(entry):
        return step
    if step is folded_at_load:  # a layout copy of constant data `_direct_kernels` computed: constant too
        if writers.count.get(slots[-1], 0) == 1:
            writers.folded.add(slots[-1])
        return step
    schema = _schema(entry.name)
    if schema is None or len(schema.returns) != 1 or len(slots) != len(schema.arguments) + 1:
        return step
    out_slot = slots[-1]
    written = _written(entry.name, slots)
    if written is None or set(written) != {out_slot} or writers.count.get(out_slot, 0) != 1:
        return step
    if (table.kinds[out_slot] != TENSOR or out_slot not in table.planned or out_slot in table.constant
            or out_slot in table.dynamic or out_slot in table.rebound or not table.is_static_shape(out_slot)):
        return step
    for s in slots[:-1]:
        if s == out_slot:  # the out argument
            continue
        if table.resolver(s) is not None:
            return step
        members = table.list_members.get(s) if table.kinds[s] != TENSOR else [s]
        for m in members or []:
            if m >= 0 and table.kinds[m] == TENSOR and m not in table.constant and m not in writers.folded:
                return step
    out = table.values[out_slot]
    if out.numel() * out.element_size() > MAX_FOLDED_BYTES:
        return step
    views = _views_of(writers, table, writers.position[where], *_byte_range(out))
    if views is None:
        return step
    try:
        with torch.no_grad():
            step()
    except Exception:
        return step  # it fails when it runs, as it would have
    _move(out, [table.values[v] for v in views])
    writers.folded.update([out_slot, *views])
    return folded_at_load
