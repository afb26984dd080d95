"""The untraced run of an XNNPACK plan: the node loop prepared once into a list of closures.

`run_plan` decides per node and per call how each value is held (float levels or integers), what
a traced run must log and which path a node takes. Without a tracer none of that changes between
calls, so `prepare` decides it once per plan: each step is `(fn, input ids, output id)` with the
conversions between levels and integers folded into `fn`, and the loop does nothing else. It also
takes the integer paths the traced loop cannot (there every node reports its own event and value):

- a clamp right after an int8 convolution that only it reads is fused into the convolution
  (oneDNN's ReLU post-op where the clamp keeps exactly what a ReLU keeps, else a clamp of the
  convolution's integers in place): one step, the same integers;
- an add of two per-tensor 8-bit values runs on their integers (`_int8.int_add`), within one step of
  the levels path (one rounding instead of dequantize -> add -> requantize);
- a conversion of a float input to per-tensor 8-bit makes integers directly (the same rounding as
  `fake_quantize`).

A traced run (any enabled tracer) keeps to `run_plan`: one event and one logged value per node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from etlab.runtime.backends.xnnpack._graph import (
    PlannedNode,
    T,
    XnnpackPlan,
    _bind_arguments,
    _store_output,
    fake_quantize,
)
from etlab.runtime.backends.xnnpack._int8 import (
    clamp_bounds,
    int_add,
    offset,
    relu_bounds,
    to_integers,
    to_levels,
)

Step = tuple[Callable[..., torch.Tensor], tuple[int, ...], int]
_CONV_KINDS = {"XNNConv2d", "XNNDepthwiseConv2d"}
relu_clamp = (0.0, float("inf"))


def _as_integers(fn, quant):
    return lambda x: fn(to_integers(x, quant))


def _levels_step(node: PlannedNode, int_positions: tuple[int, ...], specs) -> Callable[..., torch.Tensor]:
    """A node on float levels: integer inputs turned into levels, then the op, its clamp and its output's
    quantization (or fp16 rounding), as `run_plan` computes them untraced."""
    fn, fast, clamp, quant, narrow = node.fn, node.fast, node.clamp, node.quant, node.narrow
    quants = {k: specs[node.inputs[k]].quant for k in int_positions}
    if fast is not None and not quants and quant is None and narrow is None:
        return fast  # a float node with packed weights: the kernel itself is the step (no Python frame around it)
    clamp_fn = T["clamp"]

    def run(*operands):
        if quants:
            operands = list(operands)
            for k, q in quants.items():
                operands[k] = to_levels(operands[k], q)
        if fast is not None:
            y = fast(operands[0])
        else:
            y = fn(*operands)
            if clamp is not None:
                y = clamp_fn(y, *clamp)
        if quant is not None:
            y = fake_quantize(y, quant)
        elif narrow is not None:
            y = y.to(narrow).to(torch.float32)
        return y
    return run


def _fused_conv_clamp(conv, conv_node: PlannedNode, clamp_node: PlannedNode, specs):
    """The int8 convolution with the clamp that follows it, in one call."""
    qout = specs[clamp_node.output].quant
    bounds = clamp_bounds(qout, clamp_node.clamp)
    if hasattr(conv, "clamped"):  # a native kernel (`_int8`): the clamp narrows its own bounds
        return conv.clamped(*bounds)
    relu = relu_bounds(qout)
    if bounds == relu or (conv_node.clamp == relu_clamp and bounds[0] <= relu[0] and bounds[1] == relu[1]):
        return lambda q: conv(q, True)
    lo, hi = bounds
    return lambda q: conv(q).clamp_(lo, hi)


def prepare(plan: XnnpackPlan, fuse: bool = True, ops: list | None = None) -> list[Step]:
    """The plan's untraced steps (see the module doc). fuse=False: one step per node (no clamp fused into the
    convolution before it), for a loop that times each node. `ops`, if given, receives for each step what it does
    in terms the native loop takes (`_native_plan`), or None where the step is Python only."""
    specs, nodes = plan.specs, plan.nodes
    ops = [] if ops is None else ops
    reads = Counter(v for node in nodes for v in node.inputs)
    outputs = set(plan.outputs)
    held_as_int: set[int] = set()
    steps: list[Step] = []
    skip = -1
    for index, node in enumerate(nodes):
        if index == skip:
            continue
        kind, ins, out = node.kind, node.inputs, node.output
        first_int = bool(ins) and ins[0] in held_as_int
        nxt = nodes[index + 1] if index + 1 < len(nodes) else None
        if node.int_fn is not None:
            fn = node.int_fn
            if (fuse and kind in _CONV_KINDS and nxt is not None and nxt.kind == "XNNClamp" and nxt.int_fn is not None
                    and nxt.inputs[0] == out and reads[out] == 1 and out not in outputs):
                fn = _fused_conv_clamp(fn, node, nxt, specs)
                out, skip = nxt.output, index + 1
            pre = None if first_int else integers_of(specs[ins[0]].quant)
            bounds = getattr(fn, "bounds", None)  # a clamp of integers (`_int8.int_kernel`)
            ops.append(("clamp", pre, *bounds) if isinstance(bounds, tuple) else ("kernel", fn, pre))
            if not first_int:
                fn = _as_integers(fn, specs[ins[0]].quant)
            steps.append((fn, ins[:1], out))
            held_as_int.add(out)
        elif node.passes_ints and first_int:
            ops.append(("permute", node.perm) if node.perm is not None else None)
            steps.append((node.fn, ins[:1], out))
            held_as_int.add(out)
        elif kind == "XNNAdd" and all(offset(specs[v].quant) is not None for v in (*ins, out)):
            add = int_add(specs[ins[0]].quant, specs[ins[1]].quant, specs[out].quant, node.clamp)
            qa, qb = specs[ins[0]].quant, specs[ins[1]].quant
            a_int, b_int = ins[0] in held_as_int, ins[1] in held_as_int

            def add_step(a, b, add=add, qa=qa, qb=qb, a_int=a_int, b_int=b_int):
                return add(a if a_int else to_integers(a, qa), b if b_int else to_integers(b, qb))
            native = getattr(add, "native", None)
            same_shape = specs[ins[0]].shape == specs[ins[1]].shape
            ops.append(("qadd", native, None if a_int else integers_of(qa), None if b_int else integers_of(qb))
                       if native is not None and same_shape else None)
            steps.append((add_step, ins, out))
            held_as_int.add(out)
        elif (kind == "XNNConvert" and specs[ins[0]].quant is None and node.narrow is None
              and offset(specs[out].quant) is not None and node.clamp is None):
            quant = specs[out].quant
            ops.append(("quantize", *integers_of(quant)))
            steps.append(((lambda x, quant=quant: to_integers(x, quant)), ins, out))
            held_as_int.add(out)
        else:
            int_positions = tuple(k for k in node.int_inputs if ins[k] in held_as_int)
            fn = _levels_step(node, int_positions, specs)
            ops.append(_levels_op(node, int_positions, specs, fn))
            steps.append((fn, ins[:1] if fn is node.fast else ins, out))
    return steps


def integers_of(quant) -> tuple[float, int, int, int]:
    """(inverse scale, zero point, lo, hi) of `to_integers(x, quant)`'s native conversion (uint8 form)."""
    off = offset(quant)
    return 1.0 / quant.scale, quant.zero_point + off, quant.qmin + off, quant.qmax + off


def _levels_op(node: PlannedNode, int_positions: tuple[int, ...], specs, fn):
    """The native loop's form of a `_levels_step` (see `prepare`'s ops), or None."""
    if fn is node.fast:
        return ("kernel", fn, None)
    if node.quant is not None or node.narrow is not None:
        return None
    if node.kind == "XNNConvert" and int_positions == (0,) and node.clamp is None:
        quant = specs[node.inputs[0]].quant
        return ("dequantize", quant.scale, quant.zero_point + offset(quant))
    if int_positions:
        return None
    if node.kind == "XNNAdd":
        return ("add", node.clamp)
    if node.kind == "XNNStaticTranspose" and node.clamp is None and node.perm is not None:
        return ("permute", node.perm)
    return None


def run_prepared(plan: XnnpackPlan, steps: list[Step], args: list) -> None:
    """Runs the prepared steps on the delegate call's arguments (inputs, then outputs written in place)."""
    values = _bind_arguments(plan, args)
    for fn, ins, out in steps:
        values[out] = fn(*[values[v] for v in ins])
    for position, vid in enumerate(plan.outputs):
        _store_output(plan.specs[vid], values[vid], args[len(plan.inputs) + position])
