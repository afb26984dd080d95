"""The quantized (q/dq) patterns XNNPACK runs as int8 nodes, as PT2E quantizers leave them in Edge graphs.

Static (EtlabQuantizer, upstream's XNNPACKQuantizer): activations pass through
`quantize_per_tensor -> dequantize_per_tensor`; weights are int8 constants read through
`dequantize_per_channel` (or per tensor); biases stay float. An operator whose activation inputs
all come from dequantize nodes, whose weights are such constants and whose result (after a
fused relu / hardtanh) only a quantize node reads runs as one quantized XNNPACK node: qint8 /
quint8 activations, qcint8 filters, a qcint32 bias. Everything else reads and writes float, with
XNNPACK Convert nodes where a value crosses between the two.

Dynamic (the same quantizers' dynamic mode): `choose_qparams.tensor -> quantize_per_tensor.tensor
-> dequantize_per_tensor.tensor` in front of a linear becomes one Convert to qdint8 (per-row
parameters chosen by XNNPACK at run time) and a fully connected node with qcint8 weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import Node

from etlab.compiler.backends.xnnpack._builder import QuantSpec
from etlab.compiler.backends.xnnpack._checks import (
    Context,
    DelegationRefusal,
    check_values,
    is_flattening_view,
    op_key,
    refusal,
    tensor_of,
)
from etlab.schema.xnnpack import XNNDatatype

QD = "quantized_decomposed"
Q_TENSOR, DQ_TENSOR = f"{QD}.quantize_per_tensor.default", f"{QD}.dequantize_per_tensor.default"
Q_DYNAMIC, DQ_DYNAMIC = f"{QD}.quantize_per_tensor.tensor", f"{QD}.dequantize_per_tensor.tensor"
DQ_CHANNEL = f"{QD}.dequantize_per_channel.default"
CHOOSE_QPARAMS = f"{QD}.choose_qparams.tensor"
_INT_DTYPES = {torch.int8: XNNDatatype.xnn_datatype_qint8, torch.uint8: XNNDatatype.xnn_datatype_quint8}
_FULL_RANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255)}
LINEAR_OPS = ("aten.addmm.default", "aten.mm.default", "aten.linear.default")
# operators run as quantized XNNPACK nodes (the rest compute in float between Converts)
QUANTIZED_OPS = {"aten.convolution.default", *LINEAR_OPS, "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor",
                 "aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.mean.dim",
                 "aten.cat.default", "aten.relu.default", "aten.hardtanh.default", "aten.clamp.default",
                 "aten.view_copy.default", "aten.permute_copy.default"}
# of those, the ones that cannot requantize: output parameters must equal the input's
SAME_PARAMS_OPS = {"aten.max_pool2d_with_indices.default", "aten.max_pool2d.default", "aten.cat.default",
                   "aten.relu.default", "aten.hardtanh.default", "aten.clamp.default", "aten.view_copy.default",
                   "aten.permute_copy.default"}


def is_q(node) -> bool:
    """Whether a node quantizes a tensor per-tensor (quantize_per_tensor)."""
    return isinstance(node, Node) and node.op == "call_function" and op_key(node) == Q_TENSOR


def is_dq(node) -> bool:
    """Whether a node dequantizes a tensor per-tensor (dequantize_per_tensor)."""
    return isinstance(node, Node) and node.op == "call_function" and op_key(node) == DQ_TENSOR


def is_quantized_source(node) -> bool:
    """What a dequantize reads: a quantize node, or an int8/uint8 input of the partition (its
    quantize fell into another partition)."""
    if is_q(node):
        return True
    t = tensor_of(node) if isinstance(node, Node) else None
    return isinstance(node, Node) and node.op == "placeholder" and t is not None and t.dtype in _INT_DTYPES


def q_params(node: Node) -> tuple[float, int, int, int, torch.dtype]:
    """(scale, zero point, qmin, qmax, dtype) of a per-tensor quantize/dequantize node."""
    scale, zero_point, qmin, qmax, dtype = node.args[1:6]
    return float(scale), int(zero_point), int(qmin), int(qmax), dtype


def spec_of(node: Node) -> QuantSpec:
    """The XNNPACK quantization of a q/dq node's output (datatype, scale, zero point)."""
    scale, zero_point, _qmin, _qmax, dtype = q_params(node)
    return QuantSpec(_INT_DTYPES[dtype], scale=scale, zero_point=zero_point)


_SHAPE_OPS = ("aten.view_copy.default", "aten.permute_copy.default")


