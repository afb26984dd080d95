"""Helpers for delegation tests: edge-like programs and a fake delegate event context."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from etlab.compiler import to_backend
from etlab.compiler.backends import DemoPartitioner
from etlab.models import make_mlp


def edge_like(module: torch.nn.Module, inputs: tuple) -> torch.export.ExportedProgram:
    """Core-ATen program with a unique debug handle per operator node, like `to_edge` produces."""
    ep = torch.export.export(module, inputs).run_decompositions()
    handle = 0
    for node in ep.graph.nodes:
        if node.op not in ("placeholder", "output"):
            handle += 1
            node.meta["debug_handle"] = handle
    return ep


class AddMul(torch.nn.Module):
    """Two delegable islands separated by an unsupported op, plus a scalar add the backend refuses."""

    def forward(self, x, y):
        a = (x + y) * x
        b = torch.relu(a)
        return (b * y + b) + 1.0


@dataclass
class RecordingContext:
    """Stands in for the runtime's delegate event context."""

    events: list = field(default_factory=list)
    outputs: list = field(default_factory=list)

    def start_profiling_delegate(self, name=None, delegate_debug_id=-1):
        self.events.append(["start", name, delegate_debug_id, None])
        return len(self.events) - 1

    def end_profiling_delegate(self, token, metadata=b""):
        self.events[token][0] = "done"
        self.events[token][3] = metadata

    def log_output_delegate(self, name, delegate_debug_id, value):
        self.outputs.append((name, delegate_debug_id, value.clone()))


@pytest.fixture(scope="module")
def mlp():
    module, inputs = make_mlp()
    return module, inputs, edge_like(module, inputs)


@pytest.fixture(scope="module")
def add_mul():
    gen = torch.Generator().manual_seed(0)
    module, inputs = AddMul(), (torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen))
    return module, inputs, edge_like(module, inputs)


@pytest.fixture(scope="module")
def mlp_lowered(mlp):
    return to_backend(mlp[2], DemoPartitioner())


@pytest.fixture(scope="module")
def add_mul_lowered(add_mul):
    return to_backend(add_mul[2], DemoPartitioner())
