"""The native float kernels of the XNNPACK host backend (`_native/conv.cpp`) against torch.

Each kernel (pointwise convolution and fully connected layer as a GEMM with the weight packed at load,
depthwise convolution, im2col convolution) must compute torch's convolution / linear of the same float32
values within float rounding (sums in another order), with the bias and clamp fused, in every form the CPU has
(plain C++ with MKL's packed GEMM, AVX2 with it, AVX-512 with the own GEMM: forced through `packed_float_isa`),
on odd sizes: channel counts off the 16/32-lane blocks, strides, asymmetric paddings, dilations, no bias, runs
on other shapes than the one packed for. The backend's own use (`_prepacked`) is checked too: each kernel is
compared once at load and the node falls back when there is none.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from etlab.runtime._native import _core

pytestmark = pytest.mark.skipif(_core is None or not hasattr(_core, "packed_conv2d"), reason="native core not built")

FORMS = [f for f in (0, 1, 2) if _core is not None and hasattr(_core, "packed_float_isa")
         and _core.packed_float_isa(f) == f]
if _core is not None and hasattr(_core, "packed_float_isa"):
    _core.packed_float_isa(2)


@pytest.fixture(params=FORMS, ids=lambda f: ("plain", "avx2", "avx512")[f])
def form(request):
    _core.packed_float_isa(request.param)
    yield request.param
    _core.packed_float_isa(2)


def _reference(x_nhwc, w, b, pads, stride, dilation, groups, clamp):
    y = F.conv2d(F.pad(x_nhwc.permute(0, 3, 1, 2).double(), pads), w.double(), None if b is None else b.double(),
                 stride, 0, dilation, groups)
    y = y.permute(0, 2, 3, 1)
    return (y, y.clamp(*clamp) if clamp else y)


def _close(got, want):
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4 * (1 + float(want.abs().max())))


CONVS = [  # (N, C, H, W), out channels, kernel, stride, dilation, pads (l, r, t, b), groups, expected kind
    ((1, 19, 7, 9), 37, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "pointwise"),
    ((2, 3, 5, 4), 5, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "pointwise"),
    ((1, 64, 3, 3), 16, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "pointwise"),
    ((1, 33, 11, 13), 33, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 33, "depthwise"),
    ((1, 70, 12, 10), 70, (3, 3), (2, 2), (1, 1), (0, 1, 0, 1), 70, "depthwise"),
    ((2, 17, 9, 9), 17, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 17, "depthwise"),
    ((1, 24, 15, 14), 24, (5, 5), (2, 2), (1, 1), (1, 2, 2, 1), 24, "depthwise"),
    ((1, 20, 10, 10), 20, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), 20, "depthwise"),
    ((1, 8, 6, 7), 8, (3, 2), (1, 2), (1, 1), (1, 0, 0, 1), 8, "depthwise"),
    ((1, 3, 17, 15), 10, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, "im2col"),
    ((1, 5, 9, 11), 6, (3, 3), (2, 2), (1, 1), (2, 0, 1, 3), 1, "im2col"),
    ((2, 7, 8, 8), 9, (2, 3), (1, 1), (2, 1), (0, 1, 1, 0), 1, "im2col"),
    ((1, 4, 6, 6), 12, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0), 1, "im2col"),
]


@pytest.mark.parametrize("case", range(len(CONVS)))
def test_a_packed_convolution_is_torchs(form, case):
    shape, cout, kernel, stride, dilation, pads, groups, kind = CONVS[case]
    bias, clamp = [(True, (0.0, 6.0)), (False, (-0.5, math.inf)), (True, None)][case % 3]  # bias absent, no clamp
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(cout, shape[1] // groups, *kernel, generator=gen)
    b = torch.randn(cout, generator=gen) if bias else None
    lo, hi = clamp if clamp else (-math.inf, math.inf)
    conv = _core.packed_conv2d(w, b, list(pads), list(stride), list(dilation), groups, lo, hi, list(shape))
    assert conv is not None and conv.kind == kind
    x = torch.randn(shape, generator=gen).permute(0, 2, 3, 1).contiguous()
    raw, clamped = _reference(x, w, b, pads, stride, dilation, groups, clamp)
    _close(conv(x, False), raw)
    y = conv(x)
    _close(y, clamped)
    assert y.is_contiguous() and y.shape == clamped.shape
    view = torch.randn(shape, generator=gen).permute(0, 2, 3, 1)  # NCHW memory seen as NHWC: any strides
    _close(conv(view), _reference(view, w, b, pads, stride, dilation, groups, clamp)[1])
    bigger = torch.randn(shape[0], shape[2] + 3, shape[3] + 5, shape[1], generator=gen)  # not the packed shape
    _close(conv(bigger), _reference(bigger, w, b, pads, stride, dilation, groups, clamp)[1])


def test_a_result_is_handed_out_again_only_when_nobody_holds_it():
    """The kernel keeps its last result to reuse it (no fresh memory per call), but never one still in use."""
    w = torch.randn(8, 4, 1, 1)
    conv = _core.packed_conv2d(w, None, [0, 0, 0, 0], [1, 1], [1, 1], 1, -math.inf, math.inf, [1, 4, 5, 5])
    x = torch.randn(1, 5, 5, 4)
    first = conv(x)
    kept = first.clone()
    second = conv(x * 2)
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, kept)
    view = second[0]
    del second
    third = conv(x * 3)
    assert third.data_ptr() != view.data_ptr()  # a view keeps it too
    del view, third
    fourth = conv(x)
    torch.testing.assert_close(fourth, kept, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows, k, n, bias, clamp", [(1, 1280, 1000, True, (-1.0, 1.0)), (3, 17, 33, False, None),
                                                    (12, 64, 16, True, None), (40, 5, 70, False, (0.0, 6.0))])
def test_a_packed_linear_layer_is_torchs(form, rows, k, n, bias, clamp):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    lo, hi = clamp if clamp else (-math.inf, math.inf)
    linear = _core.packed_linear(w, b, lo, hi, rows)
    assert linear is not None
    for shape in ((rows, k), (2, rows, k), (max(rows - 1, 1), k)):
        x = torch.randn(shape, generator=gen)
        want = F.linear(x.double(), w.double(), None if b is None else b.double())
        _close(linear(x, False), want)
        _close(linear(x), want.clamp(*clamp) if clamp else want)


def test_what_the_kernels_do_not_take_is_refused():
    """Grouped convolutions that are not depthwise, depthwise ones with a channel multiplier, non-float weights:
    None (the backend keeps its other path); a wrong input is an error naming what is expected."""
    w = torch.randn(8, 2, 3, 3)
    assert _core.packed_conv2d(w, None, [1, 1, 1, 1], [1, 1], [1, 1], 2, 0.0, 6.0, [1, 4, 8, 8]) is None
    w = torch.randn(8, 1, 3, 3)
    assert _core.packed_conv2d(w, None, [1, 1, 1, 1], [1, 1], [1, 1], 4, 0.0, 6.0, [1, 4, 8, 8]) is None
    assert _core.packed_conv2d(w.double(), None, [1, 1, 1, 1], [1, 1], [1, 1], 8, 0.0, 6.0, [1, 8, 8, 8]) is None
    assert _core.packed_linear(torch.randn(4, 3).half(), None, 0.0, 1.0, 1) is None
    conv = _core.packed_conv2d(w, None, [1, 1, 1, 1], [1, 1], [1, 1], 8, 0.0, 6.0, [1, 8, 8, 8])
    with pytest.raises(RuntimeError, match="8 channels"):
        conv(torch.randn(1, 8, 8, 5))


@pytest.mark.parametrize(("pads", "stride", "dilation"), [
    ([0, 0, 0, 0], [0, 1], [1, 1]), ([0, 0, 0, 0], [1, 1], [1, 0]), ([-1, 0, 0, 0], [1, 1], [1, 1])])
def test_a_geometry_no_convolution_has_is_refused_natively(pads, stride, dilation):
    """The backend checks a payload's geometry first; the kernel refuses it too (a zero stride divides by zero, a
    negative pad reads before the input), so no caller can make it crash."""
    w = torch.randn(8, 8, 3, 3)
    assert _core.packed_conv2d(w, None, pads, stride, dilation, 1, 0.0, 6.0, [1, 8, 8, 8]) is None


def test_the_backend_takes_the_native_kernels_and_checks_them():
    """`prepacked_conv2d` / `prepacked_linear` hand out the native kernels (checked against torch at load)."""
    from etlab.runtime.backends.xnnpack import _prepacked

    w, b = torch.randn(16, 8, 1, 1), torch.randn(16)
    run = _prepacked.prepacked_conv2d(w, b, (0, 0, 0, 0), (1, 1), (1, 1), 1, (0.0, 6.0), [1, 8, 6, 6])
    assert getattr(run, "kind", None) == "pointwise"
    x = torch.randn(1, 6, 6, 8)
    _close(run(x), _reference(x, w, b, (0, 0, 0, 0), (1, 1), (1, 1), 1, (0.0, 6.0))[1])
    fc = _prepacked.prepacked_linear(torch.randn(10, 8), None, None, (1, 8))
    assert fc is not None
    assert _prepacked.prepacked_linear(torch.randn(10, 8), None, None, (1, 9)) is None  # not the weight's width
