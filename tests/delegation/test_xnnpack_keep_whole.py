"""`XnnpackPartitioner.ops_to_not_decompose` through `to_edge_transform_and_lower`, as upstream's: linear,
max_pool2d, upsample_bilinear2d and hardswish stay whole in the Edge graph where the partitioner would
delegate the node, and decompose as usual where it would not; a node kept whole and then left portable
is a CompileError naming it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etlab.compiler import CompileError, to_edge, to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.runtime import Runtime

aten = torch.ops.aten


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        y = nn.functional.max_pool2d(self.conv(x), 2)  # kept: stride == kernel
        far = nn.functional.max_pool2d(x, 1, stride=2)  # stride > kernel: XNNPACK refuses, so decomposed
        y = nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        y = nn.functional.hardswish(nn.functional.avg_pool2d(y, 2))
        return self.fc(y.flatten(1)), far


def _inputs():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Net().eval(), (torch.randn(2, 3, 8, 8),)


def _targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _delegated(edge) -> list[str]:
    return [t for _, _, m in lowered_modules(edge.exported_program().graph_module) for t in _targets(m.original_module)]


def test_supported_nodes_stay_whole_and_refused_ones_decompose(tmp_path):
    model, inputs = _inputs()
    ep = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    delegated = _delegated(edge)
    for op in ("aten.linear.default", "aten.max_pool2d.default", "aten.hardswish.default",
               "aten.upsample_bilinear2d.vec"):
        assert delegated.count(op) == 1, (op, delegated)
    assert "aten.addmm.default" not in delegated and "aten.permute_copy.default" not in delegated
    portable = _targets(edge.exported_program().graph_module)
    assert "aten.max_pool2d_with_indices.default" in portable  # the stride-2 window-1 pooling, decomposed
    assert "aten.max_pool2d.default" not in portable
    # to_edge alone decomposes them all, so the lowered graph holds the decomposed forms
    plain = _delegated(to_edge(ep).to_backend([XnnpackPartitioner()]))
    assert "aten.linear.default" not in plain and "aten.addmm.default" in plain
    assert len(delegated) < len(plain)
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    got = Runtime.get().load_program(tmp_path / "m.pte").load_method("forward").execute(list(inputs))
    with torch.no_grad():
        want = model(*inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_a_node_the_partitioner_excludes_is_decomposed_not_kept():
    model, inputs = _inputs()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                       partitioner=[XnnpackPartitioner(exclude_modules=["fc"])])
    portable = _targets(edge.exported_program().graph_module)
    assert "aten.linear.default" not in portable and "aten.addmm.default" in portable
    assert "aten.linear.default" not in _delegated(edge)
    # excluding the op alone: linear decomposes, and XNNPACK takes the addmm it becomes (as upstream)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                       partitioner=[XnnpackPartitioner(exclude_ops=[aten.linear.default])])
    assert "aten.addmm.default" in _delegated(edge) and "aten.linear.default" not in _delegated(edge)


class _KeepsButRefuses(XnnpackPartitioner):
    """Asks for linear to stay whole, then delegates nothing: a partitioner bug the compiler names."""

    def partition(self, exported_program):
        result = super().partition(exported_program)
        for node in exported_program.graph_module.graph.nodes:
            node.meta.pop("delegation_tag", None)
        result.partition_tags.clear()
        return result


def test_a_node_kept_whole_but_not_delegated_is_a_compile_error():
    model, inputs = _inputs()
    named = r"aten\.max_pool2d\.default: .*kept whole for a partitioner.*not delegated.*test_xnnpack_keep_whole\.py:\d+"
    with pytest.raises(CompileError, match=named):
        to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[_KeepsButRefuses()])


def test_ops_to_not_decompose_names_upstreams_ops_with_a_node_filter():
    model, inputs = _inputs()
    ep = torch.export.export(model, inputs)
    ops, keep = XnnpackPartitioner().ops_to_not_decompose(ep)
    assert set(ops) == {aten.linear.default, aten.max_pool2d.default, aten.upsample_bilinear2d.vec,
                        aten.hardswish.default}
    pools = [n for n in ep.graph.nodes if n.target == aten.max_pool2d.default]
    assert [keep(n) for n in pools] == [True, False]
    assert not any(keep(n) for n in ep.graph.nodes if n.op != "call_function")
