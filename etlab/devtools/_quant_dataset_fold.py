"""Convolutions of the report over a dataset: a convolution and the batch norm after it as one convolution, and
every 2-D convolution on oneDNN (`conv2d`).

A float MobileNet-style layer is conv2d -> batch_norm: the float graph runs both, and so does the local re-run of
the layer on the quantized inputs. Inference batch norm is an affine map per output channel, so the pair is one
convolution with scaled weights and a shifted bias (what convert_pt2e does to the quantized graph): one pass
over the activation fewer, each time (~3.5 of ~100 ms per MobileNetV2 input, in each of the two).

Not bit-identical: the float32 rounding of conv-then-normalise and of the folded convolution differ in the last
bits (a relative difference of ~1e-7, as a batch's convolutions differ from one input's), against a
quantization error of ~1e-2 (40 dB): SQNRs move by ~1e-5 dB. The folded weights are computed in float64, once.

oneDNN: torch picks its own im2col + GEMM convolution for a 1x1 convolution of stride 1 on fewer than 16 inputs
when it runs on one thread (the report's workers do), which on a channels-last batch first copies the input to
the contiguous layout: MobileNetV2's pointwise convolutions took ~1.5x (expansions ~2x) the time oneDNN does.
`conv2d` calls oneDNN's convolution (what torch itself calls for every other convolution here) whenever it
can take the arguments; same values up to the last bits of a float32 sum (most layers bit for bit).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

CONV2D = torch.ops.aten.conv2d.default
_BATCH_NORM = torch.ops.aten.batch_norm.default


def conv_bn_pair(conv: Node, bn: Node) -> bool:
    """Whether `bn` is an inference batch norm of `conv`'s output only, both in the form `fold` computes: an
    aten.conv2d with positional arguments, an aten.batch_norm (training False) whose statistics and affine
    parameters are nodes or None."""
    if conv.op != "call_function" or conv.target != CONV2D or conv.kwargs or len(conv.args) < 2:
        return False
    if bn.op != "call_function" or bn.target != _BATCH_NORM or bn.kwargs or len(bn.args) != 9:
        return False
    if bn.args[0] is not conv or len(conv.users) != 1 or bn.args[5] is not False:
        return False
    if not isinstance(conv.args[1], Node) or not isinstance(bn.args[3], Node) or not isinstance(bn.args[4], Node):
        return False
    bias = conv.args[2] if len(conv.args) > 2 else None
    return all(a is None or isinstance(a, Node) for a in (bias, bn.args[1], bn.args[2]))


def fold(conv: Node, bn: Node, value) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(weight, bias) of the one convolution that computes bn(conv(x)); `value(node)` gives a parameter node's
    tensor. None when a parameter is not a float tensor of the expected shape (left to the two ops)."""
    def get(a):
        return None if a is None else value(a)

    weight, bias = get(conv.args[1]), get(conv.args[2] if len(conv.args) > 2 else None)
    gamma, beta, mean, var = (get(a) for a in bn.args[1:5])
    eps = bn.args[7]
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dim() != 4:
        return None
    out = weight.shape[0]
    for t in (bias, gamma, beta, mean, var):
        if t is not None and (not isinstance(t, torch.Tensor) or t.shape != (out,) or not t.is_floating_point()):
            return None
    if not isinstance(eps, (int, float)):
        return None
    d = torch.float64
    scale = (gamma.to(d) if gamma is not None else torch.ones(out, dtype=d)) / torch.sqrt(var.to(d) + eps)
    shift = ((bias.to(d) if bias is not None else 0.0) - mean.to(d)) * scale
    shift = shift + (beta.to(d) if beta is not None else 0.0)
    return (weight.to(d) * scale[:, None, None, None]).to(weight.dtype), shift.to(weight.dtype)


def _pair(v) -> list[int] | None:
    """A stride, padding or dilation as aten.conv2d.default takes it (one or two ints) as two ints, or None."""
    if isinstance(v, (list, tuple)) and len(v) in (1, 2) and all(isinstance(i, int) and not isinstance(i, bool)
                                                                for i in v):
        return [int(i) for i in v] * (2 // len(v))
    return None


def _onednn_args(x, weight, bias, stride, padding, dilation, groups) -> tuple | None:
    """(padding, stride, dilation) as oneDNN's convolution takes them, or None where aten.conv2d must decide
    (another dtype, device or layout, a string padding, shapes that do not fit: aten's error is the clear one)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return None
    for t in (x, weight):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.device.type != "cpu" \
                or t.layout != torch.strided or t.dim() != 4:
            return None
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype != torch.float32
                             or bias.device.type != "cpu" or bias.shape != (weight.shape[0],)):
        return None
    s, p, d = _pair(stride), _pair(padding), _pair(dilation)
    if s is None or p is None or d is None or not isinstance(groups, int) or groups < 1 or min(s) < 1 or min(d) < 1 \
            or min(p) < 0 or x.numel() == 0 or x.shape[1] != weight.shape[1] * groups or weight.shape[0] % groups:
        return None
    for k in (0, 1):
        if x.shape[2 + k] + 2 * p[k] - d[k] * (weight.shape[2 + k] - 1) - 1 < 0:
            return None
    return p, s, d


def conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1) -> Any:
    """aten.conv2d.default's value, computed by oneDNN's convolution where it takes the arguments (see the
    module's doc), else by aten.conv2d."""
    onednn = _onednn_args(x, weight, bias, stride, padding, dilation, groups)
    with torch.no_grad():
        if onednn is None:
            return CONV2D(x, weight, bias, stride, padding, dilation, groups)
        return torch.ops.aten.mkldnn_convolution.default(x, weight, bias, *onednn, groups)


def folded_conv(conv: Node, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> Any:
    """conv's convolution of x with the folded weight and bias (its stride, padding, dilation, groups)."""
    args = list(conv.args)
    args[0], args[1] = x, weight
    if len(args) > 2:
        args[2] = bias
    else:
        args.append(bias)
    return conv2d(*args)
