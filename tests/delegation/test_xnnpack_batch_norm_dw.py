"""A batch norm no convolution absorbs, over an NHWC (N, C, H, W) value, is one 1x1 depthwise convolution with
the activation after it fused as its clamp, as upstream writes it (DenseNet's pre-activation norm + relu after a
concatenation of convolutions: 62 of them in tv_densenet121, each a multiply, an add and a clamp before, three
passes over the tensor where upstream's program makes one)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.runtime import Runtime
from etlab.schema.xnnpack import deserialize_xnnpack, node_kind


class DenseLayer(nn.Module):
    """cat(conv, conv) -> BatchNorm2d -> relu -> conv, then a batch norm with no activation after it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 2, 1)
        self.norm, self.tail = nn.BatchNorm2d(6), nn.BatchNorm2d(5)
        self.conv = nn.Conv2d(6, 5, 1)
        with torch.no_grad():
            for bn in (self.norm, self.tail):
                bn.running_mean.normal_()
                bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 2)
                bn.bias.normal_()

    def forward(self, x):
        y = F.relu(self.norm(torch.cat([self.a(x), self.b(x)], 1)))
        return self.tail(torch.cat([self.conv(y), self.conv(y)], 1)[:, :5])


def test_a_batch_norm_after_a_concatenation_is_one_depthwise_convolution_with_its_relu():
    torch.manual_seed(0)
    model, inputs = DenseLayer().eval(), (torch.randn(2, 3, 8, 8),)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    ((_, _, module),) = lowered_modules(edge.exported_program().graph_module)
    xnodes = list(deserialize_xnnpack(module.processed_bytes).graph.xnodes)
    kinds = [node_kind(n) for n in xnodes]
    assert "XNNMultiply" not in kinds and "XNNClamp" not in kinds, kinds
    dw = [n for n in xnodes if node_kind(n) == "XNNDepthwiseConv2d"]
    assert sorted(n.xnode_union.groups for n in dw) == [5, 6]
    assert all((n.xnode_union.kernel_height, n.xnode_union.kernel_width) == (1, 1) for n in dw)
    relu_fused = {n.xnode_union.groups: n.output_min_max for n in dw}
    assert relu_fused[6].output_min == 0.0 and relu_fused[6].output_max == float("inf")
    assert relu_fused[5] is None
    got = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward").execute(list(inputs))
    torch.testing.assert_close(got[0], model(*inputs), rtol=1e-5, atol=1e-5)
