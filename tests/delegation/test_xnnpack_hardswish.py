"""hardswish, which Edge decomposes into x * clamp(x + 3, 0, 6) / 6, lowers to one XNNHardswish node (as
upstream, which keeps hardswish whole): MobileNetV3 ran four elementwise passes per hardswish before."""

from __future__ import annotations

import torch
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.runtime import Runtime
from etlab.schema.xnnpack import deserialize_xnnpack, node_kind


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = nn.functional.hardswish(self.bn(self.conv(x)))
        return y + 3.0 * nn.functional.hardsigmoid(y), nn.functional.hardswish(x)  # hardsigmoid stays elementwise


def test_decomposed_hardswish_is_one_xnnpack_node_and_runs_like_eager(tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = Block().eval(), (torch.randn(2, 3, 8, 8),)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    (module,) = [m for _, _, m in lowered_modules(edge.exported_program().graph_module)]
    kinds = [node_kind(n) for n in deserialize_xnnpack(module.processed_bytes).graph.xnodes]
    assert kinds.count("XNNHardswish") == 2 and "XNNDiv" in kinds  # hardsigmoid's /6 is still a div
    edge_divs = [n for n in module.original_module.graph.nodes if "div" in str(n.target)]
    assert len(edge_divs) == 3 and kinds.count("XNNDiv") == 1
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    with torch.no_grad():
        want = model(*inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
