"""The native core's small kernels picked by operator name (`_native/small_ops.cpp`): index.Tensor gathers with
int64 index tensors, add/sub/mul with broadcasts, eq.Scalar, logical_not, any over the last dimension, where,
full_like and last-dimension softmax, the steps of Edge's decomposed resizes and attention. Every kernel but
softmax gives ATen's bits (held against the Python core, which calls ATen for each instruction); softmax is within
float tolerance (and with `native_small_products` off, ATen's own). What a kernel does not cover (non-adjacent
indices, other dtypes, a dispatch mode watching) goes to ATen, and an index out of range fails with ATen's error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from etlab.compiler import to_edge
from etlab.runtime import ExecutionError, Runtime
from etlab.runtime._native import _core, _plan
from tests.runtime._ops_seen import OpsSeen


def _methods(model: nn.Module, inputs: tuple):
    with torch.no_grad():
        program = to_edge(torch.export.export(model, inputs)).to_executorch().buffer
    return tuple(Runtime.get(core=core).load_program(program).load_method("forward") for core in ("native", "python"))


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.is_floating_point:
        return torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()) and \
            torch.equal(got.signbit(), want.signbit())
    return torch.equal(got, want)


def _calls() -> dict[str, int]:
    return dict(_core.small_kernel_calls())


def _check(model: nn.Module, *inputs, kernels: tuple[str, ...], runs: int = 2):
    """The native core's outputs are the Python core's bits on every run, and the named kernels computed calls."""
    model.eval()
    native, python = _methods(model, inputs)
    before = _calls()
    for _ in range(runs):
        got, want = native.execute(list(inputs)), python.execute(list(inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert _same_bits(g, w)
    after = _calls()
    for k in kernels:
        assert after[k] > before[k], (k, before, after)
    return got


class _Resizes(nn.Module):
    """Edge decomposes these into index.Tensor gathers, broadcast multiplies and adds."""

    def forward(self, x):
        return (F.interpolate(x, scale_factor=2.0, mode="bicubic", align_corners=False),
                F.interpolate(x, size=(9, 7), mode="nearest-exact"),
                F.interpolate(x[:, :, 0], scale_factor=2.0, mode="linear"))


def test_decomposed_resizes_are_atens_bits():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 5, 6)
    got = _check(_Resizes(), x, kernels=("index.Tensor_out", "mul.out"))
    with torch.no_grad():
        for g, w in zip(got, _Resizes()(x)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


class _Gathers(nn.Module):
    """Gathers of every layout the kernel takes: index dimensions first, in the middle, last, broadcast index
    tensors, negative indices, other dtypes (the `* 1` makes each source a planned tensor)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rows", torch.tensor([[2], [-1], [0]]))
        self.register_buffer("cols", torch.tensor([3, 0, -2, 1]))
        self.register_buffer("flat", torch.tensor([4, 0, 4, -5]))

    def forward(self, x, n):
        a, b = x * 1, n * 1
        return (a[self.rows, self.cols], a[:, self.flat], a[:, self.rows, self.cols], a[..., self.cols],
                b[self.rows, self.cols], (b > 0)[:, self.flat])


def test_gathers_are_atens_bits():
    x = torch.randn(5, 6, 7)
    n = torch.randint(-9, 9, (5, 6, 7))
    _check(_Gathers(), x, n, kernels=("index.Tensor_out",))


