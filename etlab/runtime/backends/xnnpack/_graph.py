"""An XNNPACK delegate blob turned into a checked, ready-to-run plan (`XnnpackPlan`), and running it.

`build_plan` checks everything a hostile blob could get wrong before anything runs: value ids
and shapes, constants (ranges, sizes, named keys), quantization parameters, every node's ids
and attributes, that every value is written once and before it is read, and (by running the
whole graph on meta tensors) that each node's declared output shape is what its kernel makes.

`run_plan` executes node by node. Values are float32 tensors; a quantized value holds exactly
its dequantized levels, so XNNPACK's integer arithmetic is emulated as dequantize -> float op
-> requantize (within one quantization step of XNNPACK's fixed-point requantization). Faster
paths give the same values: convolutions with constant weights run prepacked (`_prepacked`), and
int8 convolutions, clamps and layout moves between them on integers (`_int8`: such a value is then
held as a uint8 tensor, turned into levels where another node or the trace needs them).
Each node reports a profiling event and its output under its debug handle (the handle of the
node it was lowered from, the identifier the AOT debug-handle map uses), or under the name
"<kind> #<n>" for nodes lowering added (no debug handle).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from etlab.errors import FormatError
from etlab.runtime._errors import ExecutionError, check_delegate_args
from etlab.runtime.backends.xnnpack._int8 import INT_DTYPE, int_kernel, layout_passes_integers, offset, to_levels
from etlab.runtime.backends.xnnpack._int8 import to_integers as int_from_levels
from etlab.runtime.backends.xnnpack._kernels import TORCH_CALLS as T
from etlab.runtime.backends.xnnpack._kernels import build_kernel
from etlab.runtime.backends.xnnpack._values import ConstantSource, Quant, ValueSpec, decode_values, external_order
from etlab.schema.xnnpack import XNNDatatype, XnnpackBlob, node_kind

BACKEND_ID = "XnnpackBackend"
NO_DEBUG_HANDLE = 65535  # what upstream's preprocess writes for nodes without a debug handle
MAX_NODES = 1 << 20
# kinds whose output is NHWC whatever their input (for logging values in the graph's NCHW layout)
_MAKES_NHWC = {"XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNMaxPooling2d", "XNNAvgPooling2d",
               "XNNGlobalAvgPooling2d", "XNNStaticResizeBilinear2D"}
_KEEPS_LAYOUT = {"XNNAdd", "XNNSubtract", "XNNMultiply", "XNNDiv", "XNNMinimum", "XNNMaximum", "XNNClamp",
                 "XNNConvert", "XNNSigmoid", "XNNTanh", "XNNHardswish", "XNNELU", "XNNLeakyReLU", "XNNPReLU",
                 "XNNGelu", "XNNAbs", "XNNNegate", "XNNSquare", "XNNSquareRoot", "XNNReciprocalSquareRoot",
                 "XNNFloor", "XNNCeiling", "XNNLog", "XNNExp", "XNNSin", "XNNCos", "XNNCopy",
                 "XNNStaticConstantPad", "XNNStaticSlice", "XNNConcatenate2", "XNNConcatenate3",
                 "XNNConcatenate4", "XNNConcatenate5"}
_TO_NHWC, _TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
# Float values stored narrower than float32: carried as float32, rounded to their type after each node
NARROW_FLOATS = {XNNDatatype.xnn_datatype_fp16: torch.float16, XNNDatatype.xnn_datatype_bf16: torch.bfloat16}


@dataclass
class PlannedNode:
    """One XNNPACK node ready to run: its kind, value ids in and out, the function computing it, and the fused clamp."""

    kind: str
    inputs: tuple[int, ...]
    output: int
    fn: Callable[..., torch.Tensor]
    clamp: tuple[float, float] | None     # fused output_min / output_max
    quant: Quant | None                   # the output's quantization
    debug_id: int                         # delegate debug identifier, -1 when named
    name: str | None                      # event name for nodes without a debug handle
    metadata: bytes                       # the node kind, attached to its profiling event
    log_as_nchw: bool                     # output is NHWC; logged permuted back to the graph's NCHW
    logs_stored: bool                     # the debug event holds the stored value (see _logged)
    logs_output: bool = True              # False for all but the last node sharing a debug handle
    fast: Callable[..., torch.Tensor] | None = None  # fn(x[, fused]): weights prepacked, clamp fused
    int_fn: Callable[[torch.Tensor], torch.Tensor] | None = None  # integers in, integers out (`_int8`)
    passes_ints: bool = False             # a layout node that moves its input's integers unchanged
    int_inputs: tuple[int, ...] = ()      # positions of inputs that may be held as integers
    narrow: torch.dtype | None = None     # fp16/bf16 output: computed in float32, rounded to this type
    perm: tuple[int, ...] | None = None   # a transpose's permutation (for the native loop, `_native_plan`)


@dataclass
class XnnpackPlan:
    """One initialized delegate: constant values, the external inputs/outputs and the node list."""

    specs: dict[int, ValueSpec]
    constants: dict[int, torch.Tensor]
    inputs: list[int]
    outputs: list[int]
    nodes: list[PlannedNode]
    steps: list | None = None  # the untraced run, prepared once (`_fast.prepare`)
    native: object | None = None        # the untraced run as one native loop (`_native_plan`), if built
    native_timed: object | None = None  # the same, one timed step per node (a traced run that logs no values)


def fake_quantize(x: torch.Tensor, quant: Quant) -> torch.Tensor:
    """x rounded to the nearest level of `quant` (saturating), returned as float levels."""
    # One new tensor, then in place (a sixth of the time of the out-of-place chain; torch's
    # fake_quantize kernels are slower still). x * (1 / scale) may differ from x / scale in the last
    # bit: a value within an ulp of a midpoint between two levels may land on the other one (within one
    # step, as XNNPACK's own fixed-point requantization).
    if quant.kind == "tensor":
        q = T["mul"](x, 1.0 / quant.scale).round_().add_(quant.zero_point).clamp_(quant.qmin, quant.qmax)
        return q.sub_(quant.zero_point).mul_(quant.scale)
    if quant.kind == "channel":
        view = [1] * x.dim()
        view[quant.axis] = -1
        scales = quant.scales.reshape(view)
        return T["div"](x, scales).round_().clamp_(quant.qmin, quant.qmax).mul_(scales)
    return _dynamic_fake_quantize(x, quant.axis)


def _dynamic_fake_quantize(x: torch.Tensor, nonbatch_dims: int) -> torch.Tensor:
    """Per-row asymmetric int8 quantization (a row: the trailing `nonbatch_dims` dims) with the range
    widened to include 0, as XNNPACK's qdint8 values are quantized at run time."""
    rows = x.reshape(-1, math.prod(x.shape[x.dim() - nonbatch_dims:])) if x.dim() else x.reshape(1, 1)
    lo = T["clamp"](T["amin"](rows, 1, keepdim=True), max=0.0)
    hi = T["clamp"](T["amax"](rows, 1, keepdim=True), min=0.0)
    scale = T["where"](hi > lo, (hi - lo) / 255.0, T["ones_like"](hi))
    zero_point = T["clamp"](T["round"](-128.0 - lo / scale), -128, 127)
    q = T["clamp"](T["round"](rows / scale) + zero_point, -128, 127)
    return ((q - zero_point) * scale).reshape(x.shape)