def dequantized_source(node) -> Node | None:
    """The dequantize node a value is read from, directly or through views / permutes (which move
    int8 values as well as float ones); None if it is not such a value."""
    while isinstance(node, Node) and node.op == "call_function" and op_key(node) in _SHAPE_OPS:
        node = node.args[0]
    return node if is_dq(node) and is_quantized_source(node.args[0]) else None


def _same_params(a: Node, b: Node) -> bool:
    return q_params(a)[:2] == q_params(b)[:2] and q_params(a)[4] == q_params(b)[4]


# --- support rules ------------------------------------------------------------------------------


def _q_rule(node: Node, ctx: Context) -> DelegationRefusal | None:
    if any(isinstance(a, Node) for a in node.args[1:3]):
        return refusal("quantization", "quantization parameters are computed at run time outside a dynamic "
                       "linear pattern", "")
    _scale, _zp, qmin, qmax, dtype = q_params(node)
    if dtype not in _INT_DTYPES:
        return refusal("quantization", f"quantize to {dtype}; XNNPACK's activations are int8 or uint8",
                       "quantize activations to int8 (EtlabQuantizer's default)")
    if (qmin, qmax) != _FULL_RANGE[dtype]:
        return refusal("quantization", f"activation range [{qmin}, {qmax}] is narrower than {dtype}'s; XNNPACK "
                       "saturates at the type's limits", "use the full range for activations")
    return check_values(node, node.args[:1], dtypes=(torch.float32, torch.int8, torch.uint8)) if not is_dq(
        node.args[0]) else None


def _dq_rule(node: Node, ctx: Context) -> DelegationRefusal | None:
    source = node.args[0]
    if not is_q(source) and not ctx.is_constant(source):
        return refusal("quantization", "the dequantized value does not come from a quantize node XNNPACK runs",
                       "keep the quantize and dequantize pair together (quantize the producer too)")
    return _q_rule(node, ctx) if not ctx.is_constant(source) else None


def _dq_channel_rule(node: Node, ctx: Context) -> DelegationRefusal | None:
    if not ctx.is_constant(node):
        return refusal("quantization", "a per-channel dequantize of a value computed at run time; XNNPACK takes "
                       "per-channel int8 weights only", "")
    return None


def _is_quantized_weight(arg, ctx: Context) -> bool:
    """A weight read (through permutes) from a dequantize of an int8 constant."""
    while isinstance(arg, Node) and arg.op == "call_function" and op_key(arg) == "aten.permute_copy.default":
        arg = arg.args[0]
    return (isinstance(arg, Node) and arg.op == "call_function" and op_key(arg) in (DQ_CHANNEL, DQ_TENSOR)
            and ctx.is_constant(arg.args[0]) and tensor_of(arg.args[0]) is not None
            and tensor_of(arg.args[0]).dtype == torch.int8)


def dynamic_linear_users(dq: Node, ctx: Context) -> bool:
    """Every reader of a dynamic dequantize is a linear whose weight is a quantized constant, or a
    view merging leading dims (a linear on 3-D input) read only by such linears."""
    def linear_reads(node: Node, value: Node) -> bool:
        return (op_key(node) in LINEAR_OPS and linear_input(node) is value
                and _is_quantized_weight(_linear_weight(node), ctx))

    def ok(user: Node) -> bool:
        if is_flattening_view(user):
            return bool(user.users) and all(linear_reads(u, user) for u in user.users)
        return linear_reads(user, dq)
    return bool(dq.users) and all(ok(u) for u in dq.users)


def dynamic_source(x) -> Node | None:
    """The dynamic quantize node a linear's input comes from (through its dequantize and a
    flattening view), or None."""
    if is_flattening_view(x):
        x = x.args[0]
    if isinstance(x, Node) and x.op == "call_function" and op_key(x) == DQ_DYNAMIC:
        return x.args[0]
    return None


def _dynamic_rule(node: Node, ctx: Context) -> DelegationRefusal | None:
    """choose_qparams -> getitem -> quantize.tensor -> dequantize.tensor -> linear, as one pattern."""
    key = op_key(node)
    if key == CHOOSE_QPARAMS:
        quantizes = [u for item in node.users for u in item.users if op_key(u) == Q_DYNAMIC]
        ok = quantizes and all(_dynamic_q_ok(q, ctx) for q in quantizes)
    elif key == Q_DYNAMIC:
        ok = _dynamic_q_ok(node, ctx)
    else:
        ok = is_dynamic_q(node.args[0]) and _dynamic_q_ok(node.args[0], ctx)
    if not ok:
        return refusal("quantization", "dynamically quantized activations that do not feed linear layers with "
                       "int8 weights; XNNPACK quantizes at run time only the inputs of fully connected nodes",
                       "use the dynamic quantization config for linear layers only")
    x = node.args[0] if key != DQ_DYNAMIC else node.args[0].args[0]
    return check_values(x, [], dtypes=(torch.float32,))


