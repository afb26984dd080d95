"""The native int8 kernels of the XNNPACK host backend (`_native/qconv.cpp`) against a plain integer reference.

Values are int8 shifted into uint8 (q + 128), as the backend holds them. The reference computes each
convolution as XNNPACK specifies it: int32 sums of (x - x_zp) * w plus the int32 bias, times the float32
requantization scale, clamped, rounded to nearest-even, plus the output zero point. The kernels must equal it
exactly, in every instruction-set form the CPU has (scalar, AVX2, AVX-512 VNNI: forced through `isa`), on odd
channel counts (tails of the 16-channel blocks and of the 4-byte groups), zero points, clamps, strides,
paddings (asymmetric too), dilations and per-channel scales. Adds use XNNPACK's fixed-point form: within one
step of the exact sum, and the same in every form.
"""

from __future__ import annotations

import numpy as np
import pytest

from etlab.runtime._native import _core

pytestmark = pytest.mark.skipif(_core is None or not hasattr(_core, "QConv2d"), reason="native core not built")

ISAS = [isa for isa in (0, 1, 2) if _core is not None and hasattr(_core, "int8_isa") and _core.int8_isa(isa) == isa]


def _torch(a):
    import torch
    return torch.from_numpy(np.ascontiguousarray(a))


def _requant(acc: np.ndarray, scale: np.ndarray, y_zp: int, lo: int, hi: int) -> np.ndarray:
    f = acc.astype(np.float32) * scale.astype(np.float32)
    f = np.minimum(np.maximum(f, np.float32(lo - y_zp)), np.float32(hi - y_zp))
    return (np.rint(f).astype(np.int32) + y_zp).astype(np.uint8)


def conv_reference(x, w, bias, scale, pads, stride, dilation, x_zp, y_zp, lo, hi, depthwise=False):
    """x uint8 NHWC, w int8 OHWI (dense) or [KH, KW, C] (depthwise); pads (top, left, bottom, right)."""
    top, left, bottom, right = pads
    xi = x.astype(np.int64) - x_zp
    xi = np.pad(xi, ((0, 0), (top, bottom), (left, right), (0, 0)))  # padding is the value 0
    n, h, wd, _ = xi.shape
    kh, kw = (w.shape[0], w.shape[1]) if depthwise else (w.shape[1], w.shape[2])
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    channels = w.shape[2] if depthwise else w.shape[0]
    acc = np.zeros((n, oh, ow, channels), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dilation[0], kx * dilation[1]
            patch = xi[:, y0:y0 + stride[0] * (oh - 1) + 1:stride[0], x0:x0 + stride[1] * (ow - 1) + 1:stride[1], :]
            if depthwise:
                acc += patch * w[ky, kx].astype(np.int64)
            else:
                acc += patch @ w[:, ky, kx, :].astype(np.int64).T
    if bias is not None:
        acc += bias
    return _requant(acc.astype(np.int32), scale, y_zp, lo, hi)


def _case(rng, cin, cout, kh, kw, depthwise):
    wshape = (kh, kw, cin) if depthwise else (cout, kh, kw, cin)
    w = rng.integers(-128, 128, size=wshape).astype(np.int8)
    bias = rng.integers(-20000, 20000, size=cin if depthwise else cout).astype(np.int32)
    scale = (rng.uniform(0.2, 2.0, size=bias.shape) / (kh * kw * (1 if depthwise else cin)) / 64).astype(np.float32)
    return w, bias, scale


CONV_CASES = [  # cin, cout, kernel, stride, pads (top, left, bottom, right), dilation, hw
    (16, 96, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), (7, 9)),       # pointwise, direct GEMM, 16-channel blocks
    (24, 144, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), (5, 5)),      # 144 = 9 blocks: a tile of 1 block left
    (13, 37, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), (3, 7)),       # K % 4 = 1, a 5-channel tail
    (3, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (15, 16)),      # MobileNetV2's first layer (im2col, K = 27)
    (5, 7, (3, 2), (1, 2), (2, 0, 1, 1), (1, 1), (6, 9)),         # asymmetric kernel, padding and stride
    (6, 70, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), (9, 8)),        # dilation
    (8, 9, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), (9, 9)),         # strided 1x1 (gathered rows)
    (130, 200, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), (2, 3)),     # several 64-channel tiles, rows % 4 = 2
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cin, cout, kernel, stride, pads, dilation, hw", CONV_CASES)
def test_conv_matches_integer_reference(isa, cin, cout, kernel, stride, pads, dilation, hw):
    rng = np.random.default_rng(cin * 1000 + cout)
    w, bias, scale = _case(rng, cin, cout, *kernel, depthwise=False)
    x = rng.integers(0, 256, size=(2, *hw, cin)).astype(np.uint8)
    x_zp, y_zp, lo, hi = 128 + 3, 128 - 7, 30, 240
    k = _core.QConv2d(_torch(w), _torch(bias), _torch(scale), list(pads), list(stride), list(dilation),
                      x_zp, y_zp, lo, hi, isa)
    assert k.isa == isa
    got = k.run(_torch(x)).numpy()
    want = conv_reference(x, w, bias, scale, pads, stride, dilation, x_zp, y_zp, lo, hi)
    np.testing.assert_array_equal(got, want)
    # an NCHW image seen as NHWC (the graph's input transpose, a view): the same result
    strided = _torch(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).permute(0, 2, 3, 1)
    np.testing.assert_array_equal(k.run(strided).numpy(), want)
    # a narrower clamp given per call (a following clamp node fused into the convolution)
    narrow = conv_reference(x, w, bias, scale, pads, stride, dilation, x_zp, y_zp, 128, 200)
    np.testing.assert_array_equal(k.run(_torch(x), 128, 200).numpy(), narrow)
    # the bound callable the backend keeps: its own bounds, and a clamp fused by intersecting them
    fn = k.bound()
    np.testing.assert_array_equal(fn(_torch(x)).numpy(), want)
    np.testing.assert_array_equal(fn.clamped(128, 200)(_torch(x)).numpy(), narrow)
    assert (fn.clamped(0, 20).lo, fn.clamped(0, 20).hi) == (20, 20)  # disjoint: everything at the clamp's bound


