"""Facts about a tensor's shape the planner, the passes and the verifier share: the largest value a
symbolic size can take, and the dim order of a strided tensor. Kept apart so that `TensorSpec`
depends on no pass."""

from __future__ import annotations

import sympy
import torch


def upper_bound(expr, range_constraints: dict) -> int | None:
    """Largest value a symbolic size can take under export's range constraints (None if unbounded)."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, torch.SymInt):
        if expr.node.is_constant():
            return int(expr)
        expr = expr.node.expr
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    ranges = {s: ValueRanges(r.lower, r.upper) if hasattr(r, "lower") else r for s, r in range_constraints.items()}
    bound = bound_sympy(sympy.sympify(expr), ranges).upper
    if bound in (sympy.oo, int_oo) or not getattr(bound, "is_number", False):
        return None
    try:
        value = int(bound)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None
    return None if value >= 2**62 else value


def dim_order_of(val: torch.Tensor) -> list[int]:
    """The dim order of a strided tensor: dimensions from outermost to innermost in memory.

    Contiguous tensors (size-1 dims make strides ambiguous) are always 0..n-1.
    """
    n = val.dim()
    if n == 0 or val.is_contiguous():
        return list(range(n))
    if n == 4 and val.is_contiguous(memory_format=torch.channels_last):
        return [0, 2, 3, 1]
    strides = [int(s) if isinstance(s, int) else s.node.hint or 1 for s in val.stride()]
    return sorted(range(n), key=lambda d: (-strides[d], d))
