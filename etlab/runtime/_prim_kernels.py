"""Kernels for the non-ATen operators upstream's exporter emits.

- `executorch_prim::*`: integer/float arithmetic and comparisons on symbolic sizes, `et_view`
  (a view that shares its input's memory) and `et_copy_index` (the loop body of torch.map);
- `aten::sym_size.int` and the other symbolic-shape queries, which return Python scalars;
- `dim_order_ops::*`: copies and allocations with an explicit dimension order;
- `et_copy::*`: host/device copies (host only here);
- `quantized_decomposed::*.out`: quantize/dequantize/choose_qparams (`_quant_kernels`).
"""

from __future__ import annotations

import functools
import math
import operator

import torch

from etlab.runtime._errors import LoadError
from etlab.runtime._memory import dim_order_strides, reshape_in_place
from etlab.runtime._quant_kernels import QUANT_KERNELS
from etlab.runtime._registry import KernelEntry, Site, Step, python_kernel
from etlab.runtime._values import INT_LIST, TENSOR, ValueTable

# -- symbolic scalars --------------------------------------------------------------------------

def _scalar(fn):
    """Kernel for a scalar operator: fn takes the inputs (the trailing result slot is dropped)."""
    return lambda *args: fn(*args[:-1])


_SCALAR_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "truediv": operator.truediv, "mod": lambda a, b: int(a) % int(b), "eq": operator.eq, "gt": operator.gt,
    "lt": operator.lt, "ge": operator.ge, "le": operator.le, "neg": operator.neg, "ceil": math.ceil,
    "round": round, "trunc": math.trunc, "sym_float": float, "sym_int": int, "sym_max": max, "sym_min": min,
    "sym_not": operator.not_, "sym_ite": lambda b, t, f: t if b else f,
}

_SYM_QUERIES = {
    "aten::sym_size.int": lambda t, dim: t.size(dim),
    "aten::sym_stride.int": lambda t, dim: t.stride(dim),
    "aten::sym_numel": lambda t: t.numel(),
    "aten::_local_scalar_dense": lambda t: t.item(),
}
# Range assertions the exporter leaves behind; nothing to do at run time.
_SYM_CHECKS = ("aten::sym_constrain_range", "aten::sym_constrain_range_for_size")


# -- views and copies ----------------------------------------------------------------------------

def _infer_sizes(sizes: list[int], numel: int, site) -> list[int]:
    sizes = list(sizes)
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        sizes[sizes.index(-1)] = numel // known if known else 0
    if math.prod(sizes) != numel:
        raise RuntimeError(f"{site}: cannot view {numel} elements as {sizes}")
    return sizes


def _bind_et_view(table: ValueTable, args: list[int], site: Site) -> Step:
    _expect(table, args, site, [TENSOR, INT_LIST, TENSOR])
    src, out = table.values[args[0]], table.values[args[2]]
    get_sizes = table.resolver(args[1])

    def point():
        sizes = _infer_sizes(get_sizes() if get_sizes else table.values[args[1]], src.numel(), site)
        out.set_(src.untyped_storage(), src.storage_offset(), sizes, dim_order_strides(sizes, None))

    if get_sizes is None and table.is_static_shape(args[0]) and args[0] not in table.rebound:
        point()  # the source never moves: the view is made once, here
        return _nothing
    return point


def _et_view_rebinds(table: ValueTable, args: list[int]) -> list[int]:
    return [args[2]] if len(args) == 3 else []


def _nothing() -> None:
    return None


def _et_copy_index(copy_to: torch.Tensor, copy_from: torch.Tensor, index: int) -> None:
    reshape_in_place(copy_to, [index + 1, *copy_from.shape])
    copy_to[index].copy_(copy_from)


