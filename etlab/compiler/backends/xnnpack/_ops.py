"""Float lowering of each supported Edge operator into XNNPACK nodes (one handler per operator).

A handler reads its node's operands through `Lowering.value(node, layout)` (which writes layout
transposes and constants as needed), defines the node's value with `Lowering.define` and writes
the XNNPACK node(s). The rules in `_support` have already accepted the node.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import Node

from etlab.compiler._delegation_lowering import DelegationError
from etlab.compiler.backends.xnnpack._builder import QuantSpec
from etlab.compiler.backends.xnnpack._checks import dim_upper, op_key
from etlab.compiler.backends.xnnpack._fusion import activation_bounds
from etlab.compiler.backends.xnnpack._layout import cheaper_layout
from etlab.compiler.backends.xnnpack._lower import (
    FLAG_ALIGN_CORNERS,
    FLAG_KEEP_DIMS,
    NCHW,
    NHWC,
    TO_NHWC,
    Lowering,
    _permuted,
    _same_memory_order,
    channels_first,
    channels_last,
)
from etlab.compiler.backends.xnnpack._quant import (
    Q_DYNAMIC,
    Q_TENSOR,
    QuantWeight,
    conv_weight,
    dequantized_source,
    dynamic_source,
    fc_weight,
    is_dq,
    linear_input,
    q_params,
    quantize_bias,
    spec_of,
)
from etlab.schema.xnnpack import XNNDatatype

Handler = Callable[[Lowering, Node], None]
_MAX_CONCAT = 5


def _arg(node: Node, index: int, name: str, default=None):
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


# --- elementwise --------------------------------------------------------------------------------


def _unary(kind: str) -> Handler:
    def lower(lw: Lowering, node: Node) -> None:
        quantized = node in lw.qplan  # a clamp between a dequantize and a quantize of one parameter set
        layout = lw.preferred_layout(node.args[0])
        x = lw.operand(node.args[0], layout, quantized)
        out = lw.result(node, lw.out_shape(node, layout), layout)
        extra = {}
        if kind == "XNNELU":
            extra["alpha"] = float(_arg(node, 1, "alpha", 1.0))
        elif kind == "XNNLeakyReLU":
            extra["negative_slope"] = float(_arg(node, 1, "negative_slope", 0.01))
        clamp = activation_bounds(node) if kind == "XNNClamp" else lw.clamp_of(node)
        lw.b.node(kind, lw.handle(node), clamp, input_id=x, output_id=out, **extra)
    return lower


def _broadcast_constant(lw: Lowering, node: Node, layout: str, rank: int, quantized: bool = False) -> int:
    """A constant operand of a binary op, in the layout of its 4-D partner (padded to its rank); for
    an op running quantized, the int8 constant behind its dequantize, with that quantization."""
    spec = None
    if quantized and is_dq(node) and node.args[0] in lw.constants:
        data, spec = lw.constants[node.args[0]], spec_of(node)
    else:
        data = lw.constants[node].float()
    if layout == NHWC:
        data = data.reshape([1] * (rank - data.dim()) + list(data.shape)).permute(channels_last(rank))
    elif data.dim() == 0:
        data = data.reshape(1)
    return lw.constant(node, data, f"operand-{layout}-{rank}-{spec is not None}", quant=spec)


def _binary(kind: str) -> Handler:
    def lower(lw: Lowering, node: Node) -> None:
        a, b = (lw.resolve(x) for x in node.args[:2])
        rank = lw.tensor(node).dim()
        live = [x for x in (a, b) if x not in lw.constants]
        quantized = node in lw.qplan
        # NHWC when an operand already is and every live operand has the result's rank, 4-D or 3-D (the
        # [N, L, C] form a 1-D convolution writes); constants follow.
        nhwc = (rank in (3, 4) and any(lw.has(x, NHWC) for x in live)
                and all(lw.tensor(x).dim() == rank for x in live))
        layout = NHWC if nhwc else NCHW
        if not quantized and rank in (3, 4) and all(lw.tensor(x).dim() == rank for x in live):
            layout = cheaper_layout(lw, node, live, layout)  # the consumers count too
        ids = [_broadcast_constant(lw, x, layout, rank, quantized) if x in lw.constants
               else lw.operand(x, layout, quantized) for x in (a, b)]
        out = lw.result(node, lw.out_shape(node, layout), layout)
        lw.b.node(kind, lw.handle(node), lw.clamp_of(node), input1_id=ids[0], input2_id=ids[1], output_id=out)
    return lower


def _square(lw: Lowering, node: Node) -> None:
    _unary("XNNSquare")(lw, node)


# --- convolution and matrix products -------------------------------------------------------------


def _conv_weights(lw: Lowering, node: Node) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = _unit_width(lw.constant_of(node, node.args[1], "weight").float())
    bias = lw.constant_of(node, node.args[2], "bias").float() if node.args[2] is not None else None
    bn = lw.plan.batch_norm.get(node)
    if bn is not None:
        gamma, beta, mean, var = (lw.constant_of(bn, a, "batch norm parameter").float() if a is not None else None
                                  for a in bn.args[1:5])
        eps = float(bn.args[6])
        scale = torch.rsqrt(var + eps) * (gamma if gamma is not None else 1.0)
        transposed = bool(node.args[6])
        if transposed:  # weight [in, out/groups, kh, kw]: out channels along dim 1 within each group
            groups = int(node.args[8])
            w = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:])
            w = w * scale.reshape(groups, 1, -1, 1, 1)
            weight = w.reshape(weight.shape)
        else:
            weight = weight * scale.reshape(-1, 1, 1, 1)
        shift = beta if beta is not None else torch.zeros_like(mean)
        bias = (bias if bias is not None else torch.zeros_like(mean)) * scale + (shift - mean * scale)
    return weight, bias


def _filter_layout(weight: torch.Tensor, transposed: bool, depthwise: bool, groups: int) -> torch.Tensor:
    """Torch's conv weight as XNNPACK's filter: OHWI; depthwise 1HWO; deconvolution OHWI per group."""
    if transposed or depthwise:
        g = groups if transposed else 1
        shape = weight.shape
        w = weight.reshape(g, shape[0] // g, *shape[1:]).transpose(1, 2)
        weight = w.reshape(shape[1] * g, shape[0] // g, *shape[2:])
    return weight.permute(TO_NHWC)  # a view: the builder writes its bytes in this order, copying once


def _unit_width(weight: torch.Tensor) -> torch.Tensor:
    """A 1-D convolution's weight [O, I/g, K] as the 2-D one over a unit width, [O, I/g, K, 1]."""
    return weight.unsqueeze(3) if weight.dim() == 3 else weight


