"""Layout copies of constant data (the permute_copy Edge puts before every addmm of a linear layer) are
computed once at load into memory of their own (`_direct_kernels`): no run copies a weight again, the
results are eager's on every run, and memory the planner shares with the folded value stays intact."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from etlab.compiler import to_edge
from etlab.runtime import Runtime


class _CountPermutes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.startswith("permute_copy"):
            self.shapes.append(tuple(args[0].shape))
        return func(*args, **(kwargs or {}))


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.c(torch.relu(self.b(h)) + h).transpose(0, 1)  # the last permute is of an activation


def test_weight_permutes_are_folded_at_load_and_results_stay_eagers():
    torch.manual_seed(0)
    model = _Mlp().eval()
    x = torch.randn(3, 8)
    program = to_edge(torch.export.export(model, (x,))).to_executorch().buffer
    method = Runtime.get().load_program(program).load_method("forward")
    with _CountPermutes() as seen:
        first = method.execute([x])[0]
    assert seen.shapes == [(3, 4)]  # only the activation's transpose runs; no weight is copied
    with torch.no_grad():
        torch.testing.assert_close(first, model(x), rtol=1e-6, atol=1e-6)
        for _ in range(3):  # other inputs, the planned memory reused: the folded weights stay what they were
            y = torch.randn(3, 8)
            torch.testing.assert_close(method.execute([y])[0], model(y), rtol=1e-6, atol=1e-6)
