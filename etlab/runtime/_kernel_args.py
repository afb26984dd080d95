"""Before a kernel runs: the arguments that set how much memory the call takes, checked.

A file sets them: a convolution's padding, stride and dilation, a pad's widths, a repeat's counts,
an upsample's or adaptive pool's output size, a creation op's size, the sizes a `linear` multiplies.
Torch's out= form of a composite operator (convolution.out, linear.out, repeat.out: every operator
of `RESULT_SIZES`) computes the whole result into a temporary and only then finds that it does not
fit the planned output: a 4 KB program asking a 1x1x4x4 convolution for padding 2^14 took 4.27 GB.
So the size of such a call's result is computed from its arguments first (the formulas below,
with every tensor at its planned size, the upper bound of a dynamic shape):

- a result larger than the memory planned for its output is refused (torch would fail on it,
  after computing it);
- with a memory budget (`Runtime.load_program(memory_budget=...)`), the planned arenas plus the
  call's temporaries (its result, and a convolution's unfolded input) must fit in it.

Arguments known at load are checked at load, so a hostile program fails before it runs on either
core (both bind through `_torch_kernels`); arguments that change while the method runs (scalars a
kernel writes) are checked before each call, by the Python step that resolves them, which is also
what the native core calls for such instructions. Structured out= kernels (add.out, mm.out,
max_pool2d_with_indices.out, upsample_nearest2d.out, ...) size their output before computing and
cannot grow the planned memory (its storage is fixed), so they need no check; nor do composites
whose result is no larger than their inputs (view_copy, permute_copy, stack, ...). The formulas
are plain arithmetic on Python ints (no overflow, no meta kernels to import); arguments they cannot
read (wrong types, sizes torch rejects) are left to torch's own checks at the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from etlab.runtime._values import OPT_TENSOR_LIST, TENSOR, TENSOR_LIST, ValueTable


def _ints(v: Any) -> list[int]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise TypeError("not a list of ints")
    return list(v)


def _shape(v: Any) -> list[int]:
    if not isinstance(v, torch.Tensor):
        raise TypeError("not a tensor")
    return list(v.shape)


def _convolution(a: list) -> list[int]:
    x, w = _shape(a[0]), _shape(a[1])
    stride, padding, dilation, output_padding = (_ints(a[i]) for i in (3, 4, 5, 7))
    transposed, groups, k = bool(a[6]), int(a[8]), len(w) - 2
    if k < 1 or len(x) != k + 2 or min(len(stride), len(padding), len(dilation)) < 1:
        raise ValueError("shapes torch rejects")

    def at(v: list[int], i: int) -> int:  # torch expands a one-element list to every spatial dimension
        return v[i] if len(v) > 1 else v[0]

    spatial = []
    for i in range(k):
        s, p, d, n, kk = at(stride, i), at(padding, i), at(dilation, i), x[i + 2], w[i + 2]
        if s <= 0:
            raise ValueError("stride torch rejects")
        if transposed:
            op = at(output_padding, i) if output_padding else 0
            spatial.append((n - 1) * s - 2 * p + d * (kk - 1) + op + 1)
        else:
            spatial.append((n + 2 * p - d * (kk - 1) - 1) // s + 1)
    return [x[0], w[1] * groups if transposed else w[0], *spatial]


def _constant_pad(a: list) -> list[int]:
    x, pad = _shape(a[0]), _ints(a[1])
    if len(pad) % 2 or len(pad) // 2 > len(x):
        raise ValueError("pad torch rejects")
    for i in range(len(pad) // 2):
        x[-1 - i] += pad[2 * i] + pad[2 * i + 1]
    return x


def _repeat(a: list) -> list[int]:
    x, repeats = _shape(a[0]), _ints(a[1])
    x = [1] * (len(repeats) - len(x)) + x
    return [r * n for r, n in zip(repeats, x)]


def _expand(a: list) -> list[int]:
    x, size = _shape(a[0]), _ints(a[1])
    x = [1] * (len(size) - len(x)) + x
    return [n if s == -1 else s for s, n in zip(size, x)]


def _sized(a: list) -> list[int]:
    return _ints(a[0])


def _arange(a: list) -> list[int]:
    start, end, step = (0, a[0], 1) if len(a) == 1 else (a[0], a[1], a[2] if len(a) > 2 else 1)
    if not all(isinstance(v, (int, float)) for v in (start, end, step)) or step == 0:
        raise ValueError("arguments torch rejects")
    return [max(0, math.ceil((end - start) / step))]


def _adaptive(a: list) -> list[int]:
    x, size = _shape(a[0]), _ints(a[1])
    return x[: len(x) - len(size)] + size


def _upsample(a: list) -> list[int]:
    x = _shape(a[0])
    size, scales = a[1], a[3] if len(a) > 3 else a[2]  # bilinear has align_corners between them
    if size is not None:
        return x[:2] + _ints(size)
    if not isinstance(scales, (list, tuple)) or not all(isinstance(v, (int, float)) for v in scales):
        raise TypeError("no output size")
    return x[:2] + [math.floor(n * v) for n, v in zip(x[2:], scales)]


def _unfold(a: list) -> list[int]:
    x, dim, size, step = _shape(a[0]), int(a[1]), int(a[2]), int(a[3])
    if step <= 0 or not x or not -len(x) <= dim < len(x):
        raise ValueError("arguments torch rejects")
    x[dim] = (x[dim] - size) // step + 1
    return [*x, size]


def _grid_sampler(a: list) -> list[int]:
    x, grid = _shape(a[0]), _shape(a[1])
    return [x[0], x[1], *grid[1:-1]]


def _embedding(a: list) -> list[int]:
    return [*_shape(a[1]), _shape(a[0])[-1]]


def _embedding_backward(a: list) -> list[int]:
    return [int(a[2]), _shape(a[0])[-1]]


def _cdist(a: list) -> list[int]:
    return [*_shape(a[0])[:-1], _shape(a[1])[-2]]


def _pdist(a: list) -> list[int]:
    n = _shape(a[0])[0]
    return [n * (n - 1) // 2]


def _linear(a: list) -> list[int]:
    x, w = _shape(a[0]), _shape(a[1])
    return x[:-1] + ([w[0]] if len(w) == 2 else [])


def _matmul(a: list) -> list[int]:
    x, y = _shape(a[0]), _shape(a[1])
    rows = x[-2:-1] if len(x) > 1 else []
    cols = y[-1:] if len(y) > 1 else []
    bx, by = x[:-2], y[:-2]
    batch = [max(p, q) for p, q in zip([1] * (len(by) - len(bx)) + bx, [1] * (len(bx) - len(by)) + by)]
    return batch + rows + cols


def _repeat_interleave(a: list, kw: dict) -> list[int]:
    size = kw.get("output_size")
    if not isinstance(size, int):
        raise TypeError("data-dependent: torch sizes it from the repeats")
    return [size]


# The result's shape, from the call's positional arguments (base name -> formula).
RESULT_SIZES: dict[str, Callable[[list], list[int]]] = {
    "convolution": _convolution, "constant_pad_nd": _constant_pad, "repeat": _repeat, "expand_copy": _expand,
    "full": _sized, "zeros": _sized, "ones": _sized, "empty": _sized, "arange": _arange,
    "adaptive_avg_pool1d": _adaptive, "_adaptive_avg_pool2d": _adaptive, "_adaptive_avg_pool3d": _adaptive,
    "upsample_bilinear2d": _upsample, "upsample_nearest2d": _upsample, "unfold_copy": _unfold,
    "grid_sampler_2d": _grid_sampler, "embedding": _embedding, "embedding_dense_backward": _embedding_backward,
    "_cdist_forward": _cdist, "_pdist_forward": _pdist, "linear": _linear, "matmul": _matmul,
}
_KEYWORD_SIZES = {"repeat_interleave": _repeat_interleave}  # formulas that read keyword arguments


def _base(name: str) -> str:
    return name.split("::", 1)[-1].split(".", 1)[0]


def checks(op_name: str) -> bool:
    """Does a call of operator `op_name` ("aten::convolution" or "aten::convolution.out") get checked?"""
    base = _base(op_name)
    return op_name.startswith("aten::") and (base in RESULT_SIZES or base in _KEYWORD_SIZES)


def result_shape(op_name: str, args: list, kw: dict) -> list[int] | None:
    """The shape of the call's result, or None when the arguments are not readable or make a shape torch
    rejects (a negative size): torch's own checks apply to those."""
    base = _base(op_name)
    try:
        shape = _KEYWORD_SIZES[base](args, kw) if base in _KEYWORD_SIZES else RESULT_SIZES[base](args)
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return None
    return shape if all(n >= 0 for n in shape) else None


