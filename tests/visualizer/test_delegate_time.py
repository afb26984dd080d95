"""Delegated time lands where it ran, once: in every graph that draws a delegate's nodes (ATen, Edge with
the partition expanded, the planned runtime graph, the .pte instruction graph of the Lab dashboard),
the times on a delegate call's nodes sum to its DELEGATE_CALL p50. The backend's per-op events say
how the call divides (an event on several nodes is split among them), never add to it.

Runs: etlab's DemoBackend (its per-op events name debug handles), and upstream ExecuTorch's XNNPACK
(its runtime's per-op events name XNNPACK operators, no node: the call is split evenly and says so;
etlab's runtime running that same .pte logs per-node events the Inspector joins by handle)."""

from __future__ import annotations

import pytest
import torch

from etlab.inspector import DELEGATE_CALL, Inspector, execute_timings, op_timings
from etlab.visualizer import GraphView
from etlab.visualizer._graph_model import GraphModel
from etlab.visualizer._profile_data import node_latencies, runs_merged


def delegate_calls(inspector) -> list:
    """Each delegate call's timing over all runs (runs that logged intermediates are a block each)."""
    return [t for t in runs_merged(execute_timings(op_timings(inspector))) if t.name == DELEGATE_CALL]


def assert_delegates_sum_to_their_calls(model: GraphModel, inspector) -> int:
    """For each DELEGATE_CALL, the p50 on the nodes holding its handles sums to the call's p50 (those
    nodes time nothing else here); returns how many calls were checked."""
    checked = 0
    for call in delegate_calls(inspector):
        nodes = [n for n in model.nodes if set(n.handles) & set(call.handles)]
        assert nodes, (model.kind, call.instruction_id)
        shown = sum(n.latency["p50"] for n in nodes if n.latency)
        assert shown == pytest.approx(call.p50, rel=1e-9), (model.kind, call.instruction_id, shown, call.p50)
        if len(nodes) > 1:
            whole = [n for n in nodes if n.latency and n.latency["p50"] == pytest.approx(call.p50)]
            assert len(whole) <= 1, (model.kind, [n.name for n in whole])  # not the whole call on each node
            assert all("DELEGATE_CALL" in (n.latency or {}).get("note", "DELEGATE_CALL") for n in nodes)
        checked += 1
    return checked


@pytest.fixture(scope="module")
def demo_cnn(tmp_path_factory):
    """The demo's CNN with DemoBackend partitions (each an add; the classifier permute_copy + addmm), run 3 times."""
    from etlab.models import make_cnn
    from tests.visualizer.conftest import compile_and_run

    run = compile_and_run(tmp_path_factory.mktemp("demo_cnn"), make=make_cnn)
    return run.manager, Inspector(etdump_path=run.etdump, etrecord=run.manager.get_etrecord()), run.pte


def test_demo_backend_nodes_sum_to_their_call_in_every_graph(demo_cnn):
    et, ins, _ = demo_cnn
    view = GraphView(et, ["aten", "edge", "runtime"], inspector=ins, overlay="latency")
    for model in view.models:
        assert assert_delegates_sum_to_their_calls(model, ins) == 4, model.kind
    edge = view.models[1]
    classifier = [n for n in edge.nodes if n.group and n.group.startswith("delegate:") and n.module == "classifier.1"]
    assert {n.op for n in classifier} == {"aten.permute_copy.default", "aten.addmm.default"}
    # one backend event on both nodes: each shows half of the call, not the event's whole time twice
    assert classifier[0].latency["p50"] == pytest.approx(classifier[1].latency["p50"])
    assert "split by its backend's per-op times" in classifier[0].latency["note"]


def test_lab_pte_graph_puts_each_call_on_its_delegate_node(demo_cnn):
    from etlab.etdump import read_etdump
    from etlab.jupyter._runs import etdp_view
    from etlab.schema import load_file

    _, ins, pte = demo_cnn
    view = etdp_view(read_etdump(pte.with_name("run.etdp")), ins, program_kind="pte", pte=load_file(pte, what=pte.name))
    graph = view["graphs"][0]
    for call in delegate_calls(ins):
        node = next(n for n in graph["nodes"] if n["handles"] == [call.instruction_id])
        assert node["kind"] == "delegate" and node["latency"]["p50"] == pytest.approx(call.p50)