def is_dynamic_q(node) -> bool:
    """Whether a node quantizes dynamically (its scale and zero point chosen at run time)."""
    return isinstance(node, Node) and node.op == "call_function" and op_key(node) == Q_DYNAMIC


def _dynamic_q_ok(q: Node, ctx: Context) -> bool:
    scale, zero_point = q.args[1:3]
    chooser = {getattr(a, "args", (None,))[0] for a in (scale, zero_point)}
    readers = list(q.users)
    return (len(chooser) == 1 and op_key(next(iter(chooser))) == CHOOSE_QPARAMS
            and q.args[5] == torch.int8 and readers
            and all(op_key(r) == DQ_DYNAMIC and dynamic_linear_users(r, ctx) for r in readers))


def _getitem_of_choose(node: Node, ctx: Context) -> DelegationRefusal | None:
    return _dynamic_rule(node.args[0], ctx)


QUANT_RULES = {Q_TENSOR: _q_rule, DQ_TENSOR: _dq_rule, DQ_CHANNEL: _dq_channel_rule,
               CHOOSE_QPARAMS: _dynamic_rule, Q_DYNAMIC: _dynamic_rule, DQ_DYNAMIC: _dynamic_rule}


def getitem_rule(node: Node, ctx: Context) -> DelegationRefusal | None:
    """getitem of choose_qparams (scale, zero point): part of the dynamic pattern."""
    source = node.args[0]
    if isinstance(source, Node) and op_key(source) == CHOOSE_QPARAMS:
        return _getitem_of_choose(node, ctx)
    return None


# --- which operators run quantized --------------------------------------------------------------


@dataclass(frozen=True)
class QuantWeight:
    """A weight as XNNPACK stores it: int8 data (already in the op's filter layout) and its scales."""

    data: torch.Tensor
    scales: torch.Tensor  # one per channel along `axis`, or a single scale
    axis: int

    def spec(self) -> QuantSpec:
        """The weight's XNNPACK quantization: per-tensor qint8, or per-channel qcint8 along `axis`."""
        if self.scales.numel() == 1 and self.axis < 0:
            return QuantSpec(XNNDatatype.xnn_datatype_qint8, scale=float(self.scales.reshape(())))
        return QuantSpec(XNNDatatype.xnn_datatype_qcint8, scales=tuple(float(s) for s in self.scales),
                         axis=self.axis)


