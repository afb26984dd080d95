"""Kernels for the `quantized_decomposed` out variants a quantized `.pte` calls (upstream's names).

Per-tensor quantize/dequantize run on every activation of a quantized program, so they are
computed straight into the planned output with in-place steps; the arithmetic is torch's own
reference (`torch.ao.quantization.fx._decomposed`), step for step, so results are bit-identical
to the converted model run in torch eager:
  quantize:   out = clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max) as dtype
  dequantize: out = (q as float - zero_point) * scale
Per-channel ops broadcast their qparams along the axis (the same arithmetic); choose_qparams calls
torch's reference. Every argument comes from a file, so each kernel checks dtypes, ranges, shapes
and that it writes no constant data, once at load (a LoadError naming the instruction), and the
values that change between runs on every call (a ValueError).
"""

from __future__ import annotations

import importlib
import math

import torch

from etlab.runtime._errors import LoadError
from etlab.runtime._memory import reshape_in_place
from etlab.runtime._registry import Site, Step
from etlab.runtime._values import TENSOR, ValueTable
from etlab.schema.scalar_type import scalar_type_to_dtype

# Integer dtypes a quantized value may have, with their value range (torch's _DTYPE_TO_QVALUE_BOUNDS).
_Q_BOUNDS = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-(2**15), 2**15 - 1),
             torch.int32: (-(2**31), 2**31 - 1)}
_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def _qd():
    importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers torch.ops.quantized_decomposed
    return torch.ops.quantized_decomposed


def _dtype(v) -> torch.dtype | None:
    return scalar_type_to_dtype(v) if _is_int(v) else v


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


# Each `_prepare_*` checks what cannot change while a method lives (dtypes, ranges, constant
# qparams) once, and returns the step that computes into `out`; the .Tensor overloads' qparams are
# tensors whose values may change, so they are read (and checked) on every call.

_SCALE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_ZERO_POINT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _qparams_getter(scale, zero_point):
    if isinstance(scale, torch.Tensor) or isinstance(zero_point, torch.Tensor):
        # A tensor's dtype cannot change: checked now (its values, on every call).
        for what, t, dtypes in (("scale", scale, _SCALE_DTYPES), ("zero_point", zero_point, _ZERO_POINT_DTYPES)):
            if isinstance(t, torch.Tensor) and t.dtype not in dtypes:
                raise ValueError(f"{what} must be a tensor of {'/'.join(str(d) for d in dtypes)}, got {t.dtype}")
        return lambda: _scalar_qparams(scale, zero_point)
    fixed = _scalar_qparams(scale, zero_point)
    return lambda: fixed


def _float_input(x: torch.Tensor, what: str) -> bool:
    """Checks `x` may be quantized; True when it must first be converted to float32 (as torch does)."""
    if x.dtype not in _FLOAT_INPUTS:
        raise ValueError(f"{what}: input must be float32/float16/bfloat16, got {x.dtype}")
    return x.dtype != torch.float32


def _dequantize_dtypes(x, qmin: int, qmax: int, dtype, out_dtype, what: str) -> torch.dtype:
    """Checks a dequantize call's input dtype and range; returns its (floating) output dtype."""
    dtype, out_dtype = _dtype(dtype), _dtype(out_dtype) or torch.float32
    if x.dtype != dtype:
        raise ValueError(f"{what}: input has dtype {x.dtype}, the call says {dtype}")
    _check_range(qmin, qmax, dtype)
    if not out_dtype.is_floating_point:
        raise ValueError(f"{what}: out_dtype must be floating, got {out_dtype}")
    return out_dtype


def _prepare_quantize_per_tensor(x, scale, zero_point, qmin, qmax, dtype, out):
    dtype = _dtype(dtype)
    to_float = _float_input(x, "quantize_per_tensor")
    _check_range(qmin, qmax, dtype)
    _check_out(out, dtype, x)
    qparams = _qparams_getter(scale, zero_point)

    def step() -> None:
        s, z = qparams()
        if out.shape != x.shape:
            reshape_in_place(out, x.shape)
        scaled = torch.mul(x.to(torch.float32) if to_float else x, 1.0 / s)
        scaled.round_()
        if z:
            scaled.add_(z)
        scaled.clamp_(qmin, qmax)
        out.copy_(scaled)

    return step


def _prepare_dequantize_per_tensor(x, scale, zero_point, qmin, qmax, dtype, out_dtype, out):
    _check_out(out, _dequantize_dtypes(x, qmin, qmax, dtype, out_dtype, "dequantize_per_tensor"), x)
    qparams = _qparams_getter(scale, zero_point)

    def step() -> None:
        s, z = qparams()
        if out.shape != x.shape:
            reshape_in_place(out, x.shape)
        out.copy_(x)
        if z:
            out.sub_(z)
        out.mul_(s)

    return step