def _conv_columns(args: list, shape: list[int]) -> int:
    """Elements of the unfolded input a convolution without a dedicated backend builds (im2col): per
    output position, input channels per group x kernel elements."""
    w = _shape(args[1])
    return shape[0] * math.prod(shape[2:]) * w[1] * math.prod(w[2:])


def check_call(op_name: str, args: list, kw: dict, out: tuple[str, int, int | None] | None, planned_bytes: int,
               budget: int | None, where: str, error: type[Exception]) -> None:
    """Refuses a call with `error` when its result exceeds its output's capacity or the call's memory
    exceeds the budget. `out` is (name, element size, bytes the output can hold or None if unknown)."""
    if out is None:
        return
    shape = result_shape(op_name, args, kw)
    if shape is None:
        return
    name, itemsize, capacity = out
    nbytes = math.prod(shape) * itemsize
    if capacity is not None and nbytes > capacity:
        raise error(f"{where}: the arguments make argument {name!r} a {shape} result ({nbytes} bytes), larger "
                    f"than its planned memory ({capacity} bytes); the call was not run")
    if budget is None:
        return
    temporaries = nbytes
    if _base(op_name) == "convolution":
        temporaries += _conv_columns(args, shape) * itemsize
    if planned_bytes + temporaries > budget:
        raise error(f"{where}: the call would take about {temporaries} bytes of temporaries besides the "
                    f"method's {planned_bytes} planned bytes, over the memory budget of {budget} bytes; "
                    "the call was not run")


