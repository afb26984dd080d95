"""The layout of a layout-agnostic node (concatenation, elementwise binary op) counts its consumers: the
cheaper choice in transposed elements. Two shapes of the corpus paid a transpose too many:
CSPResNet's concatenation of a bypass input (NCHW) with a convolution branch (NHWC) feeding a
convolution, and PoolFormer's residual add of the block input and an NHWC branch that the partition
returns."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.compiler.backends.xnnpack._layout import FOLLOWS_LAYOUT, READS_NHWC
from etlab.compiler.backends.xnnpack._ops import HANDLERS
from etlab.facts.lowered import lowered_modules
from etlab.runtime import Runtime
from etlab.schema.xnnpack import deserialize_xnnpack, node_kind


class CatThenConv(nn.Module):
    """cat([bypass, conv(branch)]) -> conv: the concatenation runs in NHWC (the bypass transposed once)."""

    def __init__(self):
        super().__init__()
        self.branch = nn.Conv2d(4, 4, 1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, bypass, branch):
        return self.after(torch.cat([bypass, self.branch(branch)], 1))


class CatNormConv(nn.Module):
    """DenseNet's layer: cat([bypass, conv(branch)]) -> batch norm -> relu -> conv: the norm follows the
    concatenation's layout and the convolution after it reads NHWC, so NHWC it is."""

    def __init__(self):
        super().__init__()
        self.branch = nn.Conv2d(4, 4, 1)
        self.bn = nn.BatchNorm2d(8)
        self.after = nn.Conv2d(8, 4, 1)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, bypass, branch):
        return self.after(torch.relu(self.bn(torch.cat([bypass, self.branch(branch)], 1))))


class CatThenReshape(nn.Module):
    """ShuffleNet's channel shuffle: cat([bypass, conv(branch)]) -> view: NCHW stays the cheaper layout."""

    def __init__(self):
        super().__init__()
        self.branch = nn.Conv2d(4, 4, 1)

    def forward(self, bypass, branch):
        y = torch.cat([bypass, self.branch(branch)], 1)
        return y.view(1, 2, 4, 6, 6).transpose(1, 2).reshape(1, 8, 6, 6)


class ResidualOut(nn.Module):
    """x + conv(y), returned: the add runs in NCHW (the branch transposed back once)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x, y):
        return x + self.conv(y)


def _lower(model: nn.Module, inputs: tuple, tmp_path) -> tuple[collections.Counter, list]:
    with torch.no_grad():
        ep = torch.export.export(model.eval(), inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    modules = lowered_modules(edge.exported_program().graph_module)
    assert len(modules) == 1
    graph = deserialize_xnnpack(modules[0][2].processed_bytes).graph
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    return collections.Counter(node_kind(n) for n in graph.xnodes), got


@pytest.mark.parametrize("model, transposes", [(CatThenConv, 3), (CatNormConv, 3), (CatThenReshape, 3),
                                                    (ResidualOut, 2)])
def test_agnostic_nodes_take_the_layout_with_the_fewest_transposed_elements(model, transposes, tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = model()
        inputs = (torch.randn(1, 4, 6, 6), torch.randn(1, 4, 6, 6))
    kinds, got = _lower(m, inputs, tmp_path)
    # before: CatThenConv and CatNormConv 4 (branch out to NCHW, the concatenation back to NHWC), ResidualOut 3
    assert kinds["XNNStaticTranspose"] == transposes, kinds
    with torch.no_grad():
        torch.testing.assert_close(got[0], m(*inputs), rtol=1e-5, atol=1e-5)


def test_the_layout_tables_name_lowered_operators():
    assert READS_NHWC <= set(HANDLERS) and FOLLOWS_LAYOUT <= set(HANDLERS)
    assert not READS_NHWC & FOLLOWS_LAYOUT
