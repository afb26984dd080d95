"""Prepacked kernels: the convolutions of an XNNPACK graph with constant weights, run as oneDNN runs them.

XNNPACK packs a convolution's weights once, when the delegate is initialized, keeps activations in
NHWC and applies the fused output clamp inside the kernel. The same here, through torch's oneDNN
(mkldnn) operators: the filter is reordered once at load into oneDNN's blocked layout for the
node's geometry; at run time the NHWC activation is handed over as the channels-last view of its
NCHW shape (no copy), the kernel writes a channels-last result, which is the NHWC output again
(no permute copies between nodes of a partition), and the clamp is oneDNN's post-op. The result is
the same computation as the reference path (`conv2d` then `clamp`), with its own summation order.

oneDNN's NHWC kernels are not right for every geometry: torch 2.13's oneDNN 3.12 (brg_conv_fwd) gets some
convolutions with tall kernels wrong, eager torch too on channels-last inputs (Wav2Letter's 1-D convolution
of 250 channels, kernel 32, lowered as a 32x1 convolution: errors the size of the outputs). So each packed
kernel is checked once at load, on a seeded random input of its declared shape, against torch's
convolution of the same input in NCHW (a different kernel); one that disagrees beyond float rounding is
dropped and the node runs on the reference path.

Where the native core is built, most convolutions skip oneDNN: its per-call set-up (~25 us of descriptor
building per call) is most of a small convolution's time. The native kernels (`_native/conv.cpp`) pack the
weights once and have no per-call set-up: pointwise convolutions and fully connected layers as MKL's packed
GEMM, depthwise ones as a direct NHWC loop, other ungrouped ones by im2col. They are checked at load the same
way; one that disagrees (or a geometry they do not take) falls back to oneDNN, then to the reference path.
`NATIVE_KINDS` lists the native kernel kinds in use: an im2col convolution with a large patch matrix (a
3-channel stem on a 224x224 image) is faster on oneDNN, which takes the NCHW input directly.

Without oneDNN (a torch built without it) `prepacked_conv2d` returns None and the node runs on
the reference path.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from etlab.runtime._native import _core

_NATIVE = _core if _core is not None and hasattr(_core, "packed_conv2d") else None
NATIVE_KINDS = {"pointwise", "depthwise", "im2col"}
IM2COL_MAX_FLOATS = 1 << 18  # the largest patch matrix (rows x K) an im2col convolution runs natively with
_ONEDNN = torch.backends.mkldnn.is_available()
_reorder_conv_weight = torch._C._nn.mkldnn_reorder_conv2d_weight if _ONEDNN else None
_conv_pointwise = torch.ops.mkldnn._convolution_pointwise.default if _ONEDNN else None


def post_op(clamp: tuple[float, float] | None) -> tuple[str, list]:
    """oneDNN's name and scalars for a fused output clamp."""
    if clamp is None or clamp == (-math.inf, math.inf):
        return "none", []
    if clamp == (0.0, math.inf):
        return "relu", []
    return "hardtanh", [clamp[0], clamp[1]]


