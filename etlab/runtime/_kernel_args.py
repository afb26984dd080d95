"""Before a kernel runs: the arguments that set how much memory the call takes, checked.

A file sets them: a convolution's padding, stride and dilation, a pad's widths, a repeat's counts,
an upsample's or adaptive pool's output size, a creation op's size, the sizes a `linear` multiplies.
Torch's out= form of a composite operator (convolution.out, linear.out, repeat.out, ... every
`SIZED_BY_ARGUMENTS` entry) computes the whole result into a temporary and only then finds that
it does not fit the planned output: a 1 KB program asking a 1x1x4x4 convolution for padding 2^14
took 4.27 GB. So such a call is first evaluated on the meta device (shapes only, nothing
allocated) with every tensor at its planned size (the upper bound of a dynamic shape):

- a result larger than the memory planned for its output is refused (torch would fail on it,
  after computing it);
- with a memory budget (`Runtime.load_program(memory_budget=...)`), the planned arenas plus the
  temporaries of the call (its result, and a convolution's unfolded input) must fit in it.

Arguments known at load are checked at load, so a hostile program fails before it runs on either
core (both bind through `_torch_kernels`); arguments that change while the method runs (scalars a
kernel writes) are checked before each call, by the Python step that resolves them, which is
also what the native core calls for such instructions. Structured out= kernels (add.out, mm.out,
max_pool2d_with_indices.out, ...) size their output before computing and cannot grow the planned
memory, so they need no check; nor do composites whose result is their input's size (view_copy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from etlab.runtime._values import OPT_TENSOR_LIST, TENSOR, TENSOR_LIST, ValueTable

# Composite out= operators (no CPU out kernel: the result is computed into a temporary first) whose
# result size is set by scalar arguments or by a product of input sizes. Base names.
SIZED_BY_ARGUMENTS = frozenset({
    "convolution", "convolution_backward", "constant_pad_nd", "adaptive_avg_pool1d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "avg_pool1d", "upsample_bilinear2d", "upsample_nearest2d", "repeat",
    "repeat_interleave", "expand_copy", "full", "full_like", "zeros", "ones", "empty", "arange", "unfold_copy",
    "grid_sampler_2d", "embedding", "embedding_dense_backward", "_embedding_bag", "_cdist_forward",
    "_pdist_forward", "linear", "matmul", "stack",
})


def _base(name: str) -> str:
    return name.split("::", 1)[-1].split(".", 1)[0]


def checks(op_name: str) -> bool:
    """Does a call of operator `op_name` ("aten::convolution.out") get checked?"""
    return op_name.startswith("aten::") and _base(op_name) in SIZED_BY_ARGUMENTS


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _meta(value: Any, sizes: list[int] | None = None) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape if sizes is None else sizes, dtype=value.dtype, device="meta")
    if isinstance(value, list):
        return [_meta(v) for v in value]
    return value


def _planned_sizes(table: ValueTable, slot: int) -> list[int] | None:
    """A tensor slot's sizes as planned (a dynamic shape's upper bound)."""
    spec = table.specs[slot]
    return list(spec.sizes or []) if table.kinds[slot] == TENSOR else None


def load_time_args(table: ValueTable, slots: list[int], values: list) -> list:
    """Meta stand-ins of a call's argument values (tensors at their planned sizes)."""
    out = []
    for slot, value in zip(slots, values):
        kind = table.kinds[slot]
        if kind == TENSOR and isinstance(value, torch.Tensor):
            out.append(_meta(value, _planned_sizes(table, slot)))
        elif kind in (TENSOR_LIST, OPT_TENSOR_LIST) and isinstance(value, list):
            members = table.list_members.get(slot, [])
            out.append([None if m < 0 or not isinstance(v, torch.Tensor) else _meta(v, _planned_sizes(table, m))
                        for m, v in zip(members, value)])
        else:
            out.append(_meta(value))
    return out


