"""The native core computes mul.Scalar_out (a float tensor times a number: attention scales its queries and keys
so) on small tensors itself: bit for bit ATen's result, in place too, for float and integer numbers, and ATen's
own path where it does not apply (other dtypes, more than 4096 elements, a dispatch mode watching)."""

from __future__ import annotations

import pytest
import torch

from etlab.runtime import Runtime
from tests.runtime._ops_seen import OpsSeen
from tests.runtime._programs import PlanBuilder, ProgramBuilder


def _program(shape, factor, dtype=torch.float32, in_place: bool = False) -> bytes:
    """forward(x) = (x * factor) * factor; with in_place the second product overwrites the first."""
    b = PlanBuilder()
    x = b.tensor(shape, dtype)
    first = b.tensor(shape, dtype)
    second = first if in_place else b.tensor(shape, dtype)
    number = b.int(factor) if isinstance(factor, int) else b.double(factor)
    b.kernel("aten::mul.Scalar_out", x, number, first, first)
    b.kernel("aten::mul.Scalar_out", first, number, second, second)
    return ProgramBuilder().serialize([b.plan([x], [second])])


@pytest.mark.parametrize("factor", [0.35355339059327373, -3.0, 1e-40, 1e300, 7])
@pytest.mark.parametrize("shape", [(2, 4, 6, 8), (5000,)])
@pytest.mark.parametrize("in_place", [False, True])
def test_mul_scalar_is_atens_result_bit_for_bit(factor, shape, in_place):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    x.view(-1)[0], x.view(-1)[1] = float("nan"), float("inf")
    method = Runtime.get().load_program(_program(shape, factor, in_place=in_place)).load_method("forward")
    want = torch.mul(torch.mul(x, factor), factor)
    for _ in range(2):
        got = method.execute([x])[0]
        assert torch.equal(got.nan_to_num(), want.nan_to_num()) and torch.equal(got.isnan(), want.isnan())


def test_other_dtypes_and_a_watching_mode_go_through_aten():
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    method = Runtime.get().load_program(_program((3, 4), 0.1, torch.float64)).load_method("forward")
    assert torch.equal(method.execute([x])[0], x * 0.1 * 0.1)
    y = torch.randn(3, 4)
    method = Runtime.get().load_program(_program((3, 4), 0.1)).load_method("forward")
    with OpsSeen() as seen:
        got = method.execute([y])[0]
    assert sum(n.startswith("mul.") for n in seen.names) == 2  # the mode sees both products: ATen computed them
    assert torch.equal(got, y * 0.1 * 0.1)
