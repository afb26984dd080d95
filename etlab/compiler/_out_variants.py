"""Functional op -> out-variant op (aten.add.Tensor -> aten.add.out), as the runtime's kernels are registered.

The out variant is the overload of the same packet whose non-out arguments equal the functional
op's (ignoring the tensor-option arguments dtype/layout/device/pin_memory, which the out tensor
carries). Kernel calls pass the schema's arguments in order, out tensor(s) included, then the
return value(s).
"""

from __future__ import annotations

import functools

from torch._ops import OpOverload

_TENSOR_OPTIONS = {"dtype", "layout", "device", "pin_memory"}


def is_out_variant(op: OpOverload) -> bool:
    """Whether an op overload writes into out arguments (an `.out` variant)."""
    return any(a.is_out for a in op._schema.arguments)


def _signature(op: OpOverload, drop_options: bool) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in op._schema.arguments
            if not a.is_out and not (drop_options and a.name in _TENSOR_OPTIONS)]


@functools.cache
def out_variant(op: OpOverload) -> OpOverload | None:
    """The out variant of `op` (itself if it already is one), or None if the packet has none."""
    if is_out_variant(op):
        return op
    if op.namespace == "quantized_decomposed":  # torch lacks their out variants: define upstream's
        from etlab.compiler._quantizer_ops import register_quantized_out_variants

        register_quantized_out_variants()
    packet = op.overloadpacket
    want = _signature(op, drop_options=True)
    candidates = []
    for name in packet.overloads():
        cand = getattr(packet, name)
        if cand is op or not is_out_variant(cand):
            continue
        if _signature(cand, drop_options=True) == want:
            candidates.append(cand)
    if not candidates:
        return None
    # Prefer the overload named after the functional one (add.Tensor -> add.out, le.Tensor -> le.Tensor_out).
    preferred = {"out", f"{op._overloadname}_out"}
    candidates.sort(key=lambda c: (c._overloadname not in preferred, c._overloadname))
    return candidates[0]


def out_argument_names(op: OpOverload) -> list[str]:
    """The names of an op's out arguments, in schema order."""
    return [a.name for a in op._schema.arguments if a.is_out]


def kernel_name(op: OpOverload) -> tuple[str, str]:
    """(operator name, overload) as stored in the .pte operator table: ('aten::add', 'out')."""
    name = op._schema.name
    overload = op._overloadname
    return name, "" if overload == "default" else overload


