"""ATen out-variants bound to something cheaper with bit-identical results.

Two that torch computes into a temporary and then copies are bound instead to an equivalent call
that writes straight into the planned output:

- `aten::_native_batch_norm_legit_no_training.out` -> `native_batch_norm(..., training=False, out=...)`;
- `aten::convolution.out`, when torch would run the convolution with its Slow2d backend (1x1
  convolutions when single-threaded, among others) -> `thnn_conv2d(..., out=...)`, the kernel
  that backend calls. Torch's choice depends on the thread count, so it is asked again whenever
  that changes.

And layout copies of constant data (`permute_copy` of a linear layer's weight, which Edge emits
before every `addmm`; `expand_copy`, `t_copy`, ...) are computed once, at load: the output value is
re-pointed at a private tensor holding the result (as `et_view` re-points its output), and the
instruction does nothing when it runs. Each run used to copy every weight matrix of a transformer
(a Swin-T moves 110 MB per call that way, half its time); eager reads the weight in place. The same
copy made again (an unrolled LSTM permutes its recurrent weight at each of its time steps) shares the
first one's result: 49 private copies of a 256 KB weight put each step's matrix-vector product in
main memory (5x slower than the one shared copy, which stays in cache).

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


def folded_at_load() -> None:
    """The step of an instruction computed at load: nothing to do when it runs (the native core calls it
    back rather than running the kernel itself)."""
    return None


def _bind_constant_layout(base: KernelEntry, table: ValueTable, args: list[int], site: Site) -> Step:
    """A layout copy (input, static arguments..., out) of constant data: computed now, into memory of its own."""
    step = base.bind(table, args, site)
    if len(args) < 2 or args[0] not in table.constant:
        return step
    out_slot = args[-1]
    if (table.kinds[out_slot] != TENSOR or out_slot not in table.planned or out_slot in table.constant
            or not table.is_static_shape(out_slot) or out_slot in table.dynamic):
        return step
    if any(table.resolver(s) is not None or (table.kinds[s] == TENSOR and s not in table.constant)
           for s in args[1:] if s != out_slot):  # (out is listed twice: the out argument and the return)
        return step
    out = table.values[out_slot]
    key = (base.name, args[0], tuple(("slot", s) if table.kinds[s] == TENSOR else repr(table.values[s])
                                     for s in args[1:] if s != out_slot),
           out.dtype, tuple(out.shape), out.stride())
    done = table.folded.get(key)
    if done is None:
        step()  # into the planned memory, then moved out of it: nothing else may overwrite the result
        done = table.folded[key] = out.clone(memory_format=torch.preserve_format)
    out.set_(done)  # the same copy written again (a recurrent weight's, every time step): shared
    return folded_at_load


_LAYOUT_COPIES = ("aten::permute_copy.out", "aten::t_copy.out", "aten::transpose_copy.int_out",
                  "aten::expand_copy.out", "aten::unsqueeze_copy.out", "aten::squeeze_copy.out",
                  "aten::squeeze_copy.dim_out", "aten::squeeze_copy.dims_out", "aten::view_copy.out",
                  "aten::slice_copy.Tensor_out", "aten::select_copy.int_out", "aten::alias_copy.out",
                  "aten::clone.out")
_BINDERS = {
    "aten::_native_batch_norm_legit_no_training.out": _bind_batch_norm,
    "aten::convolution.out": _bind_convolution,
    **dict.fromkeys(_LAYOUT_COPIES, _bind_constant_layout),
}
# The layout copies keep the origin "torch": the native core runs the ones not folded as torch kernels.
_TORCH_ORIGIN = frozenset(_LAYOUT_COPIES)


# The view operator each copy out-variant writes out (same arguments, without `out`): the native core copies
# small ones itself, from where the view lies (`_native/_plan.py`).
_VIEW_OF = {
    "aten::slice_copy.Tensor_out": ("slice", "Tensor"), "aten::select_copy.int_out": ("select", "int"),
    "aten::squeeze_copy.out": ("squeeze", "default"), "aten::squeeze_copy.dim_out": ("squeeze", "dim"),
    "aten::squeeze_copy.dims_out": ("squeeze", "dims"), "aten::unsqueeze_copy.out": ("unsqueeze", "default"),
    "aten::view_copy.out": ("view", "default"), "aten::permute_copy.out": ("permute", "default"),
    "aten::t_copy.out": ("t", "default"), "aten::transpose_copy.int_out": ("transpose", "int"),
    "aten::expand_copy.out": ("expand", "default"), "aten::alias_copy.out": ("alias", "default"),
    "aten::split_with_sizes_copy.out": ("split_with_sizes", "default"),
    "aten::split_copy.Tensor_out": ("split", "Tensor"), "aten::unbind_copy.int_out": ("unbind", "int"),
}


@functools.cache
def view_operator(name: str):
    """(the view operator, the copy's schema) of a copy out-variant named `name`, or None."""
    view = _VIEW_OF.get(name)
    if view is None:
        return None
    base, overload = name.split("::", 1)[1].split(".")
    copy = getattr(getattr(torch.ops.aten, base), overload)
    return getattr(getattr(torch.ops.aten, view[0]), view[1]), copy._schema


@functools.cache
def direct_kernel(name: str) -> KernelEntry | None:
    """The kernel entry of an operator that has a binder: torch's kernel with its arguments bound once per
    instruction at load, so a call skips the generic argument handling; None for other operators (cached per
    name)."""
    binder = _BINDERS.get(name)
    base = torch_kernel(name) if binder is not None else None
    if base is None:
        return None
    origin = base.origin if name in _TORCH_ORIGIN else "builtin"
    return dataclasses.replace(base, bind=functools.partial(binder, base), origin=origin)
