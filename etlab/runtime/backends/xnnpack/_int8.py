"""Integer kernels for XNNPACK's int8 graphs: quantized values kept as integers, convolutions, fully connected
layers and adds run by etlab's native int8 kernels (`_native/qconv.cpp`: weights packed once at init, no per-call
set-up), or by torch's x86 quantized kernels (oneDNN) where the native core is not built.

The reference path carries a quantized value as float32 holding its levels and emulates every node
as dequantize -> float op -> requantize. For the nodes that dominate an int8 CNN that costs more
than the op itself; here a per-tensor int8 (or uint8) value may instead be held as the uint8
tensor `q + offset` (offset 128 for int8: oneDNN takes unsigned activations; the zero point moves
by the same offset), and:

- a convolution (dense or depthwise) or fully connected node with per-channel int8 weights, an int32 bias and
  per-tensor input and output runs natively (`_native_conv`, `_native_linear`): int32 sums on the integers, XNNPACK's
  fp32 requantization (scale per output channel, round to nearest-even, the output's zero point and bounds), so
  the integers are XNNPACK's own up to the rounding of the float scale; an add of two same-shape values runs
  natively too (XNNPACK's fixed-point form). Otherwise, through torch:
- a convolution or fully connected node with per-channel int8 weights and per-tensor input and output
  runs as oneDNN's int8 convolution or inner product (int32 accumulation, float bias and rescale, rounded
  to the output's levels: within one quantization step of XNNPACK's fixed-point requantization; a
  classifier's filter is then read as its int8 bytes, as XNNPACK reads it, not as four times as many floats);
- a clamp whose output has its input's quantization clamps the integers (exact);
- transposes and reshapes between values of one quantization move the integers (exact).

Every other node gets levels (`to_levels`) and integers are made from levels where a kernel takes
them (`to_integers`), both exact for values on their grid. `int_kernel` says which nodes qualify.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from etlab.runtime._native import _core
from etlab.runtime.backends.xnnpack._values import Quant, ValueSpec

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops, "onednn")
_NATIVE = _core if _core is not None and hasattr(_core, "BoundQConv2d") else None
_NATIVE_CONVERT = _NATIVE is not None and hasattr(_NATIVE, "quantize_u8")  # a core built before these: torch
_LAYOUT_KINDS = {"XNNStaticTranspose", "XNNStaticReshape"}
_CONV_KINDS = {"XNNConv2d", "XNNDepthwiseConv2d"}
INT_DTYPE = torch.uint8  # the dtype of a value held as integers (levels are float32)


def offset(quant: Quant | None) -> int | None:
    """What shifts a per-tensor 8-bit value's integers into uint8, or None if it has no 8-bit form."""
    if quant is None or quant.kind != "tensor" or quant.qmax - quant.qmin != 255 or quant.qmin not in (-128, 0):
        return None
    return -quant.qmin


def to_levels(q: torch.Tensor, quant: Quant) -> torch.Tensor:
    """The float levels of a value held as integers."""
    if _NATIVE_CONVERT and _NATIVE is not None:
        return _NATIVE.dequantize_u8(q, quant.scale, quant.zero_point + offset(quant))
    return q.to(torch.float32).sub_(quant.zero_point + offset(quant)).mul_(quant.scale)


