"""Small modules whose methods share state, for the shared-mutable-buffer tests (torch only: the
interop tests load this file by path in upstream ExecuTorch's python too)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class WriteThenRead(nn.Module):
    """`write(x)` accumulates x (scaled by a weight) into a cache buffer and counts its calls;
    `read(y)` only reads both: its result depends on every write before it."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
        self.register_buffer("cache", torch.zeros(2, 3))
        self.register_buffer("steps", torch.zeros(1))

    def write(self, x: Tensor) -> Tensor:
        self.cache.add_(x * self.scale)
        self.steps.add_(1)
        return self.cache * 2

    def read(self, y: Tensor) -> Tensor:
        return self.cache * y + self.steps


def write_then_read_calls() -> tuple[dict[str, tuple], list[tuple[str, tuple]]]:
    """(example inputs per method, in the program's method order; the calls to run, in order)."""
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(2, 3, generator=gen) for _ in range(3)]
    y = torch.randn(2, 3, generator=gen)
    calls = [("write", (xs[0],)), ("read", (y,)), ("write", (xs[1],)), ("write", (xs[2],)), ("read", (y,))]
    return {"write": (xs[0],), "read": (y,)}, calls
