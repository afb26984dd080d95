"""A contiguous copy of a value the partition computes writes no XNNCopy (XNNPACK values are written once, so
the copy is the value), as upstream: ShuffleNet's channel shuffle and CaiT's heads paid a pass over the tensor
each. A copy that is a partition output, or reads a partition input, keeps its XNNCopy."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.runtime import Runtime
from etlab.schema.xnnpack import deserialize_xnnpack, node_kind


class Shuffle(nn.Module):
    """conv -> channel shuffle (view, transpose, contiguous, view) -> relu(conv): the copy is the transpose's value."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 8, 1)
        self.b = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = self.a(x)
        y = y.view(1, 2, 4, 5, 5).transpose(1, 2).contiguous().view(1, 8, 5, 5)
        return torch.relu(self.b(y))


class CopyOut(nn.Module):
    """A copy returned next to its source, and a copy of the input: both stay XNNCopy nodes."""

    def forward(self, x):
        y = torch.tanh(x)
        return y, y.clone(), x.clone() * 2


@pytest.mark.parametrize("model, copies", [(Shuffle, 0), (CopyOut, 2)])
def test_a_copy_of_a_computed_value_writes_no_node(model, copies, tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m, inputs = model().eval(), (torch.randn(1, 4, 5, 5),)
    with torch.no_grad():
        ep = torch.export.export(m, inputs)
        want = m(*inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    modules = lowered_modules(edge.exported_program().graph_module)
    kinds = collections.Counter(node_kind(n) for _, _, mod in modules
                                for n in deserialize_xnnpack(mod.processed_bytes).graph.xnodes)
    assert kinds["XNNCopy"] == copies, kinds
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
