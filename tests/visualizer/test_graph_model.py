"""The data GraphView draws: nodes, groups, delegates, handles, overlays."""

from __future__ import annotations

import json

import pytest

from etlab.visualizer import GraphView, build_graph_model
from etlab.visualizer._graph_model import aten_handles_of
from etlab.visualizer._synthetic import synthetic_graph_model


def test_edge_graph_expands_delegates_into_backend_partitions(mlp_run):
    view = GraphView(mlp_run.manager, "edge")
    m = view.model
    delegates = [g for g in m.groups if g.kind == "delegate"]
    assert len(delegates) == 3 and {g.backend for g in delegates} == {"DemoBackend"}
    assert {g.parent for g in delegates} == {"fc1", "fc2", "fc3"}  # each partition sits in its module
    inside = [n for n in m.nodes if n.group and n.group.startswith("delegate:")]
    assert {n.op for n in inside} == {"aten.permute_copy.default", "aten.addmm.default"}
    assert all(n.backend == "DemoBackend" for n in inside)
    assert "DemoBackend" in m.backend_colors
    assert not any(n.name.startswith("getitem") for n in m.nodes)  # plumbing left out
    addmm = m.node_named("addmm_default")
    assert addmm.shapes == [[4, 64]] and addmm.dtypes == ["float32"] and addmm.bytes == 4 * 64 * 4
    assert addmm.handles and addmm.module == "fc1"
    # the source is the model's line (not torch's linear.py); the full stack is kept for the details panel
    assert addmm.source.startswith("zoo.py:") and "self.fc1(x)" in addmm.source and "F.linear" in addmm.stack_trace
    relu = m.node_named("relu")
    assert (m.node_named("addmm_default").id, relu.id) in m.edges  # the delegate's output feeds relu


def test_runtime_graph_has_one_node_per_delegate_call(mlp_run):
    m = GraphView(mlp_run.manager, "runtime").model
    delegates = [n for n in m.nodes if n.kind == "delegate"]
    assert len(delegates) == 3 and all(n.backend == "DemoBackend" for n in delegates)
    # its handles are those of the edge nodes it runs
    edge = GraphView(mlp_run.manager, "edge").model
    assert set(delegates[0].handles) == set(edge.node_named("addmm_default").handles)
    assert [n.op for n in m.nodes if n.kind == "op"] == ["aten.relu.out", "aten.relu.out"]


def test_aten_nodes_take_the_handles_of_their_edge_nodes(mlp_run):
    record = mlp_run.manager.get_etrecord()
    edge_ep, aten_ep = record.edge_program("forward"), record.exported_programs["forward"]
    aten = build_graph_model(aten_ep, "aten", handles_of=aten_handles_of(edge_ep))
    edge = build_graph_model(edge_ep, "edge")
    linear = aten.node_named("linear")
    assert linear.handles == edge.node_named("addmm_default").handles
    assert all(n.handles for n in aten.nodes if n.kind == "op")


def test_inspector_overlays_latency_and_gap(mlp_run, mlp_inspector):
    # the ETRecord holds the ATen and edge graphs; the planned (runtime) one comes with the program
    with pytest.raises(ValueError, match="no 'runtime' graph here"):
        GraphView(mlp_inspector, ["aten", "edge", "runtime"])
    view = GraphView(mlp_run.manager, ["aten", "edge", "runtime"], inspector=mlp_inspector, overlay="latency",
                     shown=["edge", "runtime"])
    assert [m.kind for m in view.models] == ["aten", "edge", "runtime"] and view.options["shown"] == ["edge", "runtime"]
    for m in view.models:
        timed = [n for n in m.nodes if n.kind in ("op", "delegate")]
        assert timed and all(n.latency is not None for n in timed), m.kind
        assert all(n.latency["p50"] > 0 and n.latency["runs"] == 3 for n in timed)
        assert all(n.gap is not None for n in timed)  # matched intermediates on every op
    relu = view.models[1].node_named("relu")
    assert relu.latency["events"] == ["native_call_relu.out"]
    json.dumps(view.graphs)  # what goes to the browser is plain JSON


def test_focus_and_bad_input(mlp_run):
    view = GraphView(mlp_run.manager, "edge")
    view.focus("relu")
    assert view.focus_target["name"] == "relu"
    with pytest.raises(KeyError, match="no node"):
        view.focus("nope")
    with pytest.raises(ValueError, match="graph must be one of"):
        GraphView(mlp_run.manager, "lowered")
    with pytest.raises(ValueError, match="overlay"):
        GraphView(mlp_run.manager, overlay="heat")
    with pytest.raises(ValueError, match="shown must be"):
        GraphView(mlp_run.manager, "edge", shown=["runtime"])
    with pytest.raises(TypeError, match="expected an ExecutorchProgramManager"):
        GraphView(42)


def test_synthetic_graph_is_grouped_for_collapse():
    m = synthetic_graph_model(5000)
    assert len(m.nodes) == 5000
    tops = [g for g in m.groups if g.parent is None]
    assert len(tops) == 50  # what a collapsed view draws
    assert any(g.kind == "delegate" for g in m.groups)
    ids = {g.id for g in m.groups}
    assert all(n.group in ids for n in m.nodes)


def test_graphs_of_a_delegated_transformer_are_one_piece():
    """Views, split outputs (tensor lists), multi-output ops and delegate calls keep every graph connected."""
    from etlab.compiler import to_edge_transform_and_lower
    from etlab.compiler.backends import DemoPartitioner
    from etlab.models import export_zoo
    from tests.jupyter.test_dataflow import components

    et = to_edge_transform_and_lower(export_zoo("transformer"), partitioner=[DemoPartitioner()]).to_executorch()
    for kind, program in (("edge", et.edge_program_manager.exported_program()), ("runtime", et.exported_program())):
        model = build_graph_model(program, kind)
        assert components(model) == 1, kind
        assert any(n.kind == "delegate" or n.backend for n in model.nodes), kind
