"""Mutable state shared by the methods of one program: memory id 2 of a three-arena plan.

A program compiled with `share_mutable_buffers=True` (upstream's or etlab's compiler) plans every
mutable buffer once, in memory id 2, at the same offset in every method, and gives each method
`non_const_buffer_sizes == [0, activations, state]`. Upstream's runtime gives all methods of a
program one memory id 2 (its Python runtime shares every arena; its `Module` shares ids 1 and 2
with `share_memory_arenas`), so `decode` reads the cache `prefill` wrote. etlab shares exactly
that arena: the methods (and every load of them) of one Program whose plan has three arenas use
one `SharedRegion`; their other arenas stay their own.

The file is hostile until checked: before the region is allocated, every method that declares it
must agree about it — the same size, and each tensor placed in it either at exactly the bytes
another method gives a tensor there or at bytes no other method uses, a named buffer at the same
bytes, dtype and shape everywhere — or the load fails with a LoadError naming the methods.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from etlab.runtime._errors import LoadError
from etlab.runtime._memory import allocate_arenas, check_dim_order, nbytes_of
from etlab.schema import program as P
from etlab.schema.scalar_type import scalar_type_to_dtype

SHARED_MEM_ID = 2
SHARED_PLAN_ARENAS = 3  # [reserved, activations, shared state]


@dataclass(frozen=True)
class StateTensor:
    """One tensor a method places in the shared region."""

    method: str
    slot: int
    start: int
    end: int
    dtype: torch.dtype
    sizes: tuple[int, ...]
    fqn: str | None


@dataclass
class SharedRegion:
    """The one memory id 2 of a program's methods; `lock` is held while any of them runs, so methods
    sharing state run one at a time (each still serves one thread, as any Method)."""

    array: np.ndarray
    tensor: torch.Tensor
    lock: threading.Lock = field(default_factory=threading.Lock)


def declares_shared_state(plan: P.ExecutionPlan) -> bool:
    """Does this method use the shared-state layout ([0, activations, state])?"""
    return len(plan.non_const_buffer_sizes or ()) == SHARED_PLAN_ARENAS


def _state_tensors(plan: P.ExecutionPlan, size: int, what: str) -> list[StateTensor]:
    """The tensors of one method in memory id 2, bounds-checked against the region's size."""
    out = []
    for slot, ev in enumerate(plan.values or ()):
        t = ev.val
        info = getattr(t, "allocation_info", None) if isinstance(t, P.Tensor) else None
        if info is None or info.memory_id != SHARED_MEM_ID:
            continue
        where = f"{what}: value {slot}"
        try:
            dtype = scalar_type_to_dtype(t.scalar_type)
        except ValueError as e:
            raise LoadError(f"{where}: {e}") from None
        sizes = list(t.sizes or [])
        check_dim_order(sizes, list(t.dim_order or []), where)
        start = info.memory_offset
        end = start + nbytes_of(sizes, dtype)
        if start < 0 or end > size:
            raise LoadError(f"{where}: {end - start} bytes at offset {start} overrun the shared state "
                            f"(memory id {SHARED_MEM_ID}, {size} bytes)")
        extra = t.extra_tensor_info
        out.append(StateTensor(plan.name or "?", slot, start, end, dtype, tuple(sizes),
                               extra.fully_qualified_name if extra is not None else None))
    return out


def check_shared_layout(plans: list[P.ExecutionPlan], what: str) -> int:
    """The shared region's size once every method declaring it agrees about it (see the module doc);
    LoadError naming the methods otherwise."""
    sharing = [p for p in plans if declares_shared_state(p)]
    first = sharing[0]
    size = first.non_const_buffer_sizes[SHARED_MEM_ID]
    tensors: list[StateTensor] = []
    for plan in sharing:
        where = f"{what}: method {plan.name!r}"
        mine = plan.non_const_buffer_sizes[SHARED_MEM_ID]
        if mine != size:
            raise LoadError(f"{where}: its shared state (memory id {SHARED_MEM_ID}) is {mine} bytes, but method "
                            f"{first.name!r} declares {size} bytes; methods sharing state must agree")
        if size < 0:
            raise LoadError(f"{where}: shared state (memory id {SHARED_MEM_ID}) has negative size {size}")
        tensors.extend(_state_tensors(plan, size, where))
    _check_named(tensors, what)
    _check_ranges(tensors, what)
    return size


def _describe(t: StateTensor) -> str:
    name = f" ({t.fqn})" if t.fqn else ""
    return (f"method {t.method!r} value {t.slot}{name}: {str(t.dtype).replace('torch.', '')} {list(t.sizes)} "
            f"at bytes {t.start}..{t.end}")


def _check_named(tensors: list[StateTensor], what: str) -> None:
    """A named buffer is one tensor: the same bytes, dtype and shape in every method."""
    seen: dict[str, StateTensor] = {}
    for t in tensors:
        if t.fqn is None:
            continue
        other = seen.setdefault(t.fqn, t)
        if (other.start, other.end, other.dtype, other.sizes) != (t.start, t.end, t.dtype, t.sizes):
            raise LoadError(f"{what}: methods disagree about shared buffer {t.fqn!r}: {_describe(other)}; "
                            f"{_describe(t)}")


def _check_ranges(tensors: list[StateTensor], what: str) -> None:
    """Across methods, byte ranges in the region are identical or disjoint (a method's own tensors are
    checked by the method's plan check). Sorted by start, a range partly overlapping another method's
    overlaps the furthest-reaching range before it (or that one already clashed): n log n for any file."""
    by_range: dict[tuple[int, int], list[StateTensor]] = {}
    for t in tensors:
        if t.end > t.start:
            by_range.setdefault((t.start, t.end), []).append(t)
    methods = {key: {t.method for t in group} for key, group in by_range.items()}
    furthest: tuple[int, int] | None = None
    for key in sorted(by_range):
        if furthest is not None and key[0] < furthest[1]:
            mine, theirs = methods[key], methods[furthest]
            if len(mine) > 1 or len(theirs) > 1 or mine != theirs:  # O(1) unless it is about to fail
                a, b = _of_two_methods(by_range[furthest], by_range[key])
                raise LoadError(f"{what}: methods disagree about the shared state (memory id {SHARED_MEM_ID}): "
                                f"{_describe(a)} partly overlaps {_describe(b)}")
        if furthest is None or key[1] > furthest[1]:
            furthest = key


def _of_two_methods(first: list[StateTensor], second: list[StateTensor]) -> tuple[StateTensor, StateTensor]:
    """A tensor of each group, of two different methods (the groups hold at least two methods)."""
    a = first[0]
    b = next((t for t in second if t.method != a.method), None)
    if b is not None:
        return a, b
    other = next((t for t in first if t.method != a.method), first[-1])  # second is all of a's method
    return other, second[0]


def allocate_shared_region(size: int, what: str) -> SharedRegion:
    """The zero-filled shared region (large ones as lazily-touched anonymous pages, like any arena)."""

    arenas = allocate_arenas([0, size], f"{what}: shared state")
    return SharedRegion(arenas.arrays[1], arenas.tensors[1])
