"""XNNPACK node kinds emulated with torch kernels: one builder per kind, checked when a delegate loads.

A builder reads a node's attributes, checks them (ids, flags, paddings, axes) and returns a
`NodeKernel`: the value ids it reads and writes and a function of float tensors in XNNPACK's own
layouts (NHWC activations, OHWI / 1HWO filters). Anything not in `BUILDERS` fails the load with
the node kind named. The torch functions used are listed once, in `TORCH_CALLS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from etlab.errors import FormatError
from etlab.runtime.backends.xnnpack._prepacked import prepacked_conv2d, prepacked_linear
from etlab.runtime.backends.xnnpack._values import ValueSpec

# Every torch call the emulation makes (backend-internal: none of them is a program operator).
TORCH_CALLS: dict[str, Callable] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "minimum": torch.minimum, "maximum": torch.maximum,
    "linear": F.linear, "matmul": torch.matmul, "conv2d": F.conv2d, "conv_transpose2d": F.conv_transpose2d,
    "pad": F.pad, "max_pool2d": F.max_pool2d, "avg_pool2d": F.avg_pool2d, "mean": torch.mean,
    "softmax": torch.softmax, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "hardswish": F.hardswish,
    "elu": F.elu, "leaky_relu": F.leaky_relu, "gelu": F.gelu, "abs": torch.abs, "neg": torch.neg,
    "square": torch.square, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "floor": torch.floor, "ceil": torch.ceil,
    "log": torch.log, "exp": torch.exp, "sin": torch.sin, "cos": torch.cos, "clamp": torch.clamp,
    "cat": torch.cat, "permute": torch.permute, "reshape": torch.reshape, "narrow": torch.narrow,
    "interpolate": F.interpolate, "where": torch.where, "round": torch.round, "amin": torch.amin,
    "amax": torch.amax, "transpose": torch.transpose,
    "ones_like": torch.ones_like, "clone": torch.clone,
}
T = TORCH_CALLS

FLAG_TRANSPOSE_WEIGHTS = 0x1      # fully connected: filter is [in, out]; batch matmul: B is transposed
FLAG_DEPTHWISE = 0x1              # convolution: (informational) depthwise
FLAG_ALIGN_CORNERS = 0x8
FLAG_TENSORFLOW_LEGACY = 0x4
FLAG_KEEP_DIMS = 0x40
INVALID_ID = (1 << 32) - 1


@dataclass
class NodeKernel:
    """The kernel of one node: value ids and the function, and for nodes with constant weights a builder of the
    prepacked variant."""

    inputs: tuple[int, ...]
    output: int
    fn: Callable[..., torch.Tensor]
    # For nodes whose weights are constants: (weight, bias or None, fused clamp or None) -> fn(x), the
    # same computation with the weights prepacked once (native kernels or oneDNN, `_prepacked`) and the clamp
    # fused; or None (the node then runs `fn`).
    prepack: Callable[..., Callable[[torch.Tensor], torch.Tensor]] | None = None
    geometry: tuple | None = None  # for `_int8`: a convolution's (pads, stride, dilation, groups); a fully
    # connected node's (transposed,): whether its filter is [in, out]


class _Node:
    """A node's attributes with checked access (every id exists, flags are known)."""

    def __init__(self, kind: str, attrs, specs: dict[int, ValueSpec], what: str, index: int):
        self.kind, self.attrs, self.specs, self.what, self.index = kind, attrs, specs, what, index

    def fail(self, message: str) -> FormatError:
        return FormatError(f"{self.what}: node {self.index} ({self.kind}): {message}")

    def id(self, field: str, *, optional: bool = False) -> int | None:
        vid = getattr(self.attrs, field)
        vid = INVALID_ID if vid is None else int(vid)
        if optional and vid == INVALID_ID:
            return None
        if vid not in self.specs:
            raise self.fail(f"{field} {vid} is not a value of the graph")
        return vid

    def int(self, field: str) -> int:
        return int(getattr(self.attrs, field) or 0)

    def flags(self, allowed: int = 0) -> int:
        flags = self.int("flags")
        if flags & ~allowed:
            raise self.fail(f"flags {flags:#x} are not supported (allowed: {allowed:#x})")
        return flags

    def shape(self, vid: int) -> tuple[int, ...]:
        return self.specs[vid].shape


