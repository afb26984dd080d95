"""out= calls (`torch.mul(a, x, out=z)`: `aten.mul.out` in torch.export's graph) become functional
ops in the Edge graph, as in-place ops do: rewritten node by node where the functional overload
takes the same arguments, through torch's functionalization otherwise (a casting out=, several out
arguments). The compiled program computes what eager does."""

from __future__ import annotations

import pytest
import torch
from torch.export import export

from etlab.compiler import to_edge
from etlab.runtime import Runtime


class _Chain(torch.nn.Module):
    def forward(self, x, y):
        z = torch.empty_like(x)
        torch.mul(x, y, out=z)
        torch.add(z, y, alpha=2, out=z)
        return z.relu()


class _Casting(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(2, 2, dtype=torch.float32)
        torch.add(x, x, out=out)  # int32 inputs written into a float32 out: out= casts
        return out


class _TwoOuts(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.empty(3), torch.empty(3, dtype=torch.long)
        torch.max(x, 0, out=(values, indices))
        return values * 2, indices


class _IntoInput(torch.nn.Module):
    def forward(self, x, y):
        torch.mul(x, y, out=x)
        return x + 1


def _compile_and_run(module, inputs):
    ep = export(module, tuple(t.clone() for t in inputs))
    et = to_edge(ep).to_executorch()
    got = Runtime.get().load_program(et.buffer).load_method("forward").execute([t.clone() for t in inputs])
    want = module(*[t.clone() for t in inputs])
    return et, got, want if isinstance(want, tuple) else (want,)


def test_out_calls_become_functional_ops_keeping_their_debug_handle_and_source():
    ep = export(_Chain(), (torch.randn(2, 3), torch.randn(2, 3)))
    assert {torch.ops.aten.mul.out, torch.ops.aten.add.out} <= {n.target for n in ep.graph.nodes}
    edge = to_edge(ep).exported_program()
    calls = [n for n in edge.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor,
                                         torch.ops.aten.relu.default]
    assert calls[1].kwargs == {"alpha": 2} and calls[1].args[0] is calls[0]
    assert len({n.meta["debug_handle"] for n in calls}) == 3
    assert all("out=" in n.meta["stack_trace"] for n in calls[:2])


@pytest.mark.parametrize("module, inputs", [
    (_Chain(), (torch.randn(2, 3), torch.randn(2, 3))),
    (_Casting(), (torch.arange(4, dtype=torch.int32).reshape(2, 2),)),
    (_TwoOuts(), (torch.randn(4, 3),)),
    (_IntoInput(), (torch.randn(2, 2), torch.randn(2, 2))),
], ids=["chain", "casting", "two-outs", "into-input"])
def test_programs_with_out_calls_compute_what_eager_does(module, inputs):
    _, got, want = _compile_and_run(module, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)