DW_CASES = [  # channels, kernel, stride, pads, dilation, hw
    (96, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), (8, 8)),
    (144, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), (9, 10)),   # 144: two 64-channel runs and a 16-channel one
    (37, (3, 3), (2, 2), (0, 1, 1, 0), (1, 1), (7, 6)),     # odd channels, asymmetric padding
    (24, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), (6, 7)),
    (70, (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), (11, 11)),
    (8, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), (5, 5)),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("channels, kernel, stride, pads, dilation, hw", DW_CASES)
def test_depthwise_matches_integer_reference(isa, channels, kernel, stride, pads, dilation, hw):
    rng = np.random.default_rng(channels + 7 * kernel[0])
    w, bias, scale = _case(rng, channels, channels, *kernel, depthwise=True)
    x = rng.integers(0, 256, size=(2, *hw, channels)).astype(np.uint8)
    x_zp, y_zp, lo, hi = 128 - 20, 128 + 5, 0, 255
    k = _core.QDepthwiseConv2d(_torch(w), _torch(bias), _torch(scale), list(pads), list(stride), list(dilation),
                               x_zp, y_zp, lo, hi, isa)
    got = k.run(_torch(x)).numpy()
    want = conv_reference(x, w, bias, scale, pads, stride, dilation, x_zp, y_zp, lo, hi, depthwise=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(k.run(_torch(x), 133, 160).numpy(),
                                  conv_reference(x, w, bias, scale, pads, stride, dilation, x_zp, y_zp, 133, 160,
                                                 depthwise=True))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows, cin, cout", [(1, 1280, 1000), (3, 64, 10), (5, 33, 17)])
def test_fully_connected_matches_integer_reference(isa, rows, cin, cout):
    rng = np.random.default_rng(rows + cin + cout)
    w, bias, scale = _case(rng, cin, cout, 1, 1, depthwise=False)
    x = rng.integers(0, 256, size=(rows, cin)).astype(np.uint8)
    bias = None if rows == 1 else bias  # without a bias too
    k = _core.QConv2d(_torch(w), None if bias is None else _torch(bias), _torch(scale), [0, 0, 0, 0], [1, 1], [1, 1],
                      100, 140, 0, 255, isa)
    got = k.run_rows(_torch(x)).numpy()
    np.testing.assert_array_equal(k.bound(True)(_torch(x)).numpy(), got)
    acc = (x.astype(np.int64) - 100) @ w[:, 0, 0, :].astype(np.int64).T + (0 if bias is None else bias)
    np.testing.assert_array_equal(got, _requant(acc.astype(np.int32), scale, 140, 0, 255))


@pytest.mark.parametrize("a_ratio, b_ratio", [(0.7, 1.3), (0.02, 0.05), (3.0, 0.4), (1.0, 1.0)])
def test_add_within_one_step_and_same_in_every_form(a_ratio, b_ratio):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, size=(1, 5, 7, 37)).astype(np.uint8)  # 1295 elements: vector tails too
    b = rng.integers(0, 256, size=a.shape).astype(np.uint8)
    a_zp, b_zp, y_zp, lo, hi = 120, 140, 131, 10, 250
    exact = (a.astype(np.float64) - a_zp) * a_ratio + (b.astype(np.float64) - b_zp) * b_ratio + y_zp
    want = np.clip(np.rint(exact), lo, hi)
    results = [_core.QAdd(a_ratio, a_zp, b_ratio, b_zp, y_zp, lo, hi, isa).run(_torch(a), _torch(b)).numpy()
               for isa in ISAS]
    assert np.abs(results[0].astype(np.int64) - want).max() <= 1
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_bad_arguments_are_named():
    w = np.zeros((4, 1, 1, 8), np.int8)
    scale = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="weight must be int8"):
        _core.QConv2d(_torch(w.astype(np.int16)), None, _torch(scale), [0] * 4, [1, 1], [1, 1], 128, 128, 0, 255)
    with pytest.raises(ValueError, match="scale must be float32 \\[4\\]"):
        _core.QConv2d(_torch(w), None, _torch(scale[:3]), [0] * 4, [1, 1], [1, 1], 128, 128, 0, 255)
    k = _core.QConv2d(_torch(w), None, _torch(scale), [0] * 4, [1, 1], [1, 1], 128, 128, 0, 255)
    with pytest.raises(ValueError, match="input must be uint8"):
        k.run(_torch(np.zeros((1, 2, 2, 8), np.int8)))
    with pytest.raises(ValueError, match="8 channels"):
        k.run(_torch(np.zeros((1, 2, 2, 9), np.uint8)))
    with pytest.raises(ValueError, match="lo <= hi"):
        k.run(_torch(np.zeros((1, 2, 2, 8), np.uint8)), 200, 100)