def _nchw(x: torch.Tensor) -> torch.Tensor:
    return T["permute"](x, (0, 3, 1, 2))


def _nhwc(x: torch.Tensor) -> torch.Tensor:
    return T["permute"](x, (0, 2, 3, 1))


def _unary(fn: Callable) -> Callable[[_Node], NodeKernel]:
    def build(n: _Node) -> NodeKernel:
        n.flags()
        return NodeKernel((n.id("input_id"),), n.id("output_id"), fn)
    return build


def _binary(fn: Callable) -> Callable[[_Node], NodeKernel]:
    def build(n: _Node) -> NodeKernel:
        n.flags()
        return NodeKernel((n.id("input1_id"), n.id("input2_id")), n.id("output_id"), fn)
    return build


def _fully_connected(n: _Node) -> NodeKernel:
    transposed = bool(n.flags(FLAG_TRANSPOSE_WEIGHTS) & FLAG_TRANSPOSE_WEIGHTS)
    x, w, b = n.id("input1_id"), n.id("filter_id"), n.id("bias_id", optional=True)
    if len(n.shape(w)) != 2:
        raise n.fail(f"filter has shape {list(n.shape(w))}; it must be 2-D")

    def fc(x, w, b=None):
        return T["linear"](x, T["transpose"](w, 0, 1) if transposed else w, b)

    def prepack(w, b, clamp):
        return prepacked_linear(T["transpose"](w, 0, 1) if transposed else w, b, clamp, n.shape(x))
    return NodeKernel((x, w) + ((b,) if b is not None else ()), n.id("output_id"), fc, prepack, (transposed,))


def _conv_geometry(n: _Node) -> tuple[tuple[int, int, int, int], tuple[int, int], tuple[int, int], int]:
    pads = tuple(n.int(f"padding_{s}") for s in ("left", "right", "top", "bottom"))
    stride = (n.int("subsampling_height"), n.int("subsampling_width"))
    dilation = (n.int("dilation_height"), n.int("dilation_width"))
    groups = n.int("groups")
    if min(stride + dilation) < 1 or groups < 1 or max(pads) > 1 << 16:
        raise n.fail(f"stride {stride}, dilation {dilation}, groups {groups} or padding {pads} is invalid")
    return pads, stride, dilation, groups


def _conv(depthwise: bool) -> Callable[[_Node], NodeKernel]:
    def build(n: _Node) -> NodeKernel:
        n.flags(FLAG_DEPTHWISE)
        pads, stride, dilation, groups = _conv_geometry(n)
        x, w, b = n.id("input1_id"), n.id("filter_id"), n.id("bias_id", optional=True)
        if len(n.shape(x)) != 4 or len(n.shape(w)) != 4:
            raise n.fail(f"input {list(n.shape(x))} and filter {list(n.shape(w))} must be 4-D (NHWC, OHWI)")
        kernel = (n.int("kernel_height"), n.int("kernel_width"))
        filter_hw = n.shape(w)[1:3]
        if tuple(filter_hw) != kernel:
            raise n.fail(f"kernel is {kernel} but the filter is {list(n.shape(w))}")

        def torch_weight(w):  # depthwise filters are [1, KH, KW, C*M]; dense ones [O, KH, KW, I/groups]
            return T["permute"](w, (3, 0, 1, 2)) if depthwise else T["permute"](w, (0, 3, 1, 2))

        def conv(x, w, b=None):  # on NCHW memory: oneDNN's NHWC kernels get some geometries wrong (`_prepacked`)
            y = T["conv2d"](T["pad"](_nchw(x), pads).contiguous(), torch_weight(w).contiguous(), b, stride, 0,
                            dilation, groups)
            return _nhwc(y)

        def prepack(w, b, clamp):
            in_nchw = [n.shape(x)[0], n.shape(x)[3], n.shape(x)[1], n.shape(x)[2]]
            return prepacked_conv2d(torch_weight(w), b, pads, stride, dilation, groups, clamp, in_nchw)
        return NodeKernel((x, w) + ((b,) if b is not None else ()), n.id("output_id"), conv, prepack,
                          (pads, stride, dilation, groups))
    return build