def _conv_columns(meta_args: list, result: torch.Tensor) -> int:
    """Bytes of the unfolded input a convolution without a dedicated backend builds (im2col): per output
    position, input channels per group x kernel elements."""
    x, weight = meta_args[0], meta_args[1]
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor) or weight.dim() < 3:
        return 0
    per_position = weight.shape[1] * math.prod(weight.shape[2:])
    positions = result.shape[0] * math.prod(result.shape[2:]) if result.dim() > 2 else 0
    return per_position * positions * x.element_size()


def check_call(op, args: list, kw: dict, outputs: list[tuple[str, int | None]], planned_bytes: int,
               budget: int | None, where: str, error: type[Exception]) -> None:
    """Evaluates `op(*args, **kw)` on meta stand-ins (out= tensors included) and refuses the call with
    `error` when a result exceeds its output's capacity or the call's memory exceeds the budget.

    `outputs` are the out= arguments as (name, bytes the real tensor can hold, or None if unknown);
    `planned_bytes` the method's planned arenas. Calls torch cannot evaluate on the meta device (no
    meta kernel, data-dependent shapes, arguments it rejects) are left to torch's own checks.
    """
    meta_outs = {name: kw[name] for name, _ in outputs if isinstance(kw.get(name), torch.Tensor)}
    for t in meta_outs.values():
        t.resize_(0)  # the result sets the shape: no resize warning
    try:
        op(*args, **kw)
    except Exception:  # no meta kernel, data-dependent shapes, rejected arguments: torch checks at call time
        return
    temporaries = 0
    for name, capacity in outputs:
        result = meta_outs.get(name)
        if result is None:
            continue
        nbytes = _nbytes(result)
        temporaries += nbytes
        if capacity is not None and nbytes > capacity:
            raise error(f"{where}: the arguments make argument {name!r} a {str(result.dtype).removeprefix('torch.')} "
                        f"{list(result.shape)} result ({nbytes} bytes), larger than its planned memory "
                        f"({capacity} bytes); the call was not run")
    if budget is None:
        return
    if _base(op._schema.name) == "convolution" and meta_outs:
        temporaries += _conv_columns(args, next(iter(meta_outs.values())))
    if planned_bytes + temporaries > budget:
        raise error(f"{where}: the call would take about {temporaries} bytes of temporaries besides the "
                    f"method's {planned_bytes} planned bytes, over the memory budget of {budget} bytes; "
                    "the call was not run")


def out_names(schema) -> list[str]:
    """The names of a schema's keyword out= arguments (what its result is written into)."""
    return [p.name for p in schema.arguments if p.kwarg_only and p.alias_info is not None and p.alias_info.is_write]


def capacity(t: Any) -> int | None:
    """Bytes a (non-resizable) tensor can hold from its offset on; None for a non-tensor."""
    if not isinstance(t, torch.Tensor):
        return None
    return t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()


def runtime_check(op, where: str, table: ValueTable, error: type[Exception]) -> Callable[[list, dict], None]:
    """The check a step with arguments known only at run time makes before each call (live shapes)."""
    names = out_names(op._schema)

    def check(pos: list, kw: dict) -> None:
        outputs = [(name, capacity(kw.get(name))) for name in names]
        check_call(op, [_meta(v) for v in pos], {k: _meta(v) for k, v in kw.items()}, outputs,
                   table.planned_bytes, table.memory_budget, where, error)

    return check


def load_time_check(op, table: ValueTable, pos: list, pos_slots: list[int], kw: dict, kw_slots: dict[str, int],
                    where: str, error: type[Exception]) -> None:
    """The check of a call whose arguments are all known at load: tensors at their planned sizes."""
    meta_pos = load_time_args(table, pos_slots, pos)
    meta_kw = dict(zip(kw, load_time_args(table, [kw_slots[k] for k in kw], list(kw.values()))))
    outputs = [(name, capacity(kw.get(name)) if kw_slots.get(name) in table.planned else None)
               for name in out_names(op._schema)]
    check_call(op, meta_pos, meta_kw, outputs, table.planned_bytes, table.memory_budget, where, error)
