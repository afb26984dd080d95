"""An XNNPACK partition as one native loop (`_native/xnn_plan.cpp`): a delegate call is one C++ call.

`_fast.prepare` makes a plan's untraced steps and, for each, what it does in terms the loop takes (`ops`): a
packed float convolution or fully connected layer, an int8 convolution, add or clamp on integers (after
making the integers of a float input where the step does), a conversion between levels and integers, a
permute, a float add with its clamp. `build` hands them to the loop with the constants and the call's
argument slots; a step with no native form (None) is given to the loop as its Python callable, so one plan
may mix both (each Python step costs its Python call; the others none). Each step calls the kernel its Python
step calls, in the same order, so the outputs are the Python path's bit for bit.

The loop binds the call's arguments itself only where that is a plain assignment (float32 inputs of exactly the
declared shape, output tensors of exactly theirs); any other call (dynamic shapes, quantized or fp16 inputs, bad
arguments) makes `run` return None and the caller runs the Python steps, which check and convert. Outputs the
loop cannot copy as they are (integers, a 0-d tensor) are stored by `_graph._store_output`.

Two loops are built per plan: the untraced one from the fused steps, and a timed one with one step per node
(no clamp fused into the convolution before it), which returns each step's start and end for the per-node
profiling events of a traced run that logs no values (`profile_events`).
"""

from __future__ import annotations

from etlab.runtime._native import _core
from etlab.runtime.backends.xnnpack._fast import Step, prepare
from etlab.runtime.backends.xnnpack._graph import NARROW_FLOATS, XnnpackPlan, _store_output

_NATIVE = _core if _core is not None and hasattr(_core, "XnnPartition") else None
_KERNELS = {"PackedConv2d", "PackedLinear", "BoundQConv2d", "BoundQDepthwiseConv2d"}


def build(plan: XnnpackPlan, fuse: bool = True):
    """The plan's native loop (None without the native core)."""
    if _NATIVE is None:
        return None
    ops: list = []
    steps = prepare(plan, fuse=fuse, ops=ops)
    slots = {vid: index for index, vid in enumerate(plan.specs)}
    specs = plan.specs

    def store(position: int, value, out) -> None:
        vid = plan.outputs[position]
        _store_output(specs[vid], value, out)
    def direct(vids: list[int]) -> list[bool]:  # float32 values the loop binds / copies as they are
        return [specs[v].quant is None and specs[v].datatype not in NARROW_FLOATS for v in vids]
    loop = _NATIVE.XnnPartition(len(slots), [slots[v] for v in plan.inputs],
                                [list(specs[v].shape) for v in plan.inputs], direct(plan.inputs),
                                [slots[v] for v in plan.outputs], [list(specs[v].shape) for v in plan.outputs],
                                direct(plan.outputs), store)
    for vid, value in plan.constants.items():
        loop.set_constant(slots[vid], value)
    for step, op in zip(steps, ops, strict=True):
        _add_step(loop, step, op, slots)
    return loop


def _add_step(loop, step: Step, op, slots: dict[int, int]) -> None:
    fn, ins, out = step
    i, o = [slots[v] for v in ins], slots[out]
    kind = op[0] if op is not None else None
    if kind == "kernel" and type(op[1]).__name__ in _KERNELS:
        loop.add_kernel(op[1], i[0], o, op[2])
    elif kind == "qadd":
        loop.add_qadd(op[1], i[0], i[1], o, op[2], op[3])
    elif kind == "clamp":
        loop.add_clamp(i[0], o, op[1], op[2], op[3])
    elif kind == "quantize":
        loop.add_quantize(i[0], o, *op[1:])
    elif kind == "dequantize":
        loop.add_dequantize(i[0], o, *op[1:])
    elif kind == "permute":
        loop.add_permute(i[0], o, list(op[1]))
    elif kind == "add":
        loop.add_float_add(i[0], i[1], o, op[1])
    else:
        loop.add_python(fn, i, o)


def profile_events(plan: XnnpackPlan, times: list[int], context) -> None:
    """The timed loop's step times as the per-node delegate events `run_plan` records (one step per node)."""
    for node, k in zip(plan.nodes, range(0, len(times), 2), strict=True):
        context.log_profiling_delegate(node.name, node.debug_id, times[k], times[k + 1], node.metadata)
