"""Kernels for the `quantized_decomposed` out variants a quantized `.pte` calls (upstream's names).

Per-tensor quantize/dequantize run on every activation of a quantized program, so they are
computed straight into the planned output with in-place steps; the arithmetic is torch's own
reference (`torch.ao.quantization.fx._decomposed`), step for step, so results are bit-identical
to the converted model run in torch eager:
  quantize:   out = clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max) as dtype
  dequantize: out = (q as float - zero_point) * scale
Per-channel ops and choose_qparams call torch's reference and copy into the output. Every
argument comes from a file, so each kernel checks dtypes, ranges and shapes first and raises a
ValueError naming the argument (the interpreter adds the instruction's site).
"""

from __future__ import annotations

import importlib
import math

import torch

from etlab.runtime._memory import reshape_in_place
from etlab.schema.scalar_type import scalar_type_to_dtype

# Integer dtypes a quantized value may have, with their value range (torch's _DTYPE_TO_QVALUE_BOUNDS).
_Q_BOUNDS = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-(2**15), 2**15 - 1),
             torch.int32: (-(2**31), 2**31 - 1)}
_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def _qd():
    importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers torch.ops.quantized_decomposed
    return torch.ops.quantized_decomposed


def _dtype(v) -> torch.dtype | None:
    return scalar_type_to_dtype(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _check_range(qmin: int, qmax: int, dtype: torch.dtype) -> None:
    if dtype not in _Q_BOUNDS:
        raise ValueError(f"quantized dtype {dtype} is not one of {', '.join(map(str, _Q_BOUNDS))}")
    lo, hi = _Q_BOUNDS[dtype]
    if not lo <= qmin <= qmax <= hi:
        raise ValueError(f"quant_min/quant_max [{qmin}, {qmax}] is not a range within {dtype}'s [{lo}, {hi}]")


def _check_out(out: torch.Tensor, dtype: torch.dtype, like: torch.Tensor) -> None:
    if out.dtype != dtype:
        raise ValueError(f"out has dtype {out.dtype}, expected {dtype}")
    reshape_in_place(out, like.shape)


def _scalar_qparams(scale, zero_point) -> tuple[float, int]:
    """scale/zero_point as Python numbers (the .Tensor overloads pass one-element tensors)."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.dtype.is_floating_point:
            raise ValueError(f"scale must be a one-element floating tensor, got {scale.dtype} of shape "
                             f"{tuple(scale.shape)}")
        scale = scale.item()
    if isinstance(zero_point, torch.Tensor):
        if zero_point.numel() != 1 or zero_point.dtype.is_floating_point:
            raise ValueError(f"zero_point must be a one-element integer tensor, got {zero_point.dtype} of shape "
                             f"{tuple(zero_point.shape)}")
        zero_point = zero_point.item()
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and positive, got {scale}")
    return scale, int(zero_point)


def quantize_per_tensor(x, scale, zero_point, qmin, qmax, dtype, out, *_ret) -> None:
    """quantize_per_tensor.out / .Tensor_out."""
    dtype = _dtype(dtype)
    if x.dtype not in _FLOAT_INPUTS:
        raise ValueError(f"quantize_per_tensor: input must be float32/float16/bfloat16, got {x.dtype}")
    _check_range(qmin, qmax, dtype)
    scale, zero_point = _scalar_qparams(scale, zero_point)
    _check_out(out, dtype, x)
    scaled = torch.mul(x.to(torch.float32), 1.0 / scale)
    scaled.round_().add_(zero_point).clamp_(qmin, qmax)
    out.copy_(scaled)


def dequantize_per_tensor(x, scale, zero_point, qmin, qmax, dtype, out_dtype, out, *_ret) -> None:
    """dequantize_per_tensor.out / .Tensor_out."""
    dtype, out_dtype = _dtype(dtype), _dtype(out_dtype) or torch.float32
    if x.dtype != dtype:
        raise ValueError(f"dequantize_per_tensor: input has dtype {x.dtype}, the call says {dtype}")
    _check_range(qmin, qmax, dtype)
    if not out_dtype.is_floating_point:
        raise ValueError(f"dequantize_per_tensor: out_dtype must be floating, got {out_dtype}")
    scale, zero_point = _scalar_qparams(scale, zero_point)
    _check_out(out, out_dtype, x)
    out.copy_(x)
    out.sub_(zero_point).mul_(scale)


def _check_per_channel(x, scales, zero_points, axis: int, what: str) -> None:
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"{what}: axis {axis} is out of range for a {x.dim()}-d input")
    channels = x.shape[axis]
    if scales.dim() != 1 or scales.numel() != channels or not scales.dtype.is_floating_point:
        raise ValueError(f"{what}: scales must be a 1-d floating tensor of {channels} elements (the input's size "
                         f"on axis {axis}), got {scales.dtype} of shape {tuple(scales.shape)}")
    if zero_points is not None and (zero_points.dim() != 1 or zero_points.numel() != channels):
        raise ValueError(f"{what}: zero_points must be a 1-d tensor of {channels} elements, got shape "
                         f"{tuple(zero_points.shape)}")


def quantize_per_channel(x, scales, zero_points, axis, qmin, qmax, dtype, out, *_ret) -> None:
    dtype = _dtype(dtype)
    if x.dtype not in _FLOAT_INPUTS:
        raise ValueError(f"quantize_per_channel: input must be float32/float16/bfloat16, got {x.dtype}")
    _check_range(qmin, qmax, dtype)
    _check_per_channel(x, scales, zero_points, axis, "quantize_per_channel")
    _check_out(out, dtype, x)
    out.copy_(_qd().quantize_per_channel.default(x, scales, zero_points, axis % x.dim(), qmin, qmax, dtype))


def dequantize_per_channel(x, scales, zero_points, axis, qmin, qmax, dtype, out_dtype, out, *_ret) -> None:
    dtype, out_dtype = _dtype(dtype), _dtype(out_dtype) or torch.float32
    if x.dtype != dtype:
        raise ValueError(f"dequantize_per_channel: input has dtype {x.dtype}, the call says {dtype}")
    _check_range(qmin, qmax, dtype)
    _check_per_channel(x, scales, zero_points, axis, "dequantize_per_channel")
    _check_out(out, out_dtype, x)
    out.copy_(_qd().dequantize_per_channel.default(x, scales, zero_points, axis % x.dim(), qmin, qmax, dtype,
                                                   out_dtype=out_dtype))


def choose_qparams(x, qmin, qmax, eps, dtype, scale_out, zero_point_out, *_ret) -> None:
    """choose_qparams.Tensor_out: per-tensor affine qparams from the input's min and max."""
    dtype = _dtype(dtype)
    if x.dtype not in _FLOAT_INPUTS:
        raise ValueError(f"choose_qparams: input must be float32/float16/bfloat16, got {x.dtype}")
    _check_range(qmin, qmax, dtype)
    if x.numel() == 0:
        raise ValueError("choose_qparams: the input is empty")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"choose_qparams: eps must be finite and positive, got {eps}")
    scale, zero_point = _qd().choose_qparams.tensor(x, qmin, qmax, eps, dtype)
    for name, src, dst in (("scale_out", scale, scale_out), ("zero_point_out", zero_point, zero_point_out)):
        if dst.numel() != src.numel():
            raise ValueError(f"choose_qparams: {name} holds {dst.numel()} elements, expected {src.numel()}")
        reshape_in_place(dst, src.shape)
        dst.copy_(src)


# name -> (kernel, positions of the out arguments a trace logs)
QUANT_KERNELS = {
    "quantized_decomposed::quantize_per_tensor.out": (quantize_per_tensor, (6,)),
    "quantized_decomposed::quantize_per_tensor.Tensor_out": (quantize_per_tensor, (6,)),
    "quantized_decomposed::dequantize_per_tensor.out": (dequantize_per_tensor, (7,)),
    "quantized_decomposed::dequantize_per_tensor.Tensor_out": (dequantize_per_tensor, (7,)),
    "quantized_decomposed::quantize_per_channel.out": (quantize_per_channel, (7,)),
    "quantized_decomposed::dequantize_per_channel.out": (dequantize_per_channel, (8,)),
    "quantized_decomposed::choose_qparams.Tensor_out": (choose_qparams, (5, 6)),
}
