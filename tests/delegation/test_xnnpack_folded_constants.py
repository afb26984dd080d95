"""Constant-only ops XNNPACK cannot run join a partition (evaluated when the delegate is built) only as a
whole chain down to the weights: qwen2's rotary embedding computes cos/sin from int64 positions that a
portable node reads too; the chain's root stays portable, so none of it may be folded into the delegate
(it failed as 'the result of unsqueeze is int64')."""

from __future__ import annotations

import torch
from torch import nn

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.runtime import Runtime


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.rand(4))
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        positions = torch.arange(3) + 1  # int64 constants, read by the float chain and by a portable multiply
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return self.fc(x) * emb.cos(), positions * 2


def test_a_constant_chain_rooted_in_a_portable_node_stays_out(tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = Rotary().eval(), (torch.randn(3, 8),)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    delegated = {str(n.target) for _, _, m in lowered_modules(edge.exported_program().graph_module)
                 for n in m.original_module.graph.nodes if n.op == "call_function"}
    assert "aten.linear.default" in delegated and "aten.cos.default" not in delegated
    assert "aten.unsqueeze_copy.default" not in delegated
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    with torch.no_grad():
        want = model(*inputs)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1])


class ClassToken(nn.Module):
    """CaiT's class token: one expand of a parameter, read by a partition before a portable op and by one after."""

    def __init__(self):
        super().__init__()
        self.token = nn.Parameter(torch.randn(1, 1, 4))

    def forward(self, x):
        token = self.token.expand(x.shape[0], -1, -1)
        a = torch.cat([token, x], dim=1) * 2
        b = torch.cumsum(a, dim=1)  # no XNNPACK lowering: splits the delegated ops in two partitions
        return torch.cat([token, b], dim=1) + 1


def test_a_folded_constant_read_by_two_partitions_is_an_output_of_one(tmp_path):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = ClassToken().eval(), (torch.randn(1, 3, 4),)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    modules = lowered_modules(edge.exported_program().graph_module)
    delegated = [str(n.target) for _, _, m in modules for n in m.original_module.graph.nodes if n.op == "call_function"]
    assert len(modules) == 2 and delegated.count("aten.expand_copy.default") == 1  # (it failed: 'no lowering')
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    with torch.no_grad():
        torch.testing.assert_close(got[0], model(*inputs), rtol=1e-5, atol=1e-5)