def _conv_transpose(n: _Node) -> NodeKernel:
    n.flags()
    pads, stride, dilation, groups = _conv_geometry(n)
    adjustment = (n.int("adjustment_height"), n.int("adjustment_width"))
    x, w, b = n.id("input1_id"), n.id("filter_id"), n.id("bias_id", optional=True)
    if len(n.shape(x)) != 4 or len(n.shape(w)) != 4:
        raise n.fail(f"input {list(n.shape(x))} and filter {list(n.shape(w))} must be 4-D (NHWC, OHWI)")
    left, right, top, bottom = pads

    def deconv(x, w, b=None):
        # filter [O, KH, KW, I/groups] -> torch's [I, O/groups, KH, KW]
        o_per_group = w.shape[0] // groups
        weight = T["permute"](w, (3, 0, 1, 2)).reshape(w.shape[3], groups, o_per_group, *w.shape[1:3])
        weight = T["permute"](weight, (1, 0, 2, 3, 4)).reshape(groups * w.shape[3], o_per_group, *w.shape[1:3])
        y = T["conv_transpose2d"](_nchw(x), weight, b, stride, 0, adjustment, groups, dilation)
        h, wd = y.shape[2], y.shape[3]
        return _nhwc(y[:, :, top:h - bottom, left:wd - right])
    return NodeKernel((x, w) + ((b,) if b is not None else ()), n.id("output_id"), deconv)


def _pool(kind: str) -> Callable[[_Node], NodeKernel]:
    def build(n: _Node) -> NodeKernel:
        n.flags(FLAG_KEEP_DIMS)
        pads = tuple(n.int(f"padding_{s}") for s in ("left", "right", "top", "bottom"))
        window = (n.int("pooling_height"), n.int("pooling_width"))
        stride = (n.int("stride_height"), n.int("stride_width"))
        dilation = (n.int("dilation_height") or 1, n.int("dilation_width") or 1)
        if min(window + stride) < 1 or max(pads) > 1 << 16:
            raise n.fail(f"window {window}, stride {stride} or padding {pads} is invalid")
        x = n.id("input_id")
        if len(n.shape(x)) != 4:
            raise n.fail(f"input {list(n.shape(x))} must be 4-D (NHWC)")

        def max_pool(x):
            padded = T["pad"](_nchw(x), pads, value=-math.inf)
            return _nhwc(T["max_pool2d"](padded, window, stride, 0, dilation))

        def avg_pool(x):
            # XNNPACK averages over the window's elements inside the input (padding not counted)
            nchw = _nchw(x)
            total = T["avg_pool2d"](T["pad"](nchw, pads), window, stride, 0, divisor_override=1)
            ones = T["ones_like"](nchw[:1, :1])
            count = T["avg_pool2d"](T["pad"](ones, pads), window, stride, 0, divisor_override=1)
            return _nhwc(T["div"](total, count))
        return NodeKernel((x,), n.id("output_id"), max_pool if kind == "max" else avg_pool)
    return build


def _global_avg_pool(n: _Node) -> NodeKernel:
    n.flags(FLAG_KEEP_DIMS)
    x = n.id("input_id")
    if len(n.shape(x)) not in (3, 4):
        raise n.fail(f"input {list(n.shape(x))} must be NWC or NHWC")
    dims = tuple(range(1, len(n.shape(x)) - 1))
    return NodeKernel((x,), n.id("output_id"), lambda x: T["mean"](x, dims, keepdim=True))


def _transpose(n: _Node) -> NodeKernel:
    n.flags()
    x = n.id("input_id")
    perm = tuple(int(p) for p in n.attrs.perm or [])
    if sorted(perm) != list(range(len(n.shape(x)))) or n.int("num_dims") != len(perm):
        raise n.fail(f"perm {list(perm)} is not a permutation of the input's {len(n.shape(x))} dims")
    return NodeKernel((x,), n.id("output_id"), lambda x: T["permute"](x, perm))


