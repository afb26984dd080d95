"""torch.autocast regions (timm's EfficientViT keeps its linear attention in float32 with
`torch.autocast(..., enabled=False)`): a disabled region is inlined and computes what eager does; an
enabled one is refused with a CompileError naming autocast (it used to fail on a constant inside the
region with "a control-flow branch is not called by any torch.cond")."""

from __future__ import annotations

import pytest
import torch
from torch.export import export

from etlab.compiler import CompileError, to_edge
from etlab.runtime import Runtime


class _Disabled(torch.nn.Module):
    def forward(self, q, k):
        x = q.relu()
        with torch.autocast(device_type="cpu", enabled=False):
            kv = k.float().transpose(-1, -2) @ x.float()
            out = (x @ kv) / (kv.sum() + 1e-5)
        return out * 2


class _Enabled(torch.nn.Module):
    def forward(self, x):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            return x @ x


def test_disabled_autocast_region_is_inlined_and_matches_eager():
    q, k = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    ep = export(_Disabled(), (q, k))
    assert any(n.target is torch.ops.higher_order.wrap_with_autocast for n in ep.graph.nodes)
    edge = to_edge(ep).exported_program()
    assert not any(n.op == "get_attr" or "autocast" in str(n.target) for n in edge.graph.nodes)
    assert all(n.meta.get("debug_handle") for n in edge.graph.nodes if n.op == "call_function")
    method = Runtime.get().load_program(to_edge(ep).to_executorch().buffer).load_method("forward")
    torch.testing.assert_close(method.execute([q, k])[0], _Disabled()(q, k), rtol=1e-5, atol=1e-6)


def test_enabled_autocast_region_is_refused_by_name():
    x = torch.randn(3, 3)
    ep = export(_Enabled(), (x,))
    if not any(n.target is torch.ops.higher_order.wrap_with_autocast for n in ep.graph.nodes):
        pytest.skip("this torch.export applies CPU autocast itself (no region left in the graph)")
    with pytest.raises(CompileError, match="autocast"):
        to_edge(ep)