def int_kernel(kind: str, inputs: tuple[int, ...], output: int, specs: dict[int, ValueSpec],
               constants: dict[int, torch.Tensor], clamp: tuple[float, float] | None, geometry
               ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """fn(integers of the first input) -> integers of the output, or None when the node does not
    qualify (then it runs on levels). `geometry`: `NodeKernel.geometry`."""
    qin, qout = specs[inputs[0]].quant, specs[output].quant
    if offset(qin) is None or offset(qout) is None:
        return None
    if kind in _CONV_KINDS and geometry is not None:
        fn = _native_conv(kind, inputs, specs, constants, qin, qout, clamp, geometry)
        if fn is None and _ONEDNN:
            fn = _int_conv(kind, inputs, specs, constants, qin, qout, clamp, geometry)
        return fn
    if kind == "XNNFullyConnected" and geometry == (False,):
        fn = _native_linear(inputs, specs, constants, qin, qout, clamp)
        if fn is None and _ONEDNN:
            fn = _int_linear(inputs, specs, constants, qin, qout, clamp)
        return fn
    same = (qin.scale, qin.zero_point, qin.qmin) == (qout.scale, qout.zero_point, qout.qmin)
    if kind == "XNNClamp" and same:
        bounds = clamp_bounds(qout, clamp)

        def clamp_integers(q: torch.Tensor) -> torch.Tensor:
            return torch.clamp(q, *bounds)
        clamp_integers.bounds = bounds  # for a partition's native loop (`_native_plan`)
        return clamp_integers
    return None


def clamp_bounds(quant: Quant, clamp: tuple[float, float] | None) -> tuple[int, int]:
    """The integers (uint8 form) a float clamp keeps of a value quantized by `quant`: quantizing is
    monotone, so clamping the integers to these is the same as quantizing the clamped floats."""
    lo, hi = clamp if clamp is not None else (-math.inf, math.inf)

    def level(x: float, unbounded: int) -> int:
        if math.isinf(x):
            return unbounded
        return min(max(round(x / quant.scale) + quant.zero_point, quant.qmin), quant.qmax)
    return level(lo, quant.qmin) + offset(quant), level(hi, quant.qmax) + offset(quant)


def relu_bounds(quant: Quant) -> tuple[int, int]:
    """The integer bounds of a ReLU on a value quantized by `quant` (what oneDNN's relu post-op keeps)."""
    return clamp_bounds(quant, (0.0, math.inf))


def int_add(qa: Quant, qb: Quant, qout: Quant, clamp: tuple[float, float] | None
            ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """fn(integers of a, integers of b) -> integers of clamp(a + b) requantized to `qout`, computed in
    float32 as a * ka + b * kb + c: one rounding, within one step of XNNPACK's fixed-point requantization.
    (torch's quantized add is a little faster but needs quantized tensors, which torch deprecates.)"""
    native = _native_add(qa, qb, qout, clamp)
    ka, kb = qa.scale / qout.scale, qb.scale / qout.scale
    c = qout.zero_point + offset(qout) - (qa.zero_point + offset(qa)) * ka - (qb.zero_point + offset(qb)) * kb
    lo, hi = clamp_bounds(qout, clamp)
    mul = torch.mul

    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return mul(a, ka).add_(b, alpha=kb).add_(c).round_().clamp_(lo, hi).to(INT_DTYPE)
    if native is None:
        return add

    def add_native(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return native(a, b) if a.shape == b.shape else add(a, b)  # broadcasting adds: torch
    add_native.native = native  # the kernel itself, for a partition's native loop (`_native_plan`)
    return add_native


def _native_add(qa: Quant, qb: Quant, qout: Quant, clamp: tuple[float, float] | None):
    """The native fixed-point add's call, or None (no native core, or scale ratios it does not take)."""
    if _NATIVE is None:
        return None
    out_scale = np.float32(qout.scale)  # XNNPACK's ratios are float32 quotients
    lo, hi = clamp_bounds(qout, clamp)
    try:
        kernel = _NATIVE.QAdd(float(np.float32(qa.scale) / out_scale), qa.zero_point + offset(qa),
                              float(np.float32(qb.scale) / out_scale), qb.zero_point + offset(qb),
                              qout.zero_point + offset(qout), lo, hi)
    except ValueError:
        return None
    return kernel


def to_integers(levels: torch.Tensor, quant: Quant) -> torch.Tensor:
    """The integers of a float value quantized by `quant`, rounded as `fake_quantize` rounds (exact for
    levels, which lie on the value's grid)."""
    off = offset(quant)
    if _NATIVE_CONVERT and _NATIVE is not None and levels.dtype == torch.float32:  # same float32 product, rounding
        return _NATIVE.quantize_u8(levels, 1.0 / quant.scale, quant.zero_point + off, quant.qmin + off,
                                   quant.qmax + off)
    q = torch.mul(levels, 1.0 / quant.scale).round_().add_(quant.zero_point + off)
    return q.clamp_(quant.qmin + off, quant.qmax + off).to(INT_DTYPE)


def _int8_weights(inputs, specs, constants, clamp) -> Quant | None:
    """The per-channel int8 quantization of a node's constant filter, if oneDNN's int8 kernels can take the node."""
    if len(inputs) < 2 or any(v not in constants for v in inputs[1:]):
        return None
    wq = specs[inputs[1]].quant
    if wq is None or wq.kind != "channel" or wq.qmin != -128 or clamp not in (None, (0.0, math.inf)):
        return None
    return wq


def _native_weights(inputs, specs, constants, axis: int) -> tuple[torch.Tensor, torch.Tensor | None, Quant] | None:
    """(int8 filter, int32 bias or None, the filter's quantization) of a node the native kernels take: a constant
    per-channel int8 filter along `axis` and, if any, a constant int32 bias (its integers, as XNNPACK adds them)."""
    if len(inputs) < 2 or any(v not in constants for v in inputs[1:]):
        return None
    wq = specs[inputs[1]].quant
    if wq is None or wq.kind != "channel" or (wq.qmin, wq.qmax) != (-128, 127) or wq.axis != axis:
        return None
    view = [1] * len(specs[inputs[1]].shape)
    view[axis] = -1
    weight = torch.round(constants[inputs[1]].double() / wq.scales.double().view(view)).clamp_(-128, 127)
    bias = None
    if len(inputs) > 2:
        bq = specs[inputs[2]].quant
        if bq is None or bq.kind not in ("channel", "tensor") or bq.qmin != -(1 << 31):
            return None
        bscale = bq.scales.double() if bq.kind == "channel" else torch.tensor(bq.scale, dtype=torch.float64)
        bias = torch.round(constants[inputs[2]].double() / bscale + bq.zero_point).to(torch.int32)
    return weight.to(torch.int8), bias, wq


def _requant_scales(qin: Quant, wq: Quant, qout: Quant) -> torch.Tensor:
    """Each output channel's requantization scale, input scale x filter scale / output scale in float32 as
    XNNPACK computes it."""
    return (torch.tensor(qin.scale, dtype=torch.float32) * wq.scales.to(torch.float32)
            / torch.tensor(qout.scale, dtype=torch.float32))


def _native_conv(kind, inputs, specs, constants, qin: Quant, qout: Quant, clamp, geometry):
    """A dense (groups 1) or depthwise (channel multiplier 1) int8 convolution as a native kernel, or None."""
    if _NATIVE is None:
        return None
    depthwise = kind == "XNNDepthwiseConv2d"
    found = _native_weights(inputs, specs, constants, 3 if depthwise else 0)
    if found is None:
        return None
    weight, bias, wq = found
    (left, right, top, bottom), stride, dilation, groups = geometry
    channels = specs[inputs[0]].shape[3]
    if depthwise:
        if weight.shape[0] != 1 or groups != channels or weight.shape[3] != channels:
            return None
        make, weight = _NATIVE.QDepthwiseConv2d, weight[0]
    elif groups == 1 and weight.shape[3] == channels:
        make = _NATIVE.QConv2d
    else:
        return None
    kernel = make(weight.contiguous(), bias, _requant_scales(qin, wq, qout), [top, left, bottom, right],
                  list(stride), list(dilation), qin.zero_point + offset(qin), qout.zero_point + offset(qout),
                  *clamp_bounds(qout, clamp))
    return kernel.bound()  # fn(q); fn.clamped(lo, hi): a following clamp fused (`_fast`)


def _native_linear(inputs, specs, constants, qin: Quant, qout: Quant, clamp):
    """A fully connected node ([out, in] int8 filter, per output channel) as the native GEMM, or None."""
    if _NATIVE is None:
        return None
    found = _native_weights(inputs, specs, constants, 0)
    if found is None or specs[inputs[0]].shape[-1] != found[0].shape[1]:
        return None
    weight, bias, wq = found
    kernel = _NATIVE.QConv2d(weight[:, None, None, :].contiguous(), bias, _requant_scales(qin, wq, qout), [0] * 4,
                             [1, 1], [1, 1], qin.zero_point + offset(qin), qout.zero_point + offset(qout),
                             *clamp_bounds(qout, clamp))
    return kernel.bound(True)


def _int_linear(inputs, specs, constants, qin: Quant, qout: Quant, clamp):
    """A fully connected node ([out, in] filter, per output channel) as oneDNN's int8 inner product."""
    wq = _int8_weights(inputs, specs, constants, clamp)
    if wq is None or wq.axis != 0:
        return None
    scales = wq.scales.to(torch.float32)
    qweight = torch.round(constants[inputs[1]] / scales.view(-1, 1)).clamp_(-128, 127).to(torch.int8).contiguous()
    bias = constants[inputs[2]].contiguous() if len(inputs) > 2 else None
    x_shape = specs[inputs[0]].shape
    rows = math.prod(x_shape[:-1])
    packed = torch.ops.onednn.qlinear_prepack(qweight, [rows, x_shape[-1]])
    w_zp = torch.zeros(scales.numel(), dtype=torch.int32)
    x_scale, x_zp, y_scale, y_zp = qin.scale, qin.zero_point + offset(qin), qout.scale, qout.zero_point + offset(qout)
    attr = "relu" if clamp is not None else "none"
    linear, out_features = torch.ops.onednn.qlinear_pointwise.default, qweight.shape[0]

    def run(q: torch.Tensor) -> torch.Tensor:
        y = linear(q.reshape(-1, q.shape[-1]), x_scale, x_zp, packed, scales, w_zp, bias, y_scale, y_zp, INT_DTYPE,
                   attr, [], "")
        return y.reshape(*q.shape[:-1], out_features)
    return run


def _int_conv(kind, inputs, specs, constants, qin: Quant, qout: Quant, clamp, geometry):
    wq = _int8_weights(inputs, specs, constants, clamp)
    if wq is None:
        return None
    pads, stride, dilation, groups = geometry
    left, right, top, bottom = pads
    if left != right or top != bottom:
        return None
    # OHWI (dense) or 1HWO (depthwise) -> OIHW; the per-channel axis becomes 0 either way
    levels = constants[inputs[1]]
    weight = levels.permute(3, 0, 1, 2) if kind == "XNNDepthwiseConv2d" else levels.permute(0, 3, 1, 2)
    if wq.axis != (3 if kind == "XNNDepthwiseConv2d" else 0):
        return None
    scales = wq.scales.to(torch.float32)
    qweight = torch.round(weight / scales.view(-1, 1, 1, 1)).clamp_(-128, 127).to(torch.int8).contiguous()
    bias = constants[inputs[2]].contiguous() if len(inputs) > 2 else None
    x_zp, y_zp = qin.zero_point + offset(qin), qout.zero_point + offset(qout)
    shape = specs[inputs[0]].shape  # NHWC
    padding, stride_, dilation_ = [top, left], list(stride), list(dilation)
    packed = torch.ops.onednn.qconv_prepack(qweight, scales, qin.scale, x_zp, stride_, padding, dilation_, groups,
                                            [shape[0], shape[3], shape[1], shape[2]])
    w_zp = torch.zeros(scales.numel(), dtype=torch.int32)
    attr = "relu" if clamp is not None else "none"
    conv, permute = torch.ops.onednn.qconv2d_pointwise.default, torch.permute
    x_scale, y_scale = qin.scale, qout.scale

    def run(q: torch.Tensor, relu: bool = False) -> torch.Tensor:
        """relu=True: with a ReLU post-op whatever the node's own clamp (a following clamp fused)."""
        y = conv(permute(q, (0, 3, 1, 2)), x_scale, x_zp, packed, scales, w_zp, bias, stride_, padding, dilation_,
                 groups, y_scale, y_zp, INT_DTYPE, "relu" if relu else attr, [], "")
        return permute(y, (0, 2, 3, 1))
    return run


def layout_passes_integers(kind: str, qin: Quant | None, qout: Quant | None) -> bool:
    """Do this node's integers pass through unchanged (a transpose or reshape within one quantization)?"""
    return (kind in _LAYOUT_KINDS and offset(qin) is not None and offset(qout) is not None
            and (qin.scale, qin.zero_point, qin.qmin) == (qout.scale, qout.zero_point, qout.qmin))
