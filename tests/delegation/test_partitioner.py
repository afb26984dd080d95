"""DemoPartitioner tags the nodes DemoBackend can run, grouped into convex partitions."""

from __future__ import annotations

import torch

from etlab.compiler import CompileSpec, DelegationSpec
from etlab.compiler._delegation_lowering import program_with_shared_state
from etlab.compiler.backends import DemoPartitioner

from .conftest import edge_like

aten = torch.ops.aten


def _tags(ep) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for node in ep.graph.nodes:
        if "delegation_tag" in node.meta:
            groups.setdefault(node.meta["delegation_tag"], []).append(node.name)
    return groups


def test_mlp_linear_layers_become_one_partition_each(mlp):
    _, _, ep = mlp
    result = DemoPartitioner().partition(program_with_shared_state(ep))
    groups = _tags(result.tagged_exported_program)
    linear_nodes = [
        sorted([n.name, n.args[2].name]) for n in ep.graph.nodes if n.target == aten.addmm.default
    ]
    assert sorted(sorted(g) for g in groups.values()) == sorted(linear_nodes)
    assert len(groups) == 3
    assert set(result.partition_tags) == set(groups)
    assert all(spec == DelegationSpec("DemoBackend", []) for spec in result.partition_tags.values())


def test_add_mul_islands_and_refusals(add_mul):
    _, _, ep = add_mul
    tagged = DemoPartitioner().partition(program_with_shared_state(ep)).tagged_exported_program
    groups = sorted(sorted(g) for g in _tags(tagged).values())
    # relu and the add of a Python scalar are not DemoBackend ops
    assert groups == [["add", "mul"], ["add_1", "mul_1"]]


def test_non_float32_is_left_alone():
    class IntAdd(torch.nn.Module):
        def forward(self, x, y):
            return x + y, (x.float() * 2.5) * x.float()

    ep = edge_like(IntAdd(), (torch.arange(6).reshape(2, 3), torch.ones(2, 3, dtype=torch.int64)))
    tagged = DemoPartitioner().partition(program_with_shared_state(ep)).tagged_exported_program
    for node in tagged.graph.nodes:
        if "delegation_tag" in node.meta:
            assert node.meta["val"].dtype == torch.float32
    int_add = next(n for n in tagged.graph.nodes if n.target == aten.add.Tensor)
    assert "delegation_tag" not in int_add.meta


def test_partitioner_passes_compile_specs(add_mul):
    specs = [CompileSpec("identifiers", b"names")]
    result = DemoPartitioner(specs).partition(program_with_shared_state(add_mul[2]))
    assert {spec.compile_specs[0] for spec in result.partition_tags.values()} == {specs[0]}


def test_partitioning_leaves_the_offered_program_graph_intact(add_mul):
    _, _, ep = add_mul
    DemoPartitioner().partition(program_with_shared_state(ep))
    assert not any("delegation_tag" in n.meta for n in ep.graph.nodes)