@pytest.mark.parametrize("isa", ISAS)
def test_conversions_match_torch(isa):
    """Float -> shifted integers and back, the same float32 operations as the torch forms in `_int8`."""
    import torch
    x = torch.randn(3, 7, 11, generator=torch.Generator().manual_seed(1)) * 3
    x[0, 0, :4] = torch.tensor([0.25, 0.75, -0.25, 1e9])  # halves round to even; far values saturate
    scale, zp = 0.5, 131
    want = torch.mul(x, 1.0 / scale).round_().add_(zp).clamp_(10, 250).to(torch.uint8)
    got = _core.quantize_u8(x, 1.0 / scale, zp, 10, 250, isa)
    assert torch.equal(got, want)
    levels = _core.dequantize_u8(got.permute(2, 0, 1), 0.37, zp, isa)  # a strided view: read in its own order
    assert torch.equal(levels, got.permute(2, 0, 1).to(torch.float32).sub_(zp).mul_(0.37))


def test_isa_capped_by_environment(monkeypatch):
    """ETLAB_INT8_ISA caps the instruction set of kernels made while it is set (how a user checks a narrower
    form's results on a wide CPU); an unknown value is named."""
    widest = _core.int8_isa()
    for name, cap in (("scalar", 0), ("avx2", 1), ("vnni", 2)):
        monkeypatch.setenv("ETLAB_INT8_ISA", name)
        assert _core.int8_isa() == min(cap, widest)
        assert _core.QAdd(1.0, 128, 1.0, 128, 128, 0, 255).isa == min(cap, widest)
    monkeypatch.setenv("ETLAB_INT8_ISA", "sse")
    with pytest.raises(ValueError, match="ETLAB_INT8_ISA is 'sse'"):
        _core.int8_isa()