def to_integers(levels: torch.Tensor, quant: Quant, dtype: torch.dtype) -> torch.Tensor:
    """Float levels of a per-tensor quantized value as its stored integers."""
    return T["round"](levels / quant.scale + quant.zero_point).to(dtype)


def _layouts(kind: str, inputs: tuple[int, ...], output_rank: int, nhwc: set[int], attrs) -> bool:
    """Is this node's output NHWC? (propagated from the graph's explicit NCHW<->NHWC transposes)"""
    if output_rank != 4:
        return False
    if kind in _MAKES_NHWC:
        return True
    if kind == "XNNStaticTranspose":
        perm = tuple(int(p) for p in attrs.perm or [])
        source_nhwc = inputs[0] in nhwc
        return (perm == _TO_NHWC and not source_nhwc) or (perm == (0, 1, 2, 3) and source_nhwc)
    if kind in _KEEPS_LAYOUT:
        return any(i in nhwc for i in inputs)
    return False


def _perm(kind: str, attrs) -> tuple[int, ...] | None:
    return tuple(int(p) for p in attrs.perm or []) if kind == "XNNStaticTranspose" else None


def build_plan(blob: XnnpackBlob, named_data: Mapping[str, object], what: str) -> XnnpackPlan:
    """Checks the whole graph and returns its plan; FormatError naming what is wrong."""
    graph = blob.graph
    specs = decode_values(graph, ConstantSource(graph, blob.constant_data, named_data, what))
    inputs, outputs = external_order(graph, specs, what)
    if any(specs[v].external_id >= len(inputs) for v in inputs):
        raise FormatError(f"{what}: graph inputs must take the first external ids (the delegate call's inputs "
                          f"come before its outputs)")
    xnodes = graph.xnodes or []
    if len(xnodes) > MAX_NODES:
        raise FormatError(f"{what}: {len(xnodes)} nodes (at most {MAX_NODES})")
    constants = {vid: s.constant for vid, s in specs.items() if s.constant is not None}
    defined = set(inputs) | set(constants)
    meta = {vid: torch.empty(specs[vid].shape, device="meta") for vid in defined}
    nhwc: set[int] = set()
    nodes, unnamed = [], {}
    for index, xnode in enumerate(xnodes):
        kind = node_kind(xnode)
        kernel = build_kernel(kind, xnode.xnode_union, specs, what, index)
        ctx = f"{what}: node {index} ({kind})"
        unread = [v for v in kernel.inputs if v not in defined]
        if unread:
            raise FormatError(f"{ctx} reads value {unread[0]} before anything writes it")
        out = kernel.output
        if out in defined:
            raise FormatError(f"{ctx} writes value {out}, which is an input, a constant or already written")
        spec = specs[out]
        if spec.is_input:
            raise FormatError(f"{ctx} writes value {out}, an external input")
        try:
            made = kernel.fn(*(meta[v] for v in kernel.inputs))
        except (RuntimeError, ValueError, IndexError, TypeError) as err:
            raise FormatError(f"{ctx}: operands {[list(specs[v].shape) for v in kernel.inputs]} do not fit: "
                              f"{str(err).splitlines()[0]}") from None
        if tuple(made.shape) != spec.shape:
            raise FormatError(f"{ctx} makes shape {list(made.shape)} but value {out} is {list(spec.shape)}")
        defined.add(out)
        meta[out] = made
        clamp = None
        if xnode.output_min_max is not None:
            lo, hi = xnode.output_min_max.output_min, xnode.output_min_max.output_max
            lo, hi = float(-math.inf if lo is None else lo), float(math.inf if hi is None else hi)
            if math.isnan(lo) or math.isnan(hi) or lo > hi:
                raise FormatError(f"{ctx} clamps its output to [{lo}, {hi}]")
            clamp = (lo, hi)
        handle = int(xnode.debug_handle or 0)
        name = None
        if handle == NO_DEBUG_HANDLE:
            unnamed[kind] = unnamed.get(kind, 0) + 1
            name = f"{kind} #{unnamed[kind]}"
        if _layouts(kind, kernel.inputs, len(spec.shape), nhwc, xnode.xnode_union):
            nhwc.add(out)
        logs_stored = spec.quant is not None and clamp != (0.0, math.inf)
        fast = None
        if kernel.prepack is not None and all(v in constants for v in kernel.inputs[1:]):
            weights = [constants[v] for v in kernel.inputs[1:]]
            fast = kernel.prepack(weights[0], weights[1] if len(weights) > 1 else None, clamp)
        int_fn = int_kernel(kind, kernel.inputs, out, specs, constants, clamp, kernel.geometry)
        passes = bool(kernel.inputs) and layout_passes_integers(kind, specs[kernel.inputs[0]].quant, spec.quant)
        int_inputs = tuple(k for k, v in enumerate(kernel.inputs) if offset(specs[v].quant) is not None)
        nodes.append(PlannedNode(kind, kernel.inputs, out, kernel.fn, clamp, spec.quant,
                                 -1 if name else handle, name, kind.encode(), out in nhwc, logs_stored,
                                 fast=fast, int_fn=int_fn, passes_ints=passes, int_inputs=int_inputs,
                                 narrow=NARROW_FLOATS.get(spec.datatype),
                                 perm=_perm(kind, xnode.xnode_union)))
    # An op lowered to several nodes (matmul -> reshape, reshape, batch matmul, reshape) gives them
    # all its handle: only the last one logs an output, the value that handle ends with.
    last = {node.debug_id: index for index, node in enumerate(nodes) if node.debug_id >= 0}
    for index, node in enumerate(nodes):
        node.logs_output = node.debug_id < 0 or last[node.debug_id] == index
    unwritten = [v for v in outputs if v not in defined]
    if unwritten:
        raise FormatError(f"{what}: graph output value {unwritten[0]} is never written")
    return XnnpackPlan(specs, constants, inputs, outputs, nodes)