def _reshape(n: _Node) -> NodeKernel:
    n.flags()
    x, out = n.id("input_id"), n.id("output_id")
    new_shape = [int(d) for d in n.attrs.new_shape or []]
    if n.int("num_dims") != len(new_shape) or new_shape.count(0) > 1:
        raise n.fail(f"new shape {new_shape} (num_dims {n.int('num_dims')}) is invalid: at most one 0 "
                     f"(a dim inferred from the input's size)")
    target = tuple(-1 if d == 0 else d for d in new_shape)  # 0: inferred (dynamic shapes)
    if 0 not in new_shape and math.prod(target) != math.prod(n.shape(x)):
        raise n.fail(f"cannot reshape {list(n.shape(x))} into {new_shape}")
    return NodeKernel((x,), out, lambda x: T["reshape"](x, target))


def _slice(n: _Node) -> NodeKernel:
    n.flags()
    x = n.id("input_id")
    offsets, sizes = [int(v) for v in n.attrs.offsets or []], [int(v) for v in n.attrs.sizes or []]
    shape = n.shape(x)
    if not len(offsets) == len(sizes) == len(shape) == n.int("num_dims"):
        raise n.fail(f"offsets {offsets} and sizes {sizes} do not match the input's rank {len(shape)}")
    if any(o + s > d for o, s, d in zip(offsets, sizes, shape)):
        raise n.fail(f"slice {offsets} + {sizes} runs past the input {list(shape)}")

    def slice_(x):
        for dim, (o, s) in enumerate(zip(offsets, sizes)):
            x = T["narrow"](x, dim, o, s if s else x.shape[dim] - o)  # a size of 0: to the end of the dim
        return x
    return NodeKernel((x,), n.id("output_id"), slice_)


def _pad(n: _Node) -> NodeKernel:
    n.flags()
    x = n.id("input_id")
    pre, post = [int(v) for v in n.attrs.pre_paddings or []], [int(v) for v in n.attrs.post_paddings or []]
    rank = len(n.shape(x))
    if len(pre) != rank or len(post) != rank or max(pre + post, default=0) > 1 << 16:
        raise n.fail(f"paddings {pre} / {post} do not fit the input's rank {rank}")
    value = float(n.attrs.padding_value or 0.0)
    torch_pads = tuple(p for dim in reversed(range(rank)) for p in (pre[dim], post[dim]))
    return NodeKernel((x,), n.id("output_id"), lambda x: T["pad"](x, torch_pads, value=value))


def _concatenate(count: int) -> Callable[[_Node], NodeKernel]:
    def build(n: _Node) -> NodeKernel:
        n.flags()
        ids = tuple(n.id(f"input{i}_id") for i in range(1, count + 1))
        axis = n.int("axis")
        if axis >= len(n.shape(ids[0])):
            raise n.fail(f"axis {axis} is out of range for rank {len(n.shape(ids[0]))}")
        return NodeKernel(ids, n.id("output_id"), lambda *xs: T["cat"](xs, axis))
    return build


def _batch_matmul(n: _Node) -> NodeKernel:
    transpose_b = bool(n.flags(FLAG_TRANSPOSE_WEIGHTS) & FLAG_TRANSPOSE_WEIGHTS)
    a, b = n.id("input1_id"), n.id("input2_id")
    if len(n.shape(a)) < 2 or len(n.shape(b)) < 2:
        raise n.fail("both operands must be at least 2-D")
    return NodeKernel((a, b), n.id("output_id"),
                      lambda a, b: T["matmul"](a, T["transpose"](b, -1, -2) if transpose_b else b))


def _softmax(n: _Node) -> NodeKernel:
    return _unary(lambda x: T["softmax"](x, -1))(n)


def _prelu(n: _Node) -> NodeKernel:
    n.flags()
    x, slope = n.id("input1_id"), n.id("input2_id")
    return NodeKernel((x, slope), n.id("output_id"), lambda x, s: T["where"](x >= 0, x, T["mul"](x, s)))


def _elu(n: _Node) -> NodeKernel:
    alpha = float(n.attrs.alpha if n.attrs.alpha is not None else 1.0)
    return _unary(lambda x: T["elu"](x, alpha))(n)


def _leaky_relu(n: _Node) -> NodeKernel:
    slope = float(n.attrs.negative_slope or 0.0)
    return _unary(lambda x: T["leaky_relu"](x, slope))(n)


