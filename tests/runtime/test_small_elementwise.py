"""The native core computes add/sub/mul/div out-variants on small float tensors itself (no ATen call):
bit for bit ATen's results, in place too, and ATen's own path for everything else (larger, other
dtypes, alpha other than 1, a dispatch mode watching)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from etlab.runtime import Runtime
from tests.runtime._programs import PlanBuilder, ProgramBuilder

OPS = {"add": lambda x, y: torch.add(x, y), "sub": lambda x, y: torch.sub(x, y), "mul": torch.mul, "div": torch.div}


def _program(op: str, shape, dtype=torch.float32, alpha=1, in_place: bool = False) -> bytes:
    """forward(x, y) = op(op(x, y), y); with in_place the second call writes over its first input."""
    b = PlanBuilder()
    x, y = b.tensor(shape, dtype), b.tensor(shape, dtype)
    first = b.tensor(shape, dtype)
    second = first if in_place else b.tensor(shape, dtype)
    extra = [b.int(alpha) if isinstance(alpha, int) else b.double(alpha)] if op in ("add", "sub") else []
    b.kernel(f"aten::{op}.out", x, y, *extra, first, first)
    b.kernel(f"aten::{op}.out", first, y, *extra, second, second)
    return ProgramBuilder().serialize([b.plan([x, y], [second])])


def _expected(op, x, y, alpha=1):
    if op in ("add", "sub"):
        f = torch.add if op == "add" else torch.sub
        return f(f(x, y, alpha=alpha), y, alpha=alpha)
    return OPS[op](OPS[op](x, y), y)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("shape", [(4, 4), (16, 16), (3, 7, 5), (40, 40)])
@pytest.mark.parametrize("in_place", [False, True])
def test_small_elementwise_is_atens_result_bit_for_bit(op, shape, in_place):
    g = torch.Generator().manual_seed(hash((op, shape)) % 1000)
    x, y = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    y[0] = 0.0  # division by zero, inf and nan as ATen gives them
    x.view(-1)[0] = float("nan")
    method = Runtime.get().load_program(_program(op, shape, in_place=in_place)).load_method("forward")
    for _ in range(2):
        got = method.execute([x, y])[0]
        assert torch.equal(got.nan_to_num(), _expected(op, x, y).nan_to_num())
        assert torch.equal(got.isnan(), _expected(op, x, y).isnan())


@pytest.mark.parametrize("alpha", [2, 0.5])
def test_alpha_other_than_one_takes_atens_path(alpha):
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    method = Runtime.get().load_program(_program("add", (4, 4), alpha=alpha)).load_method("forward")
    assert torch.equal(method.execute([x, y])[0], _expected("add", x, y, alpha))


def test_integer_tensors_take_atens_path():
    x, y = torch.randint(-5, 5, (4, 4)), torch.randint(-5, 5, (4, 4))
    method = Runtime.get().load_program(_program("mul", (4, 4), dtype=torch.int64)).load_method("forward")
    assert torch.equal(method.execute([x, y])[0], x * y * y)


def test_a_dispatch_mode_sees_every_call():
    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    method = Runtime.get().load_program(_program("add", (4, 4))).load_method("forward")
    with Spy():
        got = method.execute([x, y])[0]
    assert torch.equal(got, _expected("add", x, y))
    assert seen.count("aten.add.out") == 2