def _bind_arguments(plan: XnnpackPlan, args: list) -> dict[int, torch.Tensor]:
    """The run's value table, seeded with constants and the (dequantized) inputs; checks every argument."""
    check_delegate_args(BACKEND_ID, len(plan.inputs), len(plan.outputs), args)
    values = dict(plan.constants)
    for position, (vid, arg) in enumerate(zip(plan.inputs + plan.outputs, args)):
        spec = plan.specs[vid]
        role = "input" if position < len(plan.inputs) else "output"
        if not isinstance(arg, torch.Tensor):
            raise ExecutionError(f"{BACKEND_ID}: {role} {position} must be a tensor, got {type(arg).__name__}")
        shape = tuple(arg.shape) if arg.dim() or spec.shape != (1,) else (1,)  # a 0-d tensor is [1] here
        if len(shape) != len(spec.shape) or any(a > b for a, b in zip(shape, spec.shape)):
            raise ExecutionError(f"{BACKEND_ID}: {role} {position} has shape {list(arg.shape)}; the delegate "
                                 f"takes {list(spec.shape)} or smaller dims (dynamic shapes) of that rank")
        if role == "input":
            arg = arg.reshape(shape)
            if spec.quant is not None and spec.quant.kind == "tensor":
                values[vid] = (arg.to(torch.float32) - spec.quant.zero_point) * spec.quant.scale
            elif arg.dtype != NARROW_FLOATS.get(spec.datatype, torch.float32):
                raise ExecutionError(f"{BACKEND_ID}: input {position} must be "
                                     f"{NARROW_FLOATS.get(spec.datatype, torch.float32)}, got {arg.dtype}")
            else:
                values[vid] = arg.to(torch.float32)  # fp16/bf16 values are computed in float32
    return values