def _resize_bilinear(n: _Node) -> NodeKernel:
    flags = n.flags(FLAG_ALIGN_CORNERS | FLAG_TENSORFLOW_LEGACY)
    if flags & FLAG_TENSORFLOW_LEGACY:
        raise n.fail("TensorFlow legacy resize mode is not emulated")
    size = (n.int("new_height"), n.int("new_width"))
    if min(size) < 1:
        raise n.fail(f"new size {size} is invalid")
    align = bool(flags & FLAG_ALIGN_CORNERS)
    return NodeKernel((n.id("input_id"),), n.id("output_id"),
                      lambda x: _nhwc(T["interpolate"](_nchw(x), size, mode="bilinear", align_corners=align)))


def _copy(x: torch.Tensor) -> torch.Tensor:
    return T["clone"](x)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x  # the output's own (de)quantization is applied by the executor


BUILDERS: dict[str, Callable[[_Node], NodeKernel]] = {
    "XNNAdd": _binary(T["add"]), "XNNSubtract": _binary(T["sub"]), "XNNMultiply": _binary(T["mul"]),
    "XNNDiv": _binary(T["div"]), "XNNMinimum": _binary(T["minimum"]), "XNNMaximum": _binary(T["maximum"]),
    "XNNFullyConnected": _fully_connected,
    "XNNConv2d": _conv(depthwise=False), "XNNDepthwiseConv2d": _conv(depthwise=True),
    "XNNConvTranspose2d": _conv_transpose,
    "XNNMaxPooling2d": _pool("max"), "XNNAvgPooling2d": _pool("avg"), "XNNGlobalAvgPooling2d": _global_avg_pool,
    "XNNSoftmax": _softmax, "XNNSigmoid": _unary(T["sigmoid"]), "XNNTanh": _unary(T["tanh"]),
    "XNNHardswish": _unary(T["hardswish"]), "XNNClamp": _unary(_identity), "XNNConvert": _unary(_identity),
    "XNNELU": _elu, "XNNLeakyReLU": _leaky_relu, "XNNPReLU": _prelu, "XNNGelu": _unary(T["gelu"]),
    "XNNAbs": _unary(T["abs"]), "XNNNegate": _unary(T["neg"]), "XNNSquare": _unary(T["square"]),
    "XNNSquareRoot": _unary(T["sqrt"]), "XNNReciprocalSquareRoot": _unary(T["rsqrt"]),
    "XNNFloor": _unary(T["floor"]), "XNNCeiling": _unary(T["ceil"]), "XNNLog": _unary(T["log"]),
    "XNNExp": _unary(T["exp"]), "XNNSin": _unary(T["sin"]), "XNNCos": _unary(T["cos"]), "XNNCopy": _unary(_copy),
    "XNNStaticTranspose": _transpose, "XNNStaticReshape": _reshape, "XNNStaticSlice": _slice,
    "XNNStaticConstantPad": _pad, "XNNStaticResizeBilinear2D": _resize_bilinear,
    "XNNConcatenate2": _concatenate(2), "XNNConcatenate3": _concatenate(3), "XNNConcatenate4": _concatenate(4),
    "XNNConcatenate5": _concatenate(5), "XNNBatchMatrixMultiply": _batch_matmul,
}
# Refused at load, by name: XNNScaledDotProductAttention (upstream 1.5.1's partitioner never emits it,
# so there is no program to check an emulation against) and XNNArgMaxPooling2d (max.dim over H or W
# with its indices; two outputs, one of them indices XNNPACK stores as uint32: not emulated yet).


def build_kernel(kind: str, attrs, specs: dict[int, ValueSpec], what: str, index: int) -> NodeKernel:
    """The kernel of one node; FormatError naming the node kind if it is not emulated or malformed."""
    builder = BUILDERS.get(kind)
    if builder is None:
        raise FormatError(f"{what}: node {index} is {kind}, which etlab's XNNPACK emulation does not support "
                          f"(supported: {', '.join(sorted(BUILDERS))})")
    if attrs is None:
        raise FormatError(f"{what}: node {index} ({kind}) has no attributes")
    return builder(_Node(kind, attrs, specs, what, index))
