"""An XNNPACK-delegated program made entirely by upstream (export, .etrecord, runtime ETDump with a
debug buffer) in etlab's views: the Inspector's frame equals upstream Inspector's, the numeric gap
agrees with upstream's on delegate outputs and non-delegated ops, and the delegation info, the
delegation view and the graph show what went to XNNPACK.

Upstream's XNNPACK ETRecord records the edge program *before* lowering (no delegate calls) and an
empty delegate debug-identifier map for each XNNPACK call (XNNPACK's per-op events are named by
XNNPACK, e.g. "Convolution (NHWC, F32) IGEMM #1", and map to no node); the partitions come from
the debug-handle map of each delegate-call instruction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etlab.etrecord import DELEGATE_PARTITION_META, parse_etrecord
from etlab.inspector import Inspector
from tests.interop.conftest import ET_REF, ZOO, cache_key, cached_build, run_ref
from tests.interop.test_upstream_etrecord import assert_same_rows

pytestmark = pytest.mark.interop

BACKEND = "XnnpackBackend"


@pytest.fixture(scope="session")
def xnnpack(ref_python) -> Path:
    """Upstream's XNNPACK CNN: model.pte, model.etrecord, run.etdp + run.bin (2 iterations), and
    upstream Inspector's frame (inspect.json) and numeric gap (gap.json); cached per interop key."""
    def build(tmp: Path) -> None:
        run_ref(ref_python, ET_REF, "export", f"{ZOO}:make_cnn", "--xnnpack", "--out", tmp)
        run_ref(ref_python, ET_REF, "run", tmp / "model.pte", "--inputs", tmp / "inputs.pt", "--etdump",
                tmp / "run.etdp", "--debug-buffer", tmp / "run.bin", "--debug-buffer-size", str(16 << 20),
                "--iters", "2")
        for cmd, out in (("inspect", "inspect.json"), ("gap", "gap.json")):
            run_ref(ref_python, ET_REF, cmd, tmp / "run.etdp", "--etrecord", tmp / "model.etrecord",
                    "--debug-buffer", tmp / "run.bin", "--json", tmp / out)

    return cached_build("xnnpack-views", cache_key()[:16], build)


def _inspector(d: Path) -> Inspector:
    return Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord", debug_buffer_path=d / "run.bin")


def test_frame_equals_upstream(xnnpack):
    df = _inspector(xnnpack).to_dataframe()
    assert_same_rows(df, json.loads((xnnpack / "inspect.json").read_text()))
    calls = df[df.event_name == "DELEGATE_CALL"]
    assert len(calls) >= 2 and all(calls.delegate_backend_name == BACKEND)
    assert all(len(t) > 0 for t in calls.op_types)                      # joined through the handle map
    per_op = df[df.is_delegated_op.astype(bool)]
    assert len(per_op) > 10 and all(isinstance(i, str) for i in per_op.delegate_debug_identifier)
    assert all(t == [] for t in per_op.op_types)                        # as upstream: no identifier map
    record = parse_etrecord(xnnpack / "model.etrecord")
    assert all(e["delegate_map"] == {} for e in record._delegate_map["forward"].values())


def test_numeric_gap_agrees_with_upstream(xnnpack):
    ours = {tuple(r.aot_debug_handle): (r.runtime_ops, r.gap)
            for r in _inspector(xnnpack).calculate_numeric_gap("MSE").itertuples()}
    theirs = {tuple(dict.fromkeys(r["aot_debug_handle"])): r["gap"]
              for r in json.loads((xnnpack / "gap.json").read_text())["rows"]}
    assert ours.keys() == theirs.keys()
    kinds = set()
    for h, (ops, gap) in ours.items():
        kinds.add("delegate" if ops == ["DELEGATE_CALL"] else "operator")
        assert len(gap) == len(theirs[h])
        for a, b in zip(gap, theirs[h]):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-12), f"debug handles {h}"
    assert kinds == {"delegate", "operator"}


def test_delegation_info_and_views_show_xnnpack(xnnpack):
    from etlab.devtools import get_delegation_info
    from etlab.visualizer import DelegationView
    from etlab.visualizer._graph_model import build_graph_model

    record = parse_etrecord(xnnpack / "model.etrecord")
    edge = record.edge_dialect_program
    handles = record._debug_handle_map["forward"]
    delegated_handles = {h for i in record._delegate_map["forward"] for h in handles[i]}
    marked = [n for n in edge.graph.nodes if DELEGATE_PARTITION_META in n.meta]
    expected = [n for n in edge.graph.nodes if n.op == "call_function" and n.meta.get("debug_handle") in
                delegated_handles]
    assert expected and {n.name for n in expected} <= {n.name for n in marked}

    info = get_delegation_info(edge)
    assert info.num_delegated_subgraphs == len(record._delegate_map["forward"]) == 2
    assert set(info.delegation_by_backend) == {BACKEND}
    assert info.delegation_by_backend[BACKEND].num_nodes == len(marked) == info.num_delegated_nodes
    table = info.get_operator_delegation_dataframe().set_index("op_type")
    assert table.loc["aten_convolution_default", "occurrences_in_delegated_graphs"] > 0
    assert table.loc["aten_mean_dim", "occurrences_in_non_delegated_graphs"] == 1  # the one op left portable

    model = build_graph_model(edge, "edge")
    groups = [g for g in model.groups if g.kind == "delegate"]
    assert len(groups) == 2 and all(g.backend == BACKEND for g in groups)
    assert sum(n.backend == BACKEND for n in model.nodes) > 0
    assert DelegationView(edge, show_graph=False).info.num_delegated_subgraphs == 2


def test_etlab_host_run_joins_each_delegated_node(xnnpack, tmp_path):
    """etlab's XnnpackBackend logs each delegated node under its Edge node's debug handle; with
    upstream's ETRecord (whose XNNPACK delegate map is empty) those rows get the node's op type."""
    from etlab.runtime import DebugLevel, Runtime

    record = parse_etrecord(xnnpack / "model.etrecord")
    program = Runtime.get().load_program(xnnpack / "model.pte", enable_etdump=True,
                                         etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    program.load_method("forward").execute(list(record._representative_inputs))
    program.write_etdump_result_to_file(tmp_path / "host.etdp", tmp_path / "host.bin")
    ins = Inspector(etdump_path=tmp_path / "host.etdp", etrecord=xnnpack / "model.etrecord",
                    debug_buffer_path=tmp_path / "host.bin")
    df = ins.to_dataframe()
    per_node = df[df.is_delegated_op.astype(bool) & df.delegate_debug_identifier.map(lambda i: str(i).isdigit())]
    assert len(per_node) > 10
    edge_ops = {n.meta.get("debug_handle"): str(n.target) for n in record.edge_dialect_program.graph.nodes
                if n.op == "call_function"}
    for ident, ops in zip(per_node.delegate_debug_identifier, per_node.op_types):
        assert ops and any(op in edge_ops[int(ident)] for op in ops), (ident, ops)
    assert {op for ops in per_node.op_types for op in ops} >= {"aten.convolution.default", "aten.add.Tensor"}