def _store_output(spec: ValueSpec, levels: torch.Tensor, out: torch.Tensor) -> None:
    if levels.dtype is INT_DTYPE:
        levels = to_levels(levels, spec.quant)
    if spec.quant is not None and spec.quant.kind == "tensor":
        levels = to_integers(levels, spec.quant, out.dtype)
    if out.dim() == 0 and spec.shape == (1,) and levels.numel() == 1:
        out.copy_(levels.reshape(()))  # a 0-d tensor is [1] in XNNPACK's graph (as for inputs, `_bind_arguments`)
        return
    if out.shape != levels.shape:
        # A dynamic shape: this run's output differs from the last one's (smaller or larger) and must fit
        # the value's declared upper bound (the graph's dims), which is what the program planned for it.
        bound = math.prod(spec.shape)
        if out.dim() != levels.dim() or levels.numel() > bound:
            raise ExecutionError(f"{BACKEND_ID}: output of shape {list(levels.shape)} does not fit the "
                                 f"program's bound {list(spec.shape)}")
        out.resize_(levels.shape)
    out.copy_(levels.reshape(out.shape))


def run_plan(plan: XnnpackPlan, args: list, context=None) -> None:
    """Runs the graph on the delegate call's arguments (inputs, then outputs written in place)."""
    values = _bind_arguments(plan, args)
    tracing = context is not None and getattr(context, "enabled", True)
    logging = tracing and getattr(context, "logs_values", True)  # results before a fused clamp are needed
    specs = plan.specs
    for node in plan.nodes:
        token = context.start_profiling_delegate(name=node.name, delegate_debug_id=node.debug_id) if tracing else None
        first = values[node.inputs[0]] if node.inputs else None
        if node.int_fn is not None and (node.clamp is None or not logging):  # integers in and out
            q = first if first.dtype is INT_DTYPE else int_from_levels(first, specs[node.inputs[0]].quant)
            result = stored = node.int_fn(q)
        elif node.passes_ints and first.dtype is INT_DTYPE:
            result = stored = node.fn(first)
        else:
            operands = [values[v] for v in node.inputs]
            for k in node.int_inputs:  # kernels on levels: a value held as integers is given as its levels
                if operands[k].dtype is INT_DTYPE:
                    operands[k] = to_levels(operands[k], specs[node.inputs[k]].quant)
            if node.fast is not None and not logging:
                result = stored = node.fast(operands[0])
            else:
                result = stored = node.fn(*operands) if node.fast is None else node.fast(operands[0], False)
                if node.clamp is not None:
                    stored = T["clamp"](stored, *node.clamp)
            if node.quant is not None:
                stored = fake_quantize(stored, node.quant)
            elif node.narrow is not None:  # XNNPACK's f16 kernels on x86 compute in float32, store fp16
                stored = stored.to(node.narrow).to(torch.float32)
        values[node.output] = stored
        if tracing:
            context.end_profiling_delegate(token, metadata=node.metadata)
            if logging and node.logs_output:  # a context that keeps no values is not made to copy them
                if stored.dtype is INT_DTYPE:
                    result = stored = to_levels(stored, node.quant)
                context.log_output_delegate(node.name, node.debug_id, _logged(node, result, stored))
    for position, vid in enumerate(plan.outputs):
        _store_output(plan.specs[vid], values[vid], args[len(plan.inputs) + position])


def _logged(node: PlannedNode, result: torch.Tensor, stored: torch.Tensor) -> torch.Tensor:
    """What a node's debug event holds, in the lowered graph's layout: the value its debug handle
    ends with in that graph.

    A float node logs its op's result before a fused clamp (the graph applied the activation as
    a node of its own, with its own handle). A node with a quantized output logs the stored
    levels: in a quantized graph the op, its quantize and dequantize share one handle, and the
    observer it shares with a fused clamp saturates like the clamp. The exception is a fused
    ReLU (clamp to [0, inf)): upstream's XNNPACKQuantizer annotates conv/linear + relu as one
    pattern, so the op's own handle ends with its float result and the quantize follows the relu.
    """
    value = stored if node.logs_stored else result
    if node.log_as_nchw:
        value = T["permute"](value, _TO_NCHW)
    return value.contiguous()
