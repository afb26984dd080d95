"""The `dim_order_ops` operators: clone/_to_copy variants that name the result's dim order.

Defined here, below the compiler and the ETRecord reader, so that a recorded graph using them (etlab's or
upstream's) resolves in any process that reads it.

The runtime has kernels `dim_order_ops::_clone_dim_order.out` and
`dim_order_ops::_to_dim_order_copy.out`; the edge dialect uses these instead of aten.clone and
aten._to_copy so memory format travels as an explicit dim order.
"""

from __future__ import annotations

import torch

_SCHEMAS = {
    "_to_dim_order_copy": "(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, "
    "bool? pin_memory=None, bool non_blocking=False, int[]? dim_order=None) -> Tensor",
    "_to_dim_order_copy.out": "(Tensor self, *, bool non_blocking=False, int[]? dim_order=None, Tensor(a!) out) "
    "-> Tensor(a!)",
    "_clone_dim_order": "(Tensor self, *, bool non_blocking=False, int[]? dim_order=None) -> Tensor",
    "_clone_dim_order.out": "(Tensor self, *, bool non_blocking=False, int[]? dim_order=None, Tensor(a!) out) "
    "-> Tensor(a!)",
}


def _memory_format(dim_order) -> torch.memory_format:
    if dim_order is None:
        return torch.preserve_format
    dim_order = list(dim_order)
    if dim_order == sorted(dim_order):
        return torch.contiguous_format
    if len(dim_order) == 4 and dim_order == [0, 2, 3, 1]:
        return torch.channels_last
    raise ValueError(f"dim_order {dim_order} has no torch memory format")


def _to_dim_order_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                       dim_order=None):
    return torch.ops.aten._to_copy.default(x, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
                                           non_blocking=non_blocking, memory_format=_memory_format(dim_order))


def _clone_dim_order(x, *, non_blocking=False, dim_order=None):
    return torch.ops.aten.clone.default(x, memory_format=_memory_format(dim_order))


def _out(fn):
    def run(x, *, non_blocking=False, dim_order=None, out):
        out.copy_(fn(x, non_blocking=non_blocking, dim_order=dim_order))
        return out

    return run


def _define() -> None:
    if hasattr(torch.ops.dim_order_ops, "_clone_dim_order"):
        return  # another etlab module (or a user) already defined them in this process
    lib = torch.library.Library("dim_order_ops", "DEF")
    for name, schema in _SCHEMAS.items():
        lib.define(name.split(".")[0] + ("." + name.split(".")[1] if "." in name else "") + schema)
    impls = {"_to_dim_order_copy": _to_dim_order_copy, "_clone_dim_order": _clone_dim_order}
    for name, fn in impls.items():
        lib.impl(name, fn, "CompositeExplicitAutograd")
        lib.impl(name, fn, "Meta")
        lib.impl(f"{name}.out", _out(fn), "CompositeExplicitAutograd")
    _LIBS.append(lib)  # a Library unregisters its ops when garbage-collected


_LIBS: list = []
_define()

clone_dim_order = torch.ops.dim_order_ops._clone_dim_order.default
to_dim_order_copy = torch.ops.dim_order_ops._to_dim_order_copy.default
