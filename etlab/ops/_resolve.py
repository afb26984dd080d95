"""Which overloads of the allowlisted operators count, decided from torch's own schemas.

The allowlist (`_allowlist`) names base operators; an overload is admitted by what its schema
says it writes, so a new overload torch adds cannot slip in a side effect:
- the runtime binds an out-variant (every written argument is keyword-only: `add.out`,
  `max.dim_max`) or one of the reviewed in-place operators;
- graph replay runs a functional overload (writes nothing, not seeded by the random generator).
"""

from __future__ import annotations

import functools
import importlib

import torch

from etlab.ops._allowlist import (
    ATEN_ANY_DTYPE,
    ATEN_FLOAT_ONLY,
    ATEN_IN_PLACE,
    HIGHER_ORDER,
    OTHER_NAMESPACES,
)

ATEN_BASES = ATEN_ANY_DTYPE | ATEN_FLOAT_ONLY


def split_name(name: str) -> tuple[str, str, str]:
    """"ns::base.overload" (or "ns.base.overload", torch's str of an OpOverload) -> (ns, base, overload);
    a missing overload is ""."""
    if "::" in name:
        ns, _, rest = name.partition("::")
        base, _, overload = rest.partition(".")
    else:
        ns, _, rest = name.partition(".")
        base, _, overload = rest.partition(".")
    return ns, base, overload


def base_allowed(ns: str, base: str) -> bool:
    """Is `ns::base` on the reviewed list (any overload)?"""
    if ns == "aten":
        return base in ATEN_BASES or base in ATEN_IN_PLACE
    return base in OTHER_NAMESPACES.get(ns, ())


def _overload(ns: str, base: str, overload: str):
    if ns == "quantized_decomposed":
        importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers the namespace
    try:
        op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


def _written(schema) -> list:
    return [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def is_out_variant(schema) -> bool:
    """Writes only keyword-only (out) arguments, and at least one."""
    written = _written(schema)
    return bool(written) and all(a.kwarg_only for a in written)


def writes_only_self(schema) -> bool:
    """An in-place operator that writes its first argument (`self`) and nothing else."""
    written = _written(schema)
    args = schema.arguments
    return len(written) == 1 and bool(args) and written[0].name == args[0].name


def is_functional(op: torch._ops.OpOverload) -> bool:
    """Writes none of its arguments and draws no random numbers."""
    return not _written(op._schema) and torch.Tag.nondeterministic_seeded not in op.tags


@functools.cache
def runtime_torch_op(name: str) -> bool:
    """May the runtime bind torch's own kernel for `name` ("aten::add.out")? Out-variants of
    allowlisted operators, and the reviewed in-place operators."""
    ns, base, overload = split_name(name)
    if not base_allowed(ns, base):
        return False
    op = _overload(ns, base, overload)
    if op is None or torch.Tag.nondeterministic_seeded in op.tags:
        return False
    if ns == "aten" and base in ATEN_IN_PLACE:
        return writes_only_self(op._schema)
    return is_out_variant(op._schema)


def replay_op(target) -> bool:
    """May graph replay call `target` (an OpOverload or HigherOrderOperator)?"""
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name() in HIGHER_ORDER
    if not isinstance(target, torch._ops.OpOverload):
        return False
    ns, base, _ = split_name(target.name())
    return base_allowed(ns, base) and base not in ATEN_IN_PLACE and is_functional(target)


@functools.cache
def runtime_torch_op_names() -> frozenset[str]:
    """Every "aten::base.overload" the runtime may bind from torch (for listing; lookups use
    `runtime_torch_op`)."""
    names = set()
    for full in torch._C._dispatch_get_all_op_names():
        ns, base, overload = split_name(full)
        if ns == "aten" and base_allowed(ns, base) and runtime_torch_op(full):
            names.add(f"aten::{base}" if not overload or overload == "default" else f"aten::{base}.{overload}")
    return frozenset(names)