def _check_per_channel(x, scales, zero_points, axis: int, what: str) -> list[int]:
    """Checks the per-channel qparams against the input; returns the shape that broadcasts them along `axis`."""
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"{what}: axis {axis} is out of range for a {x.dim()}-d input")
    channels = x.shape[axis]
    if scales.dim() != 1 or scales.numel() != channels or not scales.dtype.is_floating_point:
        raise ValueError(f"{what}: scales must be a 1-d floating tensor of {channels} elements (the input's size "
                         f"on axis {axis}), got {scales.dtype} of shape {tuple(scales.shape)}")
    if zero_points is not None and (zero_points.dim() != 1 or zero_points.numel() != channels
                                    or zero_points.dtype not in _ZERO_POINT_DTYPES):
        raise ValueError(f"{what}: zero_points must be a 1-d integer tensor of {channels} elements, got "
                         f"{zero_points.dtype} of shape {tuple(zero_points.shape)}")
    shape = [1] * x.dim()
    shape[axis] = channels
    return shape


def _prepare_quantize_per_channel(x, scales, zero_points, axis, qmin, qmax, dtype, out):
    dtype = _dtype(dtype)
    to_float = _float_input(x, "quantize_per_channel")
    _check_range(qmin, qmax, dtype)
    shape = _check_per_channel(x, scales, zero_points, axis, "quantize_per_channel")
    if zero_points is None:
        raise ValueError("quantize_per_channel: zero_points is required")
    _check_out(out, dtype, x)
    s, z = scales.view(shape), zero_points.view(shape)

    def step() -> None:
        scaled = torch.mul(x.to(torch.float32) if to_float else x, 1.0 / s)
        scaled.round_().add_(z).clamp_(qmin, qmax)
        out.copy_(scaled)

    return step


def _prepare_dequantize_per_channel(x, scales, zero_points, axis, qmin, qmax, dtype, out_dtype, out):
    out_dtype = _dequantize_dtypes(x, qmin, qmax, dtype, out_dtype, "dequantize_per_channel")
    shape = _check_per_channel(x, scales, zero_points, axis, "dequantize_per_channel")
    _check_out(out, out_dtype, x)
    s = scales.view(shape)
    z = None if zero_points is None else zero_points.view(shape)

    def step() -> None:
        out.copy_(x)
        if z is not None:
            out.sub_(z)
        out.mul_(s)

    return step


def _prepare_choose_qparams(x, qmin, qmax, eps, dtype, scale_out, zero_point_out):
    """choose_qparams.Tensor_out: per-tensor affine qparams from the input's min and max (torch's reference)."""
    dtype = _dtype(dtype)
    _float_input(x, "choose_qparams")
    _check_range(qmin, qmax, dtype)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"choose_qparams: eps must be finite and positive, got {eps}")
    if not qmin <= 0 <= qmax or qmin == qmax:  # torch's reference asserts this on every call
        raise ValueError(f"choose_qparams: quant_min/quant_max [{qmin}, {qmax}] must include 0")
    for name, dst, dtypes in (("scale_out", scale_out, _SCALE_DTYPES),
                              ("zero_point_out", zero_point_out, _ZERO_POINT_DTYPES + _SCALE_DTYPES)):
        if dst.numel() != 1:
            raise ValueError(f"choose_qparams: {name} holds {dst.numel()} elements, expected 1")
        if dst.dtype not in dtypes:
            raise ValueError(f"choose_qparams: {name} must be of {'/'.join(map(str, dtypes))}, got {dst.dtype}")
    choose = _qd().choose_qparams.tensor

    def step() -> None:
        if x.numel() == 0:
            raise ValueError("choose_qparams: the input is empty")
        scale, zero_point = choose(x, qmin, qmax, eps, dtype)
        scale_out.copy_(scale.view(scale_out.shape))
        zero_point_out.copy_(zero_point.view(zero_point_out.shape))

    return step


def _call(prepare):
    """The kernel as a plain function of all its arguments (checks and computes at once)."""
    def kernel(*args):
        prepare(*args[:prepare.__code__.co_argcount])()

    kernel.__doc__ = prepare.__doc__
    return kernel


quantize_per_tensor = _call(_prepare_quantize_per_tensor)
dequantize_per_tensor = _call(_prepare_dequantize_per_tensor)
quantize_per_channel = _call(_prepare_quantize_per_channel)
dequantize_per_channel = _call(_prepare_dequantize_per_channel)
choose_qparams = _call(_prepare_choose_qparams)