def test_events_on_several_nodes_are_split_not_repeated(demo_cnn):
    """A kernel event covering two nodes of a graph (here: a made-up model whose two nodes share a handle)
    puts half its time on each."""
    from etlab.visualizer._graph_model import GraphNode

    _, ins, _ = demo_cnn
    kernel = next(t for t in execute_timings(op_timings(ins)) if t.name != DELEGATE_CALL and not t.is_delegated
                  and t.handles)
    model = GraphModel("two", "edge", "forward", nodes=[
        GraphNode(0, "a", "op", "x", None, handles=[kernel.handles[0]]),
        GraphNode(1, "b", "op", "y", None, handles=[kernel.handles[0]])])
    lat = node_latencies(model, [kernel])
    assert lat[0]["p50"] + lat[1]["p50"] == pytest.approx(kernel.p50) and lat[0]["shared"] == 2


# --- upstream's XNNPACK ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream_xnnpack(tmp_path_factory):
    """The demo CNN lowered to XNNPACK by upstream ExecuTorch (with its ETRecord) and run by upstream's
    runtime (ETDump); cached like the other interop artifacts."""
    from tests.interop.conftest import ET_REF, SETUP_SH, ZOO, cache_key, cached_build, run_ref, setup_reference

    try:
        ref = setup_reference()
    except RuntimeError as e:
        pytest.fail(f"upstream ExecuTorch reference environment unavailable:\n{e}", pytrace=False)

    def build(out):
        run_ref(ref, ET_REF, "export", f"{ZOO}:make_cnn", "--out", out, "--xnnpack", timeout=1200)
        run_ref(ref, ET_REF, "run", out / "model.pte", "--inputs", out / "inputs.pt", "--etdump", out / "run.etdp",
                "--iters", "3", timeout=600)

    return cached_build("xnnpack-cnn-timing", cache_key((ZOO, ET_REF, SETUP_SH), "cnn --xnnpack iters=3"), build)


@pytest.mark.interop
def test_upstream_xnnpack_nodes_sum_to_their_call(upstream_xnnpack):
    ins = Inspector(etdump_path=upstream_xnnpack / "run.etdp", etrecord=upstream_xnnpack / "model.etrecord")
    view = GraphView(ins, ["aten", "edge"], overlay="latency")
    for model in view.models:
        assert assert_delegates_sum_to_their_calls(model, ins) >= 1
        split = [n for n in model.nodes if n.latency and "split evenly" in n.latency.get("note", "")]
        assert split, "upstream's XNNPACK events name operators, not nodes: the call is split evenly, and says so"


@pytest.mark.interop
def test_etlab_runtime_on_upstream_xnnpack_splits_by_its_per_node_events(upstream_xnnpack, tmp_path):
    from etlab.runtime import Runtime

    inputs = torch.load(upstream_xnnpack / "inputs.pt", weights_only=True)
    program = Runtime.get().load_program(upstream_xnnpack / "model.pte", enable_etdump=True)
    method = program.load_method("forward")
    for _ in range(3):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(tmp_path / "run.etdp")
    ins = Inspector(etdump_path=tmp_path / "run.etdp", etrecord=upstream_xnnpack / "model.etrecord")
    joined = [t for t in execute_timings(op_timings(ins)) if t.is_delegated and t.handles]
    assert joined and all(t.op_types for t in joined)  # the Inspector joins them by handle
    view = GraphView(ins, ["aten", "edge"], overlay="latency")
    for model in view.models:
        assert assert_delegates_sum_to_their_calls(model, ins) >= 1
        assert any("split by its backend's per-op times" in (n.latency or {}).get("note", "") for n in model.nodes)
