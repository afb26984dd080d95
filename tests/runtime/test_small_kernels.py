"""The native core's small-tensor kernels (`_native/small.cpp`): copies of views (slice/select/squeeze/
unsqueeze/view/permute/expand/split/unbind copies), one-row addmm/mm, sigmoid and tanh, and add/mul with a
broadcast that only adds unit dimensions. Copies, sigmoid, tanh and the elementwise ops give ATen's bits;
the matrix-vector product sums in another order than MKL (within float tolerance of eager). Whatever a
kernel does not cover (other dtypes, non-contiguous inputs, large tensors) goes to ATen, with eager's
result. Recurrent models (the unrolled LSTM/GRU cells these kernels are for) match eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etlab.compiler import to_edge
from etlab.runtime import Runtime


def _method(model: nn.Module, inputs: tuple):
    with torch.no_grad():
        program = to_edge(torch.export.export(model, inputs)).to_executorch().buffer
    return Runtime.get().load_program(program).load_method("forward")


def _run(model: nn.Module, *inputs):
    method = _method(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got = [method.execute(list(inputs)) for _ in range(2)][-1]  # a second run: no state left from the first
    return got, expected


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and torch.equal(
        got.view(-1).view(torch.int8 if got.element_size() == 1 else _int(got)), want.view(-1).view(_int(want)))


def _int(t: torch.Tensor) -> torch.dtype:
    return {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


class _Views(nn.Module):
    """Copies of views of an activation (the `* 1` makes each source a planned tensor, not the input)."""

    def forward(self, x):
        a = x * 1
        parts = torch.split(a, [1, 2, a.shape[-1] - 3], dim=-1)
        return (a[:, 1:6:2], a[1], a.transpose(0, 1), a.unsqueeze(1), a[0:1].squeeze(0), a.reshape(-1),
                a[:, :1].expand(a.shape[0], 5), *parts, *torch.unbind(a[:2], dim=0), a.permute(1, 0)[2:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7), (6, 33)])
def test_view_copies_are_atens_bits(dtype, shape):
    x = (torch.randn(shape) * 100).to(dtype)
    got, expected = _run(_Views(), x)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert _same_bits(g, e.contiguous())


class _ViewOfInput(nn.Module):
    def forward(self, x):
        return x[:, 1:3].squeeze(-1) * 2, x.transpose(0, 1)[1:] + 0


def test_view_copies_of_a_non_contiguous_input_take_atens_path():
    x = torch.randn(5, 4).t()  # the caller's strides differ from what the program was loaded with
    got, expected = _run(_ViewOfInput(), torch.randn(4, 5))
    method = _method(_ViewOfInput(), (torch.randn(4, 5),))
    for g, e in zip(method.execute([x]), _ViewOfInput()(x)):
        assert torch.equal(g, e)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


class _Linear1(nn.Module):
    """One-row products: addmm with a bias (the weight permute Edge folds at load: rows contiguous), mm
    without one, and a product with an activation as its (transposed) weight."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.lin = nn.Linear(k, n)
        self.nobias = nn.Linear(k, n, bias=False)

    def forward(self, x, w):
        return self.lin(x), self.nobias(x), x @ (w * 1).t(), x @ (w * 1).t().contiguous()


@pytest.mark.parametrize("k,n", [(1, 1), (5, 3), (16, 16), (37, 19), (128, 512), (130, 200)])
def test_one_row_products_are_within_tolerance_of_eager(k, n):
    torch.manual_seed(k * 1000 + n)
    model = _Linear1(k, n).eval()
    x, w = torch.randn(1, k), torch.randn(n, k)
    got, expected = _run(model, x, w)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5 * (k ** 0.5))


def test_products_with_more_rows_or_other_dtypes_take_atens_path():
    model = _Linear1(9, 7).eval()
    x, w = torch.randn(3, 9), torch.randn(7, 9)
    for g, e in zip(*_run(model, x, w)):
        torch.testing.assert_close(g, e)
    model = _Linear1(9, 7).double().eval()
    for g, e in zip(*_run(model, x.double()[:1], w.double())):
        torch.testing.assert_close(g, e)


class _Unary(nn.Module):
    def forward(self, x):
        y = x * 1
        return torch.sigmoid(y), torch.tanh(y), torch.sigmoid(y[:, 1:]), torch.tanh(y.t())


EDGES = [0.0, -0.0, 1e-8, -1e-8, 1e-40, 88.7, -88.7, 104.0, -104.0, 9.0, -9.0, 20.0, float("inf"), float("-inf"),
         float("nan")]


@pytest.mark.parametrize("n", [1, 7, 16, 31, 32, 33, 48, 128, 300, 4096, 5000])
def test_sigmoid_and_tanh_are_atens_bits(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(2, n, generator=g) * 6
    flat = x.view(-1)
    flat[: len(EDGES)] = torch.tensor(EDGES[: flat.numel()])
    got, _ = _run(_Unary(), x)
    # Edge copies a non-contiguous operand first: ATen's result on that contiguous copy (eager's on the
    # strided view itself may round differently: ATen's loop then skips its vector path)
    expected = [torch.sigmoid(x), torch.tanh(x), torch.sigmoid(x[:, 1:].contiguous()), torch.tanh(x.t().contiguous())]
    for a, b in zip(got, expected):
        assert _same_bits(a, b)


class _Broadcast(nn.Module):
    def forward(self, a, b):
        return (a * 1) + b, (a * 1) * b, b - (a * 1)


@pytest.mark.parametrize("shapes", [((1, 1, 32), (1, 32)), ((1, 512), (512,)), ((2, 1, 3), (2, 3)),
                                    ((4, 1), (1, 4))])
def test_broadcast_of_unit_dimensions_is_atens_bits(shapes):
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    got, expected = _run(_Broadcast(), a, b)
    for g, e in zip(got, expected):
        assert _same_bits(g, e)


class _Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(12, 40, num_layers=2, batch_first=True)
        self.gru = nn.GRU(40, 24, batch_first=True)

    def forward(self, x):
        y, _ = self.lstm(x)
        z, h = self.gru(y)
        return z, h


def test_unrolled_recurrent_cells_match_eager_and_share_folded_weights():
    torch.manual_seed(0)
    model = _Lstm().eval()
    x = torch.randn(1, 9, 12)
    method = _method(model, (x,))
    with torch.no_grad():
        expected = model(x)
    for _ in range(2):
        for g, e in zip(method.execute([x]), expected):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    # one permuted copy per recurrent weight, not one per time step
    folded = method._table.folded
    permutes = [key for key in folded if key[0] == "aten::permute_copy.out"]
    assert 0 < len(permutes) <= 6  # the LSTM's 2 x (input, recurrent) and the GRU's 2 weights
    assert len({t.data_ptr() for t in folded.values()}) == len(folded)
