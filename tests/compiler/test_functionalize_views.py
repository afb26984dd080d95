"""Writes through slices and selects (`mask[a:b, c:d] = k`, as torchvision's Swin-T builds its
shifted-window mask; `cache[1:3] = x` on a buffer) are rewritten node by node into scatters, without
torch's whole-program re-trace (which took most of Swin-T's compile); a view read again after the write
still goes through the re-trace. Every program computes what eager does."""

from __future__ import annotations

import pytest
import torch
from torch.export import ExportedProgram, export

from etlab.compiler import to_edge
from etlab.runtime import Runtime


class _Mask(torch.nn.Module):
    def forward(self, x):
        m = x.new_zeros((6, 6))
        count = 0
        for h in ((0, -2), (-2, -1), (-1, None)):
            for w in ((0, -2), (-2, -1), (-1, None)):
                m[h[0]:h[1], w[0]:w[1]] = count
                count += 1
        return x + m


class _Buffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))

    def forward(self, x):
        self.cache[1:3] = x
        self.cache[0].add_(1)
        return self.cache * 2


class _ReadsTheWrittenView(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        v = y[1]
        v.add_(2)
        return v * 1, y


class _FullSliceAdd(torch.nn.Module):
    """timm's GhostNet: `out[:, :channels] += shortcut` where the slice is all of out (an aten.alias)."""

    def forward(self, a, b):
        out = torch.cat([a, b], 1)
        out[:, :6] += a.repeat(1, 2)
        return out.relu()


class _StaleAlias(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        v = y[0:2]
        w = v[0]  # a view taken before the write and read after it
        v.mul_(3)
        return w + 1, y


def _run(et, inputs, calls: int = 1):
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    out = None
    for _ in range(calls):
        out = method.execute([t.clone() for t in inputs])
    return out


def _no_retrace(monkeypatch):
    def refuse(self, *a, **k):
        raise AssertionError("the program was re-traced")
    monkeypatch.setattr(ExportedProgram, "run_decompositions", refuse)


@pytest.mark.parametrize("module, inputs", [
    (_Mask, (torch.randn(6, 6),)),
    (_ReadsTheWrittenView, (torch.randn(4, 3),)),
    (_FullSliceAdd, (torch.randn(2, 3), torch.randn(2, 3))),
], ids=["mask", "reads-written-view", "full-slice-add"])
def test_writes_through_slices_and_selects_become_scatters(module, inputs, monkeypatch):
    ep = export(module(), inputs)
    _no_retrace(monkeypatch)
    edge = to_edge(ep)
    targets = {str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"}
    assert module is _FullSliceAdd or any("scatter" in t for t in targets), targets
    assert not any(t.endswith("_") or "fill_." in t for t in targets), targets
    want = module()(*inputs)
    for got, w in zip(_run(edge.to_executorch(), inputs), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(got, w)


def test_buffer_written_through_views_is_state_across_calls(monkeypatch):
    x = torch.randn(2, 3)
    ep = export(_Buffer(), (x,))
    _no_retrace(monkeypatch)
    edge = to_edge(ep)
    kinds = [s.kind.name for s in edge.exported_program().graph_signature.output_specs]
    assert kinds == ["BUFFER_MUTATION", "USER_OUTPUT"]
    eager = _Buffer()
    eager(x.clone())
    assert torch.equal(_run(edge.to_executorch(), (x,), calls=2)[0], eager(x.clone()))


def test_a_stale_alias_still_goes_through_the_retrace():
    x = torch.randn(4, 3)
    ep = export(_StaleAlias(), (x,))
    got = _run(to_edge(ep).to_executorch(), (x,))
    for g, w in zip(got, _StaleAlias()(x.clone())):
        assert torch.equal(g, w)


class _InplaceDropoutOnView(torch.nn.Module):
    """torchvision's EfficientNet head: flatten, then Dropout(inplace=True) in eval mode."""

    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.2, inplace=True)
        self.fc = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.fc(self.drop(torch.flatten(x, 1)))


def test_inplace_dropout_in_eval_is_dropped_without_retrace(monkeypatch):
    x = torch.randn(2, 3, 4)
    model = _InplaceDropoutOnView().eval()
    ep = export(model, (x,))
    assert torch.ops.aten.dropout_.default in {n.target for n in ep.graph.nodes}
    _no_retrace(monkeypatch)
    et = to_edge(ep).to_executorch()
    torch.testing.assert_close(_run(et, (x,))[0], model(x).detach(), rtol=1e-5, atol=1e-6)