class _Apart(nn.Module):
    """Index tensors on dimensions that are not adjacent: ATen puts the index dimensions first (left to ATen)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("i", torch.tensor([1, 0]))

    def forward(self, x):
        return (x * 1)[self.i, :, self.i]


def test_index_tensors_apart_go_through_aten():
    x = torch.randn(3, 4, 5)
    native, _ = _methods(_Apart(), (x,))
    assert torch.equal(native.execute([x])[0], x[torch.tensor([1, 0]), :, torch.tensor([1, 0])])


class _Lookup(nn.Module):
    def forward(self, x, i):
        return (x * 1)[i]


def test_an_index_out_of_range_fails_with_atens_error_on_both_cores():
    x, i = torch.randn(4, 3), torch.tensor([0, 3, 1])
    native, python = _methods(_Lookup(), (x, i))
    assert torch.equal(native.execute([x, i])[0], x[i])
    bad = torch.tensor([0, 4, 1])
    messages = []
    for method in (native, python):
        with pytest.raises(ExecutionError) as e:
            method.execute([x, bad])
        messages.append(str(e.value.__cause__ or e.value))
    assert "out of bounds" in messages[0] and messages[0] == messages[1]
    assert torch.equal(native.execute([x, torch.tensor([-4, 2, 2])])[0], x[torch.tensor([-4, 2, 2])])


class _Broadcasts(nn.Module):
    def forward(self, x, row, col, s):
        a = x * 1
        return a * row, a * col, a + col, a - row, row - a, col * row, a * s, (a + row) * col


@pytest.mark.parametrize("shape", [(1, 3, 10, 12), (2, 7, 33)])
def test_broadcast_add_sub_mul_are_atens_bits(shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    row, col = torch.randn(shape[-1], generator=g), torch.randn(shape[-2], 1, generator=g)
    _check(_Broadcasts(), x, row, col, torch.tensor(0.75), kernels=("mul.out", "add.out", "sub.out"))


class _SafeSoftmax(nn.Module):
    """Edge's attention: softmax, and rows masked entirely set to zero (eq -inf, logical_not, any, where)."""

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(
            q, k, v, is_causal=True)


def _attention_inputs():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    mask = torch.rand(6, 6, generator=g) > 0.4
    mask[1] = False  # a fully masked row
    return q, k, v, mask


def test_attention_is_within_tolerance_and_atens_bits_with_exact_kernels(monkeypatch):
    inputs = _attention_inputs()
    model = _SafeSoftmax()
    native, python = _methods(model, inputs)
    before = _calls()
    got, want = native.execute(list(inputs)), python.execute(list(inputs))
    after = _calls()
    for name in ("_softmax.out", "eq.Scalar_out", "logical_not.out", "any.out", "where.self_out", "full_like.out"):
        assert after[name] > before[name], name
    with torch.no_grad():
        eager = model(*inputs)
    for g, w, e in zip(got, want, eager):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[0][:, :, 1], torch.zeros(2, 4, 8))  # the fully masked row
    monkeypatch.setattr(_plan, "native_small_products", False)  # softmax through ATen: every output ATen's bits
    exact, _ = _methods(model, inputs)
    for g, w in zip(exact.execute(list(inputs)), want):
        assert _same_bits(g, w)


def test_a_watching_dispatch_mode_sees_every_call():
    inputs = _attention_inputs()
    native, python = _methods(_SafeSoftmax(), inputs)
    with OpsSeen() as seen:
        got = native.execute(list(inputs))
    assert sum(n.startswith("_softmax.") for n in seen.names) == 2
    assert sum(n.startswith("where.") for n in seen.names) >= 2
    for g, w in zip(got, python.execute(list(inputs))):
        assert _same_bits(g, w)  # ATen computed every call


def test_etdump_events_and_intermediates_are_the_python_cores(monkeypatch):
    """Each instruction the small kernels compute keeps its own ETDump events and logged value: the native trace
    of a resize and an attention is the Python core's, event for event and byte for byte (exact kernels)."""
    from tests.runtime.test_cores import _events

    monkeypatch.setattr(_plan, "native_small_products", False)
    for model, inputs in ((_Resizes(), (torch.randn(1, 3, 5, 6),)), (_SafeSoftmax(), _attention_inputs())):
        with torch.no_grad():
            program = to_edge(torch.export.export(model, inputs)).to_executorch().buffer
        traced = {}
        for core in ("native", "python"):
            loaded = Runtime.get(core=core).load_program(program, enable_etdump=True, debug_buffer_size=1 << 20)
            loaded.load_method("forward").execute(list(inputs))
            traced[core] = loaded
        assert _events(traced["native"]) == _events(traced["python"])
        assert traced["native"]._tracer.debug_buffer() == traced["python"]._tracer.debug_buffer()
