"""hardswish lowers to one XNNHardswish node: kept whole by `to_edge_transform_and_lower` (the
partitioner's ops_to_not_decompose, as upstream), and as Edge decomposes it (x * clamp(x + 3, 0, 6) / 6,
through `to_edge(...).to_backend(...)`) fused back: MobileNetV3 ran four elementwise passes per hardswish."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etlab.compiler import to_edge, to_edge_transform_and_lower
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


@pytest.mark.parametrize("kept_whole", [True, False], ids=["kept_whole", "decomposed"])
def test_hardswish_is_one_xnnpack_node_and_runs_like_eager(tmp_path, kept_whole):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = Block().eval(), (torch.randn(2, 3, 8, 8),)
    ep = torch.export.export(model, inputs)
    if kept_whole:
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    else:
        edge = to_edge(ep).to_backend([XnnpackPartitioner()])
    (module,) = [m for _, _, m in lowered_modules(edge.exported_program().graph_module)]
    kinds = [node_kind(n) for n in deserialize_xnnpack(module.processed_bytes).graph.xnodes]
    assert kinds.count("XNNHardswish") == 2 and kinds.count("XNNDiv") == 1  # hardsigmoid's /6 is still a div
    targets = [str(n.target) for n in module.original_module.graph.nodes]
    assert targets.count("aten.hardswish.default") == (2 if kept_whole else 0)
    assert sum("div" in t for t in targets) == (1 if kept_whole else 3)
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    with torch.no_grad():
        want = model(*inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
