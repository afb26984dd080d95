"""Two ATen out-variants torch computes into a temporary and then copies: bound instead to an
equivalent call that writes straight into the planned output (bit-identical results).

- `aten::_native_batch_norm_legit_no_training.out` -> `native_batch_norm(..., training=False, out=...)`;
- `aten::convolution.out`, when torch would run the convolution with its Slow2d backend (1x1
  convolutions when single-threaded, among others) -> `thnn_conv2d(..., out=...)`, the kernel
  that backend calls. Torch's choice depends on the thread count, so it is asked again whenever
  that changes.

Only static shapes whose arguments are all known at load time; everything else, and every check,
goes through the generic binding of `_torch_kernels`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from etlab.runtime._registry import KernelEntry, Site, Step
from etlab.runtime._torch_kernels import torch_kernel
from etlab.runtime._values import TENSOR, ValueTable


def _all_static(table: ValueTable, slots: list[int]) -> bool:
    return all(table.resolver(s) is None and (table.kinds[s] != TENSOR or table.is_static_shape(s)) for s in slots)


def _bind_batch_norm(base: KernelEntry, table: ValueTable, args: list[int], site: Site) -> Step:
    step = base.bind(table, args, site)  # checks the call; the fallback
    if len(args) < 10 or not _all_static(table, args[:10]):
        return step
    x, weight, bias, mean, var, momentum, eps, out, save_mean, save_invstd = (table.values[s] for s in args[:10])
    return functools.partial(torch.native_batch_norm, x, weight, bias, mean, var, False, momentum, eps,
                             out=(out, save_mean, save_invstd))


def _bind_convolution(base: KernelEntry, table: ValueTable, args: list[int], site: Site) -> Step:
    step = base.bind(table, args, site)
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None or len(args) < 10 or not _all_static(table, args[:10]):
        return step
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, out = (
        table.values[s] for s in args[:10])
    if transposed or groups != 1 or x.dim() != 4 or any(d != 1 for d in dilation):
        return step
    if not (x.is_contiguous() and weight.is_contiguous() and out.is_contiguous()):
        return step
    direct = functools.partial(torch._C._nn.thnn_conv2d, x, weight, list(weight.shape[2:]), bias, stride, padding,
                               out=out)
    backend_args = (x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    slow2d = torch._C._ConvBackend.Slow2d
    threads = torch.get_num_threads
    by_threads: dict[int, Step] = {}

    def convolution() -> None:
        n = threads()
        fn = by_threads.get(n)
        if fn is None:
            fn = by_threads[n] = direct if select(*backend_args) == slow2d else step
        fn()

    return convolution


_BINDERS = {
    "aten::_native_batch_norm_legit_no_training.out": _bind_batch_norm,
    "aten::convolution.out": _bind_convolution,
}


@functools.cache
def direct_kernel(name: str) -> KernelEntry | None:
    binder = _BINDERS.get(name)
    base = torch_kernel(name) if binder is not None else None
    if base is None:
        return None
    return dataclasses.replace(base, bind=functools.partial(binder, base), origin="builtin")