def _bind_dim_order_copy(table: ValueTable, args: list[int], site: Site) -> Step:
    """_to_dim_order_copy.out / _clone_dim_order.out(self, *, non_blocking, dim_order, out) -> out."""
    if len(args) < 4:
        raise LoadError(f"{site}: expects (self, non_blocking, dim_order, out), got {len(args)} arguments")
    _expect(table, args[:4], site, [TENSOR, None, None, TENSOR])
    src, out = table.values[args[0]], table.values[args[3]]
    if args[3] in table.constant:
        raise LoadError(f"{site}: writes into value {args[3]}, which is constant data")
    dim_order = table.values[args[2]]
    if table.is_static_shape(args[0]) and table.is_static_shape(args[3]) and src.shape == out.shape:
        return functools.partial(out.copy_, src)

    def step():
        reshape_in_place(out, src.shape, dim_order)
        out.copy_(src)

    return step


def _bind_empty_dim_order(table: ValueTable, args: list[int], site: Site) -> Step:
    """_empty_dim_order.out(size, *, dim_order, out) -> out: only (re)shapes out."""
    if len(args) < 3:
        raise LoadError(f"{site}: expects (size, dim_order, out), got {len(args)} arguments")
    _expect(table, args[:3], site, [INT_LIST, None, TENSOR])
    out = table.values[args[2]]
    dim_order = table.values[args[1]]
    get_sizes = table.resolver(args[0])
    if get_sizes is None:
        sizes = table.values[args[0]]
        return lambda: reshape_in_place(out, sizes, dim_order)  # a no-op when the shape already fits
    return lambda: reshape_in_place(out, get_sizes(), dim_order)


def _expect(table: ValueTable, args: list[int], site: Site, kinds: list) -> None:
    if len(args) < len(kinds):
        raise LoadError(f"{site}: expects {len(kinds)} arguments, got {len(args)}")
    for slot, kind in zip(args, kinds):
        table.check_slot(slot, str(site))
        if kind is not None and table.kinds[slot] != kind:
            raise LoadError(f"{site}: value {slot} is a {table.kinds[slot]}, expected a {kind}")


def _copy_out(src: torch.Tensor, out: torch.Tensor) -> None:
    reshape_in_place(out, src.shape)
    out.copy_(src)


def _builtin_table() -> dict[str, KernelEntry]:
    table: dict[str, KernelEntry] = {}

    def add(name: str, fn=None, *, bind=None, result=True, rebinds=None, outs=None):
        """`outs`: positions of the out arguments a trace logs; None for primitive operators."""
        if bind is not None:
            entry = KernelEntry(name, bind, lambda table, args: None, "builtin")
        else:
            entry = python_kernel(name, fn, "builtin", stores_result=result)
        entry.rebinds = rebinds
        entry.traced_outputs = None if outs is None else (
            lambda table, args: tuple(args[i] for i in outs if i < len(args)))
        table[name] = entry

    for op, fn in _SCALAR_OPS.items():
        add(f"executorch_prim::{op}.Scalar", _scalar(fn))
    add("executorch_prim::floordiv.int", _scalar(operator.floordiv))
    add("executorch_prim::mod.int", _scalar(_SCALAR_OPS["mod"]))
    for name, fn in _SYM_QUERIES.items():
        add(name, _scalar(fn))
        if "." not in name.split("::")[1]:
            add(f"{name}.default", _scalar(fn))
    for name in _SYM_CHECKS:
        for key in (name, f"{name}.default"):
            add(key, lambda *args: None, result=False)
    add("executorch_prim::et_view.default", bind=_bind_et_view, rebinds=_et_view_rebinds)
    add("executorch_prim::et_copy_index.tensor", _et_copy_index, result=False)
    add("dim_order_ops::_to_dim_order_copy.out", bind=_bind_dim_order_copy, outs=(3,))
    add("dim_order_ops::_clone_dim_order.out", bind=_bind_dim_order_copy, outs=(3,))
    add("dim_order_ops::_empty_dim_order.out", bind=_bind_empty_dim_order, outs=(2,))
    for name in ("et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"):
        add(name, lambda src, out, *_ret: _copy_out(src, out), result=False, outs=(1,))
    for name, (bind, outs) in QUANT_KERNELS.items():
        add(name, bind=bind, outs=outs)
    return table


BUILTIN_KERNELS: dict[str, KernelEntry] = _builtin_table()
