"""The operators and dtypes etlab may run on data from a file: one source of truth.

Read by the runtime (which kernels a `.pte` may bind: `allows_runtime`, `allows_torch_kernel`),
by graph replay of an ETRecord (`allows_replay`) and by the compiler's edge check
(`dtype_problem`). The list itself and its review rule are in `etlab.ops._allowlist`; kernels a
user registers (`etlab.runtime.register_kernel` / `register_backend`) are outside it by choice.

    from etlab import ops
    ops.allows_runtime("aten::add.out")            # True
    ops.allows_runtime("aten::from_file")          # False: not on the list
"""

from __future__ import annotations

from etlab.ops._allowlist import ATEN_FLOAT_ONLY, ATEN_IN_PLACE, HIGHER_ORDER, INDEX_ARGS, OTHER_NAMESPACES
from etlab.ops._dim_order import clone_dim_order, to_dim_order_copy
from etlab.ops._dtypes import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    REAL_DTYPES,
    SUPPORTED_DTYPES,
    UNSUPPORTED_STORAGE_DTYPES,
    dtype_problem,
    storage_dtype_problem,
)
from etlab.ops._resolve import (
    base_allowed,
    is_functional,
    is_out_variant,
    replay_op,
    runtime_torch_op,
    runtime_torch_op_names,
    split_name,
)


def allows_runtime(name: str) -> bool:
    """Is operator `name` ("ns::base.overload" or "ns::base") on the runtime's kernel list?

    True for the runtime's own kernels (prim ops, symbolic queries, dim-order and quantization
    ops) by base name; torch-bound ATen kernels must also be out-variants (`allows_torch_kernel`)."""
    ns, base, _ = split_name(name)
    return base_allowed(ns, base)


def allows_torch_kernel(name: str) -> bool:
    """May the runtime bind torch's own kernel for `name`? (an allowlisted out-variant or in-place op)"""
    return runtime_torch_op(name)


def allows_replay(target) -> bool:
    """May ETRecord graph replay call `target` (OpOverload / HigherOrderOperator)? Pure ones only."""
    return replay_op(target)


__all__ = [
    "ATEN_FLOAT_ONLY", "ATEN_IN_PLACE", "FLOAT_DTYPES", "HIGHER_ORDER", "INDEX_ARGS", "INDEX_DTYPES",
    "OTHER_NAMESPACES", "REAL_DTYPES", "SUPPORTED_DTYPES", "UNSUPPORTED_STORAGE_DTYPES", "allows_replay",
    "allows_runtime", "allows_torch_kernel", "base_allowed", "clone_dim_order", "dtype_problem", "is_functional",
    "is_out_variant", "runtime_torch_op_names", "split_name", "storage_dtype_problem", "to_dim_order_copy",
]
