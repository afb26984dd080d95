"""Out variants of torch's `quantized_decomposed` operators, under the names upstream's kernels use.

torch defines only the functional overloads (`quantize_per_tensor`, `.tensor`, ...); a `.pte`
names each kernel by its out variant, and upstream's quantized kernel library
(kernels/quantized/quantized.yaml) calls them `quantize_per_tensor.out`,
`quantize_per_tensor.Tensor_out`, `dequantize_per_tensor.out` / `.Tensor_out`,
`quantize_per_channel.out`, `dequantize_per_channel.out` and `choose_qparams.Tensor_out`. Defining
those schemas here (the same argument lists) lets the compiler's out-variant lookup find them like
any ATen out variant. Each runs the functional op and copies into `out`, so a graph calling one is
also runnable in torch eager. Defined once per process, only where torch (or another library in the
process) has not defined them already.
"""

from __future__ import annotations

import functools
import importlib

import torch

# name -> (schema after the name, functional overload it computes)
_SCHEMAS: dict[str, tuple[str, str]] = {
    "quantize_per_tensor.out": (
        "(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype, *, "
        "Tensor(a!) out) -> Tensor(a!)", "quantize_per_tensor.default"),
    "quantize_per_tensor.Tensor_out": (
        "(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, ScalarType dtype, *, "
        "Tensor(a!) out) -> Tensor(a!)", "quantize_per_tensor.tensor"),
    "dequantize_per_tensor.out": (
        "(Tensor input, float scale, int zero_point, int quant_min, int quant_max, ScalarType dtype, *, "
        "ScalarType? out_dtype=None, Tensor(a!) out) -> Tensor(a!)", "dequantize_per_tensor.default"),
    "dequantize_per_tensor.Tensor_out": (
        "(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, ScalarType dtype, *, "
        "ScalarType? out_dtype=None, Tensor(a!) out) -> Tensor(a!)", "dequantize_per_tensor.tensor"),
    "quantize_per_channel.out": (
        "(Tensor input, Tensor scales, Tensor zero_points, int axis, int quant_min, int quant_max, "
        "ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)", "quantize_per_channel.default"),
    "dequantize_per_channel.out": (
        "(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, int quant_max, "
        "ScalarType dtype, *, ScalarType? out_dtype=None, Tensor(a!) out) -> Tensor(a!)",
        "dequantize_per_channel.default"),
    "choose_qparams.Tensor_out": (
        "(Tensor input, int quant_min, int quant_max, float eps, ScalarType dtype, *, Tensor(a!) scale_out, "
        "Tensor(b!) zero_point_out) -> (Tensor(a!), Tensor(b!))", "choose_qparams.tensor"),
}

_LIBRARY: list[torch.library.Library] = []  # kept alive: dropping a Library removes its definitions


def _functional(qualified: str):
    base, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops.quantized_decomposed, base), overload)


def _exists(name: str) -> bool:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.quantized_decomposed, base, None)
    return packet is not None and overload in packet.overloads()


def _copy_into(out: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    if out.shape != value.shape:
        out.resize_(value.shape)
    return out.copy_(value)


def _single_out_kernel(functional: str):
    def kernel(*args, out, **kwargs):
        return _copy_into(out, _functional(functional)(*args, **kwargs))

    return kernel


def _choose_qparams_kernel(x, quant_min, quant_max, eps, dtype, *, scale_out, zero_point_out):
    scale, zero_point = torch.ops.quantized_decomposed.choose_qparams.tensor(x, quant_min, quant_max, eps, dtype)
    return _copy_into(scale_out, scale), _copy_into(zero_point_out, zero_point)


@functools.cache
def register_quantized_out_variants() -> None:
    """Defines the out variants this process lacks (idempotent)."""
    importlib.import_module("torch.ao.quantization.fx._decomposed")  # torch's functional overloads
    missing = [name for name in _SCHEMAS if not _exists(name)]
    if not missing:
        return
    lib = torch.library.Library("quantized_decomposed", "FRAGMENT")
    for name in missing:
        schema, functional = _SCHEMAS[name]
        lib.define(name + schema)
        kernel = _choose_qparams_kernel if name.startswith("choose_qparams") else _single_out_kernel(functional)
        lib.impl(name, kernel, "CompositeExplicitAutograd")
    _LIBRARY.append(lib)