def weight_source(arg, constants: dict) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(int8 data, scales, channel axis or -1) of a weight read through permutes of a dequantize of
    an int8 constant with zero zero-points; None when the weight is not such a constant."""
    perms = []
    node = arg
    while isinstance(node, Node) and node.op == "call_function" and op_key(node) == "aten.permute_copy.default":
        perms.append([int(p) for p in node.args[1]])
        node = node.args[0]
    if not isinstance(node, Node) or node.op != "call_function" or node.args[0] not in constants:
        return None
    key = op_key(node)
    data = constants[node.args[0]]
    if data.dtype != torch.int8:
        return None
    if key == DQ_CHANNEL:
        scales, zero_points = (constants.get(a) for a in node.args[1:3])
        axis = int(node.args[3])
        if scales is None or (zero_points is not None and bool((zero_points != 0).any())):
            return None
        scales = scales.reshape(-1).float()
    elif key == DQ_TENSOR:
        if int(node.args[2]) != 0:
            return None
        scales, axis = torch.tensor([float(node.args[1])]), -1
    else:
        return None
    for perm in reversed(perms):
        data = data.permute(perm)
        axis = perm.index(axis) if axis >= 0 else -1
    return data.contiguous(), scales, axis


def conv_weight(node: Node, constants: dict) -> QuantWeight | None:
    """A quantized convolution weight in torch's layout ([O, I/g, kh, kw], transposed: [I, O/g, kh, kw])
    with its channel axis; None unless XNNPACK takes its quantization (per output channel)."""
    found = weight_source(node.args[1], constants)
    if found is None:
        return None
    data, scales, axis = found
    transposed, groups = bool(node.args[6]), int(node.args[8])
    if axis >= 0 and (axis != (1 if transposed else 0) or (transposed and groups != 1)):
        return None
    return QuantWeight(data, scales, axis)


def fc_weight(node: Node, constants: dict) -> QuantWeight | None:
    """A quantized fully-connected filter ([out, in], scales per output row); None unless it is one."""
    found = weight_source(_linear_weight(node), constants)
    if found is None:
        return None
    data, scales, axis = found
    if op_key(node) != "aten.linear.default":  # addmm / mm read the transposed weight [in, out]
        data, axis = data.t().contiguous(), (1 - axis if axis >= 0 else -1)
    if axis not in (0, -1):
        return None
    return QuantWeight(data, scales, axis)


def linear_input(node: Node):
    """The activation operand of a linear-like node (addmm's second argument, mm's first)."""
    return node.args[1] if op_key(node) == "aten.addmm.default" else node.args[0]


def _linear_weight(node: Node):
    return node.args[2] if op_key(node) == "aten.addmm.default" else node.args[1]


def plan_quantized(calls: list[Node], constants: dict, consumers) -> dict[Node, Node]:
    """op node -> the quantize node its int8 result is written as, for ops that run quantized (and
    for views / permutes between such an op and its quantize, which move the int8 result)."""
    out: dict[Node, Node] = {}
    for node in calls:
        key = op_key(node)
        if key not in QUANTIZED_OPS or node in constants:
            continue
        readers, chain = consumers(node), []
        while len(readers) == 1 and op_key(next(iter(readers))) in _SHAPE_OPS and len(chain) < 4:
            chain.append(next(iter(readers)))  # a linear's view back to 3-D sits between it and its quantize
            readers = consumers(chain[-1])
        if len(readers) != 1 or not is_q(next(iter(readers))):
            continue
        q = next(iter(readers))
        if key in LINEAR_OPS:
            activations = [linear_input(node)]
        elif key == "aten.cat.default":
            activations = list(node.args[0])
        elif key in ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor"):
            activations = list(node.args[:2])
        else:
            activations = [node.args[0]]
        sources = [dequantized_source(a) for a in activations]
        if None in sources or any(a in constants and not (is_dq(a) and a.args[0] in constants) for a in sources):
            continue
        activations = sources
        if key == "aten.convolution.default" and conv_weight(node, constants) is None:
            continue
        if key in LINEAR_OPS and fc_weight(node, constants) is None:
            continue
        if key in SAME_PARAMS_OPS and not all(_same_params(a, q) for a in activations):
            continue
        if any(q_params(a)[4] != q_params(q)[4] for a in activations):
            continue
        for member in (node, *chain):
            out[member] = q
    return out


PRECISIONS = ("fp32", "static_quant", "dynamic_quant")


def precision_of(node: Node) -> str:
    """Which of upstream's precision classes a node belongs to: the q/dq nodes and the ops reading
    dequantized activations are static_quant (dynamic_quant for the run-time quantized pattern);
    everything else (weight dequantizes follow their readers) fp32."""
    key = op_key(node)
    if key in (CHOOSE_QPARAMS, Q_DYNAMIC, DQ_DYNAMIC) or (key == "getitem" and op_key(node.args[0]) == CHOOSE_QPARAMS):
        return "dynamic_quant"
    if key in (Q_TENSOR, DQ_TENSOR):
        return "static_quant"
    if key == DQ_CHANNEL or (key in _SHAPE_OPS and all(op_key(u) in LINEAR_OPS for u in node.users)):
        readers = [u for u in node.users if u.op == "call_function"]
        return precision_of(readers[0]) if readers else "fp32"
    inputs = [a for a in node.all_input_nodes if a.op == "call_function"]
    if any(dynamic_source(a) is not None for a in inputs):
        return "dynamic_quant"
    if any(dequantized_source(a) is not None for a in inputs) or any(is_q(u) for u in node.users):
        return "static_quant"
    return "fp32"


def quantize_bias(bias: torch.Tensor, input_scale: float, weight: QuantWeight) -> tuple[torch.Tensor, QuantSpec]:
    """A float bias as XNNPACK's int32 bias: scale input_scale * weight scale (per channel)."""
    scales = (input_scale * weight.scales.double()).reshape(-1)
    levels = torch.round(bias.double().reshape(-1) / scales).clamp(-(2 ** 31), 2 ** 31 - 1).to(torch.int32)
    if scales.numel() == 1:
        return levels, QuantSpec(XNNDatatype.xnn_datatype_qint32, scale=float(scales[0]))
    return levels, QuantSpec(XNNDatatype.xnn_datatype_qcint32, scales=tuple(float(s) for s in scales), axis=0)


def tensor_dtype(node) -> torch.dtype | None:
    """The dtype of a node's tensor value, or None."""
    t = tensor_of(node)
    return None if t is None else t.dtype