def _binder(prepare, outs: tuple[int, ...]):
    """A kernel binding: checks the call's slots (tensors where tensors belong, outputs not constant
    data) and prepares the step at load time; arguments that change between runs (symbolic values)
    make it check and compute on every call instead."""
    n = prepare.__code__.co_argcount
    names = prepare.__code__.co_varnames[:n]

    def bind(table: ValueTable, args: list[int], site: Site) -> Step:
        if len(args) < n:
            raise LoadError(f"{site}: expects {n} arguments ({', '.join(names)}), got {len(args)}")
        for a in args:
            table.check_slot(a, str(site))
        for i in outs:
            if table.kinds[args[i]] != TENSOR:
                raise LoadError(f"{site}: argument {names[i]!r} must be a tensor, value {args[i]} is a "
                                f"{table.kinds[args[i]]}")
            if args[i] in table.constant:
                raise LoadError(f"{site}: argument {names[i]!r} writes into value {args[i]}, which is constant data")
        if table.kinds[args[0]] != TENSOR:
            raise LoadError(f"{site}: argument {names[0]!r} must be a tensor, value {args[0]} is a "
                            f"{table.kinds[args[0]]}")
        getters = [table.resolver(a) for a in args[:n]]
        values = table.values
        if any(g is not None for g in getters):
            def dynamic_step() -> None:
                prepare(*[g() if g is not None else values[a] for g, a in zip(getters, args)])()

            return dynamic_step
        try:
            return prepare(*[values[a] for a in args[:n]])
        except (ValueError, TypeError) as e:
            raise LoadError(f"{site}: {e}") from None

    return bind


# name -> (binding, positions of the out arguments a trace logs)
QUANT_KERNELS = {
    "quantized_decomposed::quantize_per_tensor.out": (_binder(_prepare_quantize_per_tensor, (6,)), (6,)),
    "quantized_decomposed::quantize_per_tensor.Tensor_out": (_binder(_prepare_quantize_per_tensor, (6,)), (6,)),
    "quantized_decomposed::dequantize_per_tensor.out": (_binder(_prepare_dequantize_per_tensor, (7,)), (7,)),
    "quantized_decomposed::dequantize_per_tensor.Tensor_out": (_binder(_prepare_dequantize_per_tensor, (7,)), (7,)),
    "quantized_decomposed::quantize_per_channel.out": (_binder(_prepare_quantize_per_channel, (7,)), (7,)),
    "quantized_decomposed::dequantize_per_channel.out": (_binder(_prepare_dequantize_per_channel, (8,)), (8,)),
    "quantized_decomposed::choose_qparams.Tensor_out": (_binder(_prepare_choose_qparams, (5, 6)), (5, 6)),
}


# -- the native core's kernels (etlab/runtime/_native/quant.cpp) -----------------------------------------------
# Same arithmetic and checks, computed in C++ without the GIL. The native core binds a call to them when
# its arguments are of the kinds they take; everything else keeps the Python step above.

_NATIVE_SCALES = (torch.float32, torch.float64)  # per-channel scale dtypes the native kernels take


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def native_call(name: str, values: list, static_shapes: bool) -> tuple[str, str, list] | None:
    """(operator, overload, arguments) of the `etlab_native` kernel that computes kernel `name` on these
    argument values (a bound call's, already checked by its `_prepare_*`) bit-identically, or None.

    Per-tensor calls need both qparams as numbers (`.out`) or both as tensors (`.tensor_out`); per-channel
    calls need static shapes (their qparams broadcast along the load-time shape) and float32/float64
    scales."""
    op = name.split("::", 1)[1].split(".", 1)[0]
    if op in ("quantize_per_tensor", "dequantize_per_tensor"):
        x, scale, zero_point, qmin, qmax = values[:5]
        out = values[6 if op == "quantize_per_tensor" else 7]
        if isinstance(scale, torch.Tensor) and isinstance(zero_point, torch.Tensor):
            overload = "tensor_out"
        elif isinstance(scale, (int, float)) and not isinstance(scale, bool) and _is_int(zero_point):
            overload, scale = "out", float(scale)
        else:
            return None
        return f"etlab_native::{op}", overload, [x, scale, zero_point, qmin, qmax, out]
    if op in ("quantize_per_channel", "dequantize_per_channel") and static_shapes:
        x, scales, zero_points, axis, qmin, qmax = values[:6]
        out = values[7 if op == "quantize_per_channel" else 8]
        if not isinstance(scales, torch.Tensor) or scales.dtype not in _NATIVE_SCALES:
            return None
        return f"etlab_native::{op}", "out", [x, scales, zero_points, axis, qmin, qmax, out]
    if op == "choose_qparams":
        x, qmin, qmax, eps, _dtype, scale_out, zero_point_out = values[:7]
        return "etlab_native::choose_qparams", "tensor_out", [x, qmin, qmax, float(eps), scale_out, zero_point_out]
    return None