def _out_name(schema) -> str | None:
    """The name of a schema's single keyword out= argument (what its result is written into)."""
    names = [p.name for p in schema.arguments if p.kwarg_only and p.alias_info is not None and p.alias_info.is_write]
    return names[0] if len(names) == 1 else None


def _capacity(t: torch.Tensor) -> int:
    """Bytes a (non-resizable) tensor can hold from its offset on."""
    return t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()


def runtime_check(schema, where: str, table: ValueTable, error: type[Exception]) -> Callable[[list, dict], None]:
    """The check a step with arguments known only at run time makes before each call (live shapes)."""
    name = _out_name(schema)

    def check(pos: list, kw: dict) -> None:
        out = kw.get(name)
        if isinstance(out, torch.Tensor):
            check_call(schema.name, pos, kw, (name, out.element_size(), _capacity(out)), table.planned_bytes,
                       table.memory_budget, where, error)

    return check


def _stand_in(table: ValueTable, slot: int, value: Any) -> Any:
    """A tensor at its planned size (a dynamic shape's upper bound), for the formulas; other values as they are."""
    kind = table.kinds[slot]
    if kind == TENSOR and isinstance(value, torch.Tensor):
        return torch.empty(list(table.specs[slot].sizes or []), dtype=value.dtype, device="meta")
    if kind in (TENSOR_LIST, OPT_TENSOR_LIST) and isinstance(value, list):
        return [None if m < 0 else _stand_in(table, m, v) for m, v in zip(table.list_members.get(slot, []), value)]
    return value


def load_time_check(schema, table: ValueTable, pos: list, pos_slots: list[int], kw: dict,
                    kw_slots: dict[str, int], where: str, error: type[Exception]) -> None:
    """The check of a call whose arguments are all known at load: tensors at their planned sizes, the
    output's capacity its planned memory (unknown for an output placed at run time)."""
    name = _out_name(schema)
    out = kw.get(name)
    if not isinstance(out, torch.Tensor):
        return
    capacity = _capacity(out) if kw_slots.get(name) in table.planned else None
    args = [_stand_in(table, s, v) for s, v in zip(pos_slots, pos)]
    check_call(schema.name, args, kw, (name, out.element_size(), capacity), table.planned_bytes,
               table.memory_budget, where, error)