def prepacked_conv2d(weight: torch.Tensor, bias: torch.Tensor | None, pads: tuple[int, int, int, int],
                     stride: tuple[int, int], dilation: tuple[int, int], groups: int,
                     clamp: tuple[float, float] | None, input_nchw: list[int],
                     ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """fn(x NHWC[, fused]) -> clamp(conv2d(x)) NHWC with `weight` (OIHW, float32) packed now; None without oneDNN.

    `pads` is XNNPACK's (left, right, top, bottom): symmetric padding is the kernel's own, other
    padding is applied to the input first. `input_nchw` is the input's declared shape (the packing
    is chosen for it; other shapes still run, oneDNN reorders for them).
    """
    if weight.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        return None
    weight = weight.contiguous()  # OIHW memory (a permuted OHWI filter would make torch's reference NHWC too)
    bias = None if bias is None else bias.contiguous()
    native = _native_conv2d(weight, bias, pads, stride, dilation, groups, clamp, input_nchw)
    if native is not None:
        return native
    if not _ONEDNN:
        return None
    left, right, top, bottom = pads
    symmetric = left == right and top == bottom
    padding = [top, left] if symmetric else [0, 0]
    declared = list(input_nchw)
    if not symmetric:
        input_nchw = [input_nchw[0], input_nchw[1], input_nchw[2] + top + bottom, input_nchw[3] + left + right]
    stride_, dilation_ = list(stride), list(dilation)
    packed = _reorder_conv_weight(weight.to_mkldnn(), padding, stride_, dilation_, groups, input_nchw)
    attr, scalars = post_op(clamp)
    conv, pad, permute = _conv_pointwise, torch.nn.functional.pad, torch.permute

    def run(x: torch.Tensor, fused: bool = True) -> torch.Tensor:
        """fused=False: without the clamp (the op's own result, which a traced run logs)."""
        nchw = permute(x, (0, 3, 1, 2))  # channels-last strides when x is a contiguous NHWC tensor
        if not symmetric:
            nchw = pad(nchw, pads)
        y = conv(nchw, packed, bias, padding, stride_, dilation_, groups, *((attr, scalars) if fused else ("none", [])),
                 None)
        return permute(y, (0, 2, 3, 1))
    return run if _agrees_with_reference(run, weight, bias, pads, stride_, dilation_, groups, declared) else None


def _native_conv2d(weight: torch.Tensor, bias: torch.Tensor | None, pads: tuple[int, int, int, int],
                   stride: tuple[int, int], dilation: tuple[int, int], groups: int,
                   clamp: tuple[float, float] | None, input_nchw: list[int]) -> Callable[..., torch.Tensor] | None:
    """The native kernel of the convolution (see the module doc), checked; None where there is none."""
    if _NATIVE is None:
        return None
    lo, hi = clamp if clamp is not None else (-math.inf, math.inf)
    conv = _NATIVE.packed_conv2d(weight, bias, list(pads), list(stride), list(dilation), groups, lo, hi,
                                 list(input_nchw))
    if conv is None or conv.kind not in NATIVE_KINDS:
        return None
    if conv.kind == "im2col":
        n, c, h, w = input_nchw
        left, right, top, bottom = pads
        oh = (h + top + bottom - dilation[0] * (weight.shape[2] - 1) - 1) // stride[0] + 1
        ow = (w + left + right - dilation[1] * (weight.shape[3] - 1) - 1) // stride[1] + 1
        if n * oh * ow * c * weight.shape[2] * weight.shape[3] > IM2COL_MAX_FLOATS:
            return None
    agrees = _agrees_with_reference(conv, weight, bias, pads, list(stride), list(dilation), groups, input_nchw)
    return conv if agrees else None


def prepacked_linear(weight: torch.Tensor, bias: torch.Tensor | None, clamp: tuple[float, float] | None,
                     input_shape: tuple[int, ...]) -> Callable[..., torch.Tensor] | None:
    """fn(x[, fused]) -> clamp(x @ weight.T + bias) with `weight` ([out, in], float32) packed now for inputs of
    `input_shape` (others run too); None without the native kernels or if the packed kernel disagrees with torch's
    linear on a seeded input."""
    if (_NATIVE is None or weight.dtype != torch.float32 or weight.dim() != 2 or not input_shape
            or input_shape[-1] != weight.shape[1] or (bias is not None and bias.dtype != torch.float32)):
        return None
    weight, bias = weight.contiguous(), None if bias is None else bias.contiguous()
    lo, hi = clamp if clamp is not None else (-math.inf, math.inf)
    linear = _NATIVE.packed_linear(weight, bias, lo, hi, math.prod(input_shape[:-1]))
    if linear is None:
        return None
    x = torch.randn(input_shape, generator=torch.Generator().manual_seed(0))
    want = torch.nn.functional.linear(x, weight, bias)
    return linear if _close(linear(x, False), want) else None


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within float rounding of a sum (the bound of `_agrees_with_reference`)."""
    if got.shape != want.shape:
        return False
    return want.numel() == 0 or bool((got - want).abs().max() <= 1e-4 * (1.0 + want.abs().max()))


def _agrees_with_reference(run: Callable[..., torch.Tensor], weight: torch.Tensor, bias: torch.Tensor | None,
                           pads: tuple[int, int, int, int], stride: list[int], dilation: list[int], groups: int,
                           input_nchw: list[int]) -> bool:
    """Does the packed kernel compute the convolution on a seeded random input (see the module doc)?
    Input and weight are NCHW/OIHW in memory, so torch takes an NCHW kernel for the reference.
    The bound is far above float rounding (a sum's error grows with its length, not its value) and far
    below a wrong kernel's error (of the order of the outputs)."""
    x = torch.randn(input_nchw, generator=torch.Generator().manual_seed(0))
    want = torch.nn.functional.conv2d(torch.nn.functional.pad(x, pads), weight, bias, stride, 0, dilation, groups)
    got = run(x.permute(0, 2, 3, 1).contiguous(), False).permute(0, 3, 1, 2)
    return _close(got, want)
