"""to_edge: core-ATen edge graphs that still compute what the model computes, with debug metadata."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.export.graph_signature import OutputKind

from etlab.compiler import EdgeCompileConfig, to_edge
from etlab.compiler._decompose import is_edge_op
from etlab.facts.fx import all_graph_modules
from etlab.models import METHOD_INPUTS


def _edge_programs(programs):
    edge = to_edge(programs)
    return edge, {m: edge.exported_program(m) for m in sorted(edge.methods)}


def _call_nodes(ep):
    return [n for gm in all_graph_modules(ep.graph_module) for n in gm.graph.nodes if n.op == "call_function"]


def test_edge_graph_holds_only_edge_ops_with_debug_metadata(zoo_program):
    name, _, _, programs = zoo_program
    _, methods = _edge_programs(programs)
    config = EdgeCompileConfig()
    for ep in methods.values():
        nodes = _call_nodes(ep)
        assert nodes
        for node in nodes:
            if node.target is operator.getitem or isinstance(node.target, torch._ops.HigherOrderOperator):
                continue
            assert is_edge_op(node.target, config), f"{name}: {node.target} is not an edge op"
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(node.target.name(), "CompositeImplicitAutograd") \
                or torch.Tag.core in node.target.tags or node.target.namespace != "aten"
            assert isinstance(node.meta.get("debug_handle"), int) and node.meta["debug_handle"] >= 1
            assert "val" in node.meta
            assert node.meta.get("stack_trace"), f"{name}: {node} lost its stack trace"
            assert node.meta.get("nn_module_stack") is not None
        # Views are materialized copies in the edge dialect.
        assert not any(node.target in (torch.ops.aten.view.default, torch.ops.aten.permute.default) for node in nodes)


def test_edge_program_computes_like_eager(zoo_program):
    name, module, inputs, programs = zoo_program
    _, methods = _edge_programs(programs)
    if isinstance(programs, dict):
        cases = {m: (METHOD_INPUTS["make_two_methods"][m], getattr(module, m)) for m in methods}
    else:
        cases = {"forward": (inputs, module)}
    for method, (args, fn) in cases.items():
        with torch.no_grad():
            expected = fn(*args)
        if name == "kv_cache_decoder":  # mutates its buffers: compare from the same initial state
            module_state = {k: v.clone() for k, v in module.state_dict().items()}
            got = methods[method].module()(*args)
            module.load_state_dict(module_state)
        else:
            got = methods[method].module()(*args)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_to_edge_leaves_the_exported_program_untouched(export_zoo):
    _, _, ep = export_zoo("transformer")
    before = [(n.name, n.target) for n in ep.graph.nodes]
    to_edge(ep)
    assert [(n.name, n.target) for n in ep.graph.nodes] == before


def test_decomposed_nodes_share_their_source_nodes_debug_handle(export_zoo):
    _, _, ep = export_zoo("mlp")
    edge = to_edge(ep).exported_program()
    by_handle = {}
    for node in _call_nodes(edge):
        by_handle.setdefault(node.meta["debug_handle"], []).append(node.target)
    # Each linear became permute_copy + addmm under one handle; the relus keep their own.
    linear_groups = [t for t in by_handle.values() if torch.ops.aten.addmm.default in t]
    assert len(linear_groups) == 3
    assert all(torch.ops.aten.permute_copy.default in g for g in linear_groups)
    assert len(by_handle) == 5


def test_buffer_mutation_becomes_a_mutation_output(export_zoo):
    _, _, ep = export_zoo("kv_cache_decoder")
    assert not ep.graph_signature.buffers_to_mutate  # training IR: in-place op, no mutation outputs
    edge = to_edge(ep).exported_program()
    kinds = [(s.kind, s.target) for s in edge.graph_signature.output_specs]
    assert (OutputKind.BUFFER_MUTATION, "k_cache") in kinds and (OutputKind.BUFFER_MUTATION, "v_cache") in kinds
    assert not any(n.target is torch.ops.aten.index_copy_.default for n in edge.graph.nodes)


class _SliceWrite(torch.nn.Module):
    """Writes a buffer through a view: only full functionalization can express this."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.zeros(4, 3))

    def forward(self, x):
        self.state[1:3].add_(x)
        return self.state * 2


def test_mutation_through_a_view_falls_back_to_full_functionalization():
    module = _SliceWrite()
    x = torch.ones(2, 3)
    ep = torch.export.export(module, (x,))
    edge = to_edge(ep).exported_program()
    assert [s.kind for s in edge.graph_signature.output_specs].count(OutputKind.BUFFER_MUTATION) == 1
    fresh = _SliceWrite()
    expected = fresh(x)
    torch.testing.assert_close(edge.module()(x), expected)


def test_python_scalars_become_constant_tensors(export_zoo):
    _, _, ep = export_zoo("cond")
    edge = to_edge(ep).exported_program()
    for node in _call_nodes(edge):
        if node.target in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor):
            assert all(isinstance(a, torch.fx.Node) for a in node.args), node


def test_transform_runs_passes_and_relowers(export_zoo):
    _, _, ep = export_zoo("mlp")
    edge = to_edge(ep)

    def relu_to_sigmoid_then_back(gm):
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.relu.default:
                node.target = torch.ops.aten.hardtanh.default
                node.args = (node.args[0], 0.0, 1e30)
        return gm

    transformed = edge.transform([relu_to_sigmoid_then_back])
    targets = [n.target for n in transformed.exported_program().graph.nodes]
    assert torch.ops.aten.hardtanh.default in targets and torch.ops.aten.relu.default not in targets
    assert torch.ops.aten.relu.default in [n.target for n in edge.exported_program().graph.nodes]


def test_to_edge_rejects_what_is_not_an_exported_program():
    with pytest.raises(TypeError, match="ExportedProgram"):
        to_edge(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="empty"):
        to_edge({})