def _nhwc_target(dims) -> list[int]:
    """A reshape's new shape from symbolic dims: static ones as they are, 0 for the dynamic one."""
    return [d if isinstance(d, int) else 0 for d in dims]


def _convolution(lw: Lowering, node: Node) -> None:
    """A 2-D convolution in NHWC. A 1-D one ([N, C, L]) is the 2-D convolution over a unit width, as
    upstream writes it: its input's channels-last form [N, L, C] is reshaped to [N, L, 1, C] (same
    memory), and the [N, L', 1, C'] result back to [N, L', C'], the result's channels-last form. Over a
    unit height instead ([N, 1, L, C], kernel 1 x K) XNNPACK ran Wav2Letter 1.5x slower on one thread."""
    quantized = node in lw.qplan
    x = lw.operand(node.args[0], NHWC, quantized)
    stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
    if lw.tensor(node.args[0]).dim() == 3:
        stride, padding, dilation = [*stride, 1], [*padding, 0], [*dilation, 1]
        output_padding = [*output_padding, 0]
        n, c, length = lw.tensor(node.args[0]).shape
        x4 = lw.temp([dim_upper(n), dim_upper(length), 1, dim_upper(c)], lw.quant.get(x))
        target = _nhwc_target([n, length, 1, c])
        lw.b.node("XNNStaticReshape", lw.handle(node), num_dims=4, new_shape=target, input_id=x, output_id=x4)
        x = x4
    qweight = conv_weight(node, lw.constants) if quantized else None
    if qweight is not None:
        weight = _unit_width(qweight.data)
        bias = lw.constant_of(node, node.args[2], "bias").float() if node.args[2] is not None else None
    else:
        weight, bias = _conv_weights(lw, node)
    groups = int(groups)
    if transposed:
        group_in, group_out = weight.shape[0] // groups, weight.shape[1]
    else:
        group_in, group_out = weight.shape[1], weight.shape[0] // groups
    depthwise = group_in == 1 and not transposed and group_out % group_in == 0
    if depthwise and groups == 1 and group_out > 1:
        depthwise = True  # one input channel: a depthwise convolution with channel multiplier O
    kind = "XNNDepthwiseConv2d" if depthwise else "XNNConvTranspose2d" if transposed else "XNNConv2d"
    filt = _filter_layout(weight, bool(transposed), depthwise, groups)
    if qweight is not None:
        # the output-channel axis moves with the filter layout: depthwise 1HWO keeps it last
        axis = -1 if qweight.axis < 0 else (3 if depthwise else 0)
        qw = QuantWeight(filt, qweight.scales, axis)
        filter_id = lw.constant(node, filt, "qfilter", quant=qw.spec(), datatype=qw.spec().datatype)
        bias_id = _quantized_bias(lw, node, bias, qw) if bias is not None else lw.unused_id()
    else:
        filter_id = lw.constant(node, filt, "filter")
        bias_id = lw.constant(node, bias.contiguous(), "bias") if bias is not None else lw.unused_id()
    out = lw.result(node, lw.out_shape(node, NHWC), NHWC)
    out3 = None
    if lw.tensor(node).dim() == 3:  # the convolution writes [N, L', 1, C']; a reshape gives the result
        n, c, length = (dim_upper(d) for d in lw.tensor(node).shape)
        out3, out = out, lw.temp([n, length, 1, c], lw.quant.get(out))
    pad = list(padding) * (2 // len(padding)) if len(padding) == 1 else list(padding)
    two = (lambda v: list(v) * 2 if len(v) == 1 else list(v))
    stride, dilation, output_padding = two(stride), two(dilation), two(output_padding)
    lw.b.node(kind, lw.handle(node), lw.clamp_of(node),
              padding_top=pad[0], padding_right=pad[1], padding_bottom=pad[0], padding_left=pad[1],
              kernel_height=int(weight.shape[2]), kernel_width=int(weight.shape[3]),
              subsampling_height=stride[0], subsampling_width=stride[1],
              dilation_height=dilation[0], dilation_width=dilation[1],
              group_input_channels=group_in, group_output_channels=group_out, groups=groups,
              adjustment_height=output_padding[0], adjustment_width=output_padding[1],
              input1_id=x, filter_id=filter_id, bias_id=bias_id, output_id=out)
    if out3 is not None:
        n, c, length = lw.tensor(node).shape
        lw.b.node("XNNStaticReshape", lw.handle(node), num_dims=3, new_shape=_nhwc_target([n, length, c]),
                  input_id=out, output_id=out3)


def _quantized_bias(lw: Lowering, node: Node, bias: torch.Tensor, weight: QuantWeight) -> int:
    activation = node.args[0] if op_key(node) == "aten.convolution.default" else linear_input(node)
    input_scale = q_params(dequantized_source(lw.resolve(activation)))[0]
    levels, spec = quantize_bias(bias, input_scale, weight)
    return lw.constant(node, levels, "qbias", quant=spec, datatype=spec.datatype)


def _batch_norm(lw: Lowering, node: Node) -> None:
    """A batch norm no convolution absorbed. Over (N, C, H, W) in NHWC (after a concatenation of
    convolutions: DenseNet's pre-activation norms) it is a 1x1 depthwise convolution, as upstream writes
    it: one pass over the tensor, the activation after it fused as its clamp. Otherwise y = x * scale +
    shift, per channel, the activation fused into the add."""
    x_node = node.args[0]
    gamma, beta, mean, var = (lw.constant_of(node, a, "batch norm parameter").float() if a is not None else None
                              for a in node.args[1:5])
    eps = float(node.args[6])
    scale = torch.rsqrt(var + eps) * (gamma if gamma is not None else 1.0)
    shift = (beta if beta is not None else torch.zeros_like(mean)) - mean * scale
    layout = lw.preferred_layout(x_node)
    x = lw.value(x_node, layout)
    rank = lw.tensor(x_node).dim()
    if rank == 4 and layout == NHWC:
        channels = scale.numel()
        filter_id = lw.constant(node, scale.reshape(1, 1, 1, channels).contiguous(), "bn-dw-filter")
        bias_id = lw.constant(node, shift.contiguous(), "bn-dw-bias")
        out = lw.define(node, lw.out_shape(x_node, NHWC), NHWC)
        lw.b.node("XNNDepthwiseConv2d", lw.handle(node), lw.clamp_of(node),
                  padding_top=0, padding_right=0, padding_bottom=0, padding_left=0, kernel_height=1, kernel_width=1,
                  subsampling_height=1, subsampling_width=1, dilation_height=1, dilation_width=1,
                  group_input_channels=1, group_output_channels=1, groups=channels,
                  adjustment_height=0, adjustment_width=0,
                  input1_id=x, filter_id=filter_id, bias_id=bias_id, output_id=out)
        return
    shape = [-1] if layout == NHWC else [-1] + [1] * (rank - 2)
    scale_id = lw.constant(node, scale.reshape(shape).contiguous(), f"bn-scale-{layout}")
    shift_id = lw.constant(node, shift.reshape(shape).contiguous(), f"bn-shift-{layout}")
    shape_out = lw.out_shape(x_node, layout)
    scaled = lw.temp(shape_out)
    handle = lw.handle(node)
    lw.b.node("XNNMultiply", handle, input1_id=x, input2_id=scale_id, output_id=scaled)
    out = lw.define(node, shape_out, layout)
    lw.b.node("XNNAdd", handle, lw.clamp_of(node), input1_id=scaled, input2_id=shift_id, output_id=out)


def _fully_connected(lw: Lowering, node: Node) -> None:
    key = op_key(node)
    if key == "aten.addmm.default":
        bias, x, weight = node.args[:3]
    elif key == "aten.linear.default":
        x, weight, bias = node.args[0], node.args[1], _arg(node, 2, "bias")
    else:
        (x, weight), bias = node.args[:2], None
    static = node in lw.qplan
    source = dynamic_source(x)
    dynamic = source is not None
    qweight = fc_weight(node, lw.constants) if static or dynamic else None
    bias_value = lw.constant_of(node, bias, "bias").float().reshape(-1) if bias is not None else None
    if qweight is not None:
        spec = qweight.spec()
        filter_id = lw.constant(node, qweight.data, "qfc-filter", quant=spec, datatype=spec.datatype)
    else:
        filt = lw.constant_of(node, weight, "weight").float()
        filt = filt if key == "aten.linear.default" else filt.t()
        filter_id = lw.constant(lw.resolve(weight), filt, "fc-filter")
    if dynamic:  # activations quantized per row at run time by the Convert the dynamic quantize wrote
        x_id = lw.value(source, NCHW)
    else:
        x_id = lw.operand(x, NCHW, static)
    if bias_value is None:
        bias_id = lw.unused_id()
    elif static:
        bias_id = _quantized_bias(lw, node, bias_value, qweight)
    else:
        bias_id = lw.constant(lw.resolve(bias), bias_value, "fc-bias")
    shape = lw.out_shape(lw.plan.unflatten.get(node, node), NCHW)  # N-D when the views around it fold
    handle = lw.handle(node)
    in_shape = lw.out_shape(source, NCHW) if dynamic else None
    if dynamic and len(in_shape) != len(shape):  # the flattening view folded: reshape the product back
        out = lw.temp([*in_shape[:-1], shape[-1]])
        lw.b.node("XNNFullyConnected", handle, lw.clamp_of(node), input1_id=x_id, filter_id=filter_id,
                  bias_id=bias_id, output_id=out)
        final = lw.result(node, shape, NCHW)
        target = lw.reshape_target(node)
        lw.b.node("XNNStaticReshape", handle, num_dims=len(target), new_shape=target, input_id=out, output_id=final)
        return
    out = lw.result(node, shape, NCHW)
    lw.b.node("XNNFullyConnected", handle, lw.clamp_of(node), input1_id=x_id, filter_id=filter_id,
              bias_id=bias_id, output_id=out)


def _bmm(lw: Lowering, node: Node) -> None:
    a, b = (lw.value(x, NCHW) for x in node.args[:2])
    out = lw.define(node, lw.out_shape(node, NCHW), NCHW)
    lw.b.node("XNNBatchMatrixMultiply", lw.handle(node), input1_id=a, input2_id=b, output_id=out)


# --- pooling ------------------------------------------------------------------------------------


def _pool_args(node: Node, has_dilation: bool):
    two = (lambda v: list(v) * 2 if len(v) == 1 else list(v))
    kernel = two(node.args[1])
    stride = two(_arg(node, 2, "stride", None) or kernel)
    padding = two(_arg(node, 3, "padding", [0, 0]))
    dilation = two(_arg(node, 4, "dilation", [1, 1])) if has_dilation else [1, 1]
    return kernel, stride, padding, dilation


def _max_pool(lw: Lowering, node: Node) -> None:
    kernel, stride, padding, dilation = _pool_args(node, True)
    x = lw.operand(node.args[0], NHWC, node in lw.qplan)
    in_shape = lw.tensor(node.args[0]).shape
    out_val = lw.tensor(node)
    extra = []
    for axis in (0, 1):  # ceil_mode: pad the far edge so the last window fits
        needed = ((out_val.shape[2 + axis] - 1) * stride[axis] + dilation[axis] * (kernel[axis] - 1) + 1
                  - (in_shape[2 + axis] + 2 * padding[axis]))
        extra.append(max(0, int(needed)))
    out = lw.result(node, _permuted(out_val.shape, TO_NHWC), NHWC)
    lw.b.node("XNNMaxPooling2d", lw.handle(node), padding_top=padding[0], padding_right=padding[1] + extra[1],
              padding_bottom=padding[0] + extra[0], padding_left=padding[1], pooling_height=kernel[0],
              pooling_width=kernel[1], stride_height=stride[0], stride_width=stride[1],
              dilation_height=dilation[0], dilation_width=dilation[1], input_id=x, output_id=out,
              flags=FLAG_KEEP_DIMS)


def _avg_pool(lw: Lowering, node: Node) -> None:
    kernel, stride, padding, _ = _pool_args(node, False)
    x = lw.value(node.args[0], NHWC)
    out = lw.define(node, lw.out_shape(node, NHWC), NHWC)
    lw.b.node("XNNAvgPooling2d", lw.handle(node), padding_top=padding[0], padding_right=padding[1],
              padding_bottom=padding[0], padding_left=padding[1], pooling_height=kernel[0], pooling_width=kernel[1],
              stride_height=stride[0], stride_width=stride[1], dilation_height=1, dilation_width=1,
              input_id=x, output_id=out, flags=FLAG_KEEP_DIMS)


def _mean(lw: Lowering, node: Node) -> None:
    """Mean over H and W: global average pooling in NHWC ([N, 1, 1, C]); without keepdim a reshape
    to [N, C] follows, reading the pooled value directly (1x1 spatial: same memory order)."""
    x_node = node.args[0]
    q = lw.qplan.get(node)
    x = lw.operand(x_node, NHWC, q is not None)
    n, c = lw.out_shape(x_node, NCHW)[:2]
    keepdim = bool(_arg(node, 2, "keepdim", False))
    handle = lw.handle(node)
    pooled = lw.result(node, [n, 1, 1, c], NHWC) if keepdim else lw.temp([n, 1, 1, c], spec_of(q) if q else None)
    lw.b.node("XNNGlobalAvgPooling2d", handle, input_id=x, output_id=pooled, flags=FLAG_KEEP_DIMS)
    if not keepdim:
        out = lw.result(node, [n, c], NCHW)
        lw.b.node("XNNStaticReshape", handle, num_dims=2, new_shape=lw.reshape_target(node), input_id=pooled,
                  output_id=out)


def _upsample_bilinear(lw: Lowering, node: Node) -> None:
    x = lw.value(node.args[0], NHWC)
    shape = lw.out_shape(node, NCHW)
    out = lw.define(node, _permuted(shape, TO_NHWC), NHWC)
    lw.b.node("XNNStaticResizeBilinear2D", lw.handle(node), new_height=shape[2], new_width=shape[3], input_id=x,
              output_id=out, flags=FLAG_ALIGN_CORNERS if node.args[2] else 0)


# --- shapes -------------------------------------------------------------------------------------


def _softmax(lw: Lowering, node: Node) -> None:
    x = lw.value(node.args[0], NCHW)
    out = lw.define(node, lw.out_shape(node, NCHW), NCHW)
    lw.b.node("XNNSoftmax", lw.handle(node), input_id=x, output_id=out)


def _layout_dim(dim: int, rank: int, layout: str) -> int:
    dim %= rank
    return channels_last(rank).index(dim) if layout == NHWC else dim


def _cat(lw: Lowering, node: Node) -> None:
    tensors = [lw.resolve(t) for t in node.args[0]]
    rank = lw.tensor(node).dim()
    dim = _arg(node, 1, "dim", 0)
    live = [t for t in tensors if t not in lw.constants]
    nhwc = rank in (3, 4) and sum(lw.has(t, NHWC) for t in live) * 2 > len(live)
    layout = NHWC if nhwc else NCHW
    q = lw.qplan.get(node)
    if q is None and rank in (3, 4):
        layout = cheaper_layout(lw, node, live, layout)  # the consumers count too
    axis = _layout_dim(dim, rank, layout)
    ids = [lw.operand(t, layout, q is not None) for t in tensors]
    sizes = [lw.out_shape(t, layout)[axis] for t in tensors]
    handle = lw.handle(node)
    while len(ids) > _MAX_CONCAT:  # XNNPACK concatenates up to five at once: fold the head first
        shape = lw.out_shape(node, layout)
        shape[axis] = sum(sizes[:_MAX_CONCAT])
        partial = lw.temp(shape, spec_of(q) if q else None)
        _write_concat(lw, handle, ids[:_MAX_CONCAT], axis, partial)
        ids, sizes = [partial, *ids[_MAX_CONCAT:]], [shape[axis], *sizes[_MAX_CONCAT:]]
    out = lw.result(node, lw.out_shape(node, layout), layout)
    _write_concat(lw, handle, ids, axis, out)


def _write_concat(lw: Lowering, handle, ids: list[int], axis: int, out: int) -> None:
    attrs = {f"input{i + 1}_id": vid for i, vid in enumerate(ids)}
    lw.b.node(f"XNNConcatenate{len(ids)}", handle, axis=axis, output_id=out, **attrs)


def _slice(lw: Lowering, node: Node) -> None:
    x_node = node.args[0]
    shape = lw.out_shape(x_node, NCHW)
    rank = len(shape)
    dim = _arg(node, 1, "dim", 0) % rank
    start, end = _arg(node, 2, "start", None), _arg(node, 3, "end", None)
    start = 0 if start is None else (start + shape[dim] if start < 0 else start)
    end = shape[dim] if end is None else (end + shape[dim] if end < 0 else end)
    start, end = max(0, min(start, shape[dim])), max(0, min(end, shape[dim]))
    layout = lw.preferred_layout(x_node) if rank in (3, 4) else NCHW
    offsets, sizes = [0] * rank, list(shape)
    offsets[dim], sizes[dim] = start, end - start
    if layout == NHWC:
        offsets, sizes = _permuted(offsets, channels_last(rank)), _permuted(sizes, channels_last(rank))
    x = lw.value(x_node, layout)
    out = lw.define(node, sizes, layout)
    lw.b.node("XNNStaticSlice", lw.handle(node), num_dims=rank, offsets=offsets, sizes=sizes, input_id=x,
              output_id=out)


def _select(lw: Lowering, node: Node) -> None:
    x_node = node.args[0]
    shape = lw.out_shape(x_node, NCHW)
    dim = node.args[1] % len(shape)
    index = node.args[2] + shape[dim] if node.args[2] < 0 else node.args[2]
    offsets, sizes = [0] * len(shape), list(shape)
    offsets[dim], sizes[dim] = index, 1
    x = lw.value(x_node, NCHW)
    handle = lw.handle(node)
    sliced = lw.temp(sizes)
    lw.b.node("XNNStaticSlice", handle, num_dims=len(shape), offsets=offsets, sizes=sizes, input_id=x,
              output_id=sliced)
    new_shape = lw.out_shape(node, NCHW) or [1]
    out = lw.define(node, new_shape, NCHW)
    lw.b.node("XNNStaticReshape", handle, num_dims=len(new_shape), new_shape=new_shape, input_id=sliced,
              output_id=out)


def _reshape(lw: Lowering, node: Node) -> None:
    x_node = lw.resolve(node.args[0])
    in_shape = lw.out_shape(x_node, NCHW)
    # A value held only as NHWC whose memory order equals NCHW's (1x1 spatial) is reshaped as is.
    direct = (x_node not in lw.constants and not lw.has(x_node, NCHW) and lw.has(x_node, NHWC)
              and _same_memory_order(in_shape))
    quantized = node in lw.qplan
    x = lw.operand(x_node, NHWC if direct else NCHW, quantized)
    out = lw.result(node, lw.out_shape(node, NCHW) or [1], NCHW)
    target = lw.reshape_target(node)
    lw.b.node("XNNStaticReshape", lw.handle(node), num_dims=len(target), new_shape=target, input_id=x,
              output_id=out)


def _permute(lw: Lowering, node: Node) -> None:
    x_node = lw.resolve(node.args[0])
    perm = [int(p) % len(node.args[1]) for p in node.args[1]]  # (x_node may be a 2-D matmul it unflattens)
    quantized = node in lw.qplan
    if x_node not in lw.constants and not lw.has(x_node, NCHW) and lw.has(x_node, NHWC):
        x = lw.operand(x_node, NHWC, quantized)
        back = channels_first(len(perm))
        perm = [back[p] for p in perm]  # x = x_nhwc.permute(channels_first), so compose
    else:
        x = lw.operand(x_node, NCHW, quantized)
    out = lw.result(node, lw.out_shape(node, NCHW), NCHW)
    lw.b.node("XNNStaticTranspose", lw.handle(node), num_dims=len(perm), perm=perm, input_id=x, output_id=out)


def _int8_view(lw: Lowering, node: Node, layout: str) -> int:
    """A view / permute applied to the int8 value behind a dequantize (for an op running quantized)."""
    x = lw.qvalue(lw.resolve(node.args[0]), NCHW)
    spec = lw.quant[x]
    shape = lw.out_shape(node, NCHW)
    out = lw.temp(shape, spec)
    if op_key(node) == "aten.permute_copy.default":
        perm = [int(p) % len(shape) for p in node.args[1]]
        lw.b.node("XNNStaticTranspose", lw.handle(node), num_dims=len(perm), perm=perm, input_id=x, output_id=out)
    else:
        target = lw.reshape_target(node)
        lw.b.node("XNNStaticReshape", lw.handle(node), num_dims=len(target), new_shape=target, input_id=x,
                  output_id=out)
    if layout == NHWC:
        raise DelegationError.at(node, "XnnpackBackend: an int8 view read in NHWC (not supported)")
    return out


def _pad(lw: Lowering, node: Node) -> None:
    x_node = node.args[0]
    rank = lw.tensor(x_node).dim()
    pads = list(node.args[1])
    pre, post = [0] * rank, [0] * rank
    for i in range(len(pads) // 2):
        pre[rank - 1 - i], post[rank - 1 - i] = pads[2 * i], pads[2 * i + 1]
    layout = lw.preferred_layout(x_node) if rank in (3, 4) else NCHW
    if layout == NHWC:
        pre, post = _permuted(pre, channels_last(rank)), _permuted(post, channels_last(rank))
    x = lw.value(x_node, layout)
    out = lw.define(node, lw.out_shape(node, layout), layout)
    lw.b.node("XNNStaticConstantPad", lw.handle(node), pre_paddings=pre, post_paddings=post,
              padding_value=float(_arg(node, 2, "value", 0.0)), input_id=x, output_id=out)


def _copy(lw: Lowering, node: Node) -> None:
    layout = lw.preferred_layout(node.args[0])
    x = lw.value(node.args[0], layout)
    out = lw.define(node, lw.out_shape(node, layout), layout, quant=lw.quant.get(x))
    lw.b.node("XNNCopy", lw.handle(node), input_id=x, output_id=out)


def _quantize(lw: Lowering, node: Node) -> None:
    """A float value entering the int8 domain: one Convert (the producer did not run quantized)."""
    layout = lw.preferred_layout(node.args[0])
    x = lw.value(node.args[0], layout)
    out = lw.define(node, lw.out_shape(node, layout), layout, quant=spec_of(node))
    lw.b.node("XNNConvert", lw.handle(node), input_id=x, output_id=out)


def _quantize_dynamic(lw: Lowering, node: Node) -> None:
    """A linear's input quantized per row at run time: a Convert to qdint8 (XNNPACK picks the
    parameters; choose_qparams and the dequantize have no node of their own)."""
    x = lw.value(node.args[0], NCHW)
    shape = lw.out_shape(node, NCHW)
    spec = QuantSpec(XNNDatatype.xnn_datatype_qdint8, nonbatch_dims=1)
    out = lw.define(node, shape, NCHW, quant=spec, datatype=spec.datatype)
    lw.b.node("XNNConvert", lw.handle(node), input_id=x, output_id=out)


HANDLERS: dict[str, Handler] = {
    "int8 view": _int8_view,
    Q_TENSOR: _quantize, Q_DYNAMIC: _quantize_dynamic,
    "aten.add.Tensor": _binary("XNNAdd"), "aten.sub.Tensor": _binary("XNNSubtract"),
    "aten.mul.Tensor": _binary("XNNMultiply"), "aten.div.Tensor": _binary("XNNDiv"),
    "aten.div.Tensor_mode": _binary("XNNDiv"),
    "aten.maximum.default": _binary("XNNMaximum"), "aten.minimum.default": _binary("XNNMinimum"),
    "aten.relu.default": _unary("XNNClamp"), "aten.hardtanh.default": _unary("XNNClamp"),
    "aten.clamp.default": _unary("XNNClamp"),
    "aten.sigmoid.default": _unary("XNNSigmoid"), "aten.tanh.default": _unary("XNNTanh"),
    "aten.hardswish.default": _unary("XNNHardswish"), "aten.gelu.default": _unary("XNNGelu"),
    "aten.exp.default": _unary("XNNExp"), "aten.log.default": _unary("XNNLog"),
    "aten.sqrt.default": _unary("XNNSquareRoot"), "aten.rsqrt.default": _unary("XNNReciprocalSquareRoot"),
    "aten.abs.default": _unary("XNNAbs"), "aten.neg.default": _unary("XNNNegate"),
    "aten.floor.default": _unary("XNNFloor"), "aten.ceil.default": _unary("XNNCeiling"),
    "aten.elu.default": _unary("XNNELU"), "aten.leaky_relu.default": _unary("XNNLeakyReLU"),
    "aten.pow.Tensor_Scalar": _square,
    "aten.convolution.default": _convolution,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.addmm.default": _fully_connected, "aten.mm.default": _fully_connected,
    "aten.linear.default": _fully_connected, "aten.bmm.default": _bmm,
    "aten.max_pool2d_with_indices.default": _max_pool, "aten.max_pool2d.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool, "aten.mean.dim": _mean,
    "aten.upsample_bilinear2d.vec": _upsample_bilinear,
    "aten._softmax.default": _softmax, "aten.cat.default": _cat,
    "aten.slice_copy.Tensor": _slice, "aten.select_copy.int": _select,
    "aten.view_copy.default": _reshape, "aten.squeeze_copy.dims": _reshape, "aten.squeeze_copy.dim": _reshape,
    "aten.unsqueeze_copy.default": _reshape, "aten.permute_copy.default": _permute,
    "aten.constant_pad_nd.default": _pad,
    "dim_order_ops._clone_dim_order.default": _copy, "aten.clone.default": _copy,
    "aten.alias_copy.default": _copy,
}
