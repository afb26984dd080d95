"""Inspector.compare across a float build and its int8 static build (EtlabQuantizer, compiled by
etlab): their graphs and debug handles differ, so rows re-join by module + op, q/dq ops attached to
the op they wrap; one layer of the quantized build has a planted coarse output grid."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torchao")

from etlab.facts import OpInfo
from etlab.facts.quant import op_kind, qdq_kind
from etlab.facts.source import module_path
from etlab.inspector._compare_join import HandleGraph, fold_unmatched, handles_line_up, side_keys
from etlab.inspector._rollups import _handles  # an event's handles as a tuple (a kernel's is an int)
from tests.inspector._quant_builds import PLANTED, build_pair, planted_pair
from tests.inspector.test_compare import REPO

MODELS = ("mlp", "cnn")
WEIGHTED = ("aten.convolution", "aten.addmm")


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    name = request.param
    p = planted_pair(name)
    return name, p, p.int8, p.float.compare(p.int8, name_a="float", name_b="int8")


def _timed_events(ins, handles) -> list:
    """The timed op events of the execute blocks whose handles all lie in `handles`."""
    return [e for b in ins.event_blocks if b.name != "Default" for e in b.events
            if e.perf_data is not None and e.debug_handles is not None
            and set(_handles(e.debug_handles)) <= set(handles)
            and e.name not in ("OPERATOR_CALL", "DELEGATE_CALL")]


def test_every_conv_and_linear_pairs_with_its_quantized_counterpart(pair):
    name, p, q8, c = pair
    fl = p.float
    assert c.by == "module+op" and c.rows
    assert c.summary.matched_pct == 100.0 and c.summary.joins == {"module+op": len(c.rows)}
    ops_a = fl.program_info.methods["forward"].ops
    weighted = {h for h, ops in ops_a.items() if op_kind(ops[-1].op_type) in WEIGHTED}
    assert len(weighted) == {"mlp": 3, "cnn": 17}[name]
    ops_b = q8.program_info.methods["forward"].ops
    for h in weighted:
        (row,) = [r for r in c.rows if h in r.handles_a]
        kind = op_kind(ops_a[h][-1].op_type)
        assert row.present == "both" and row.join == "module+op", row.key
        assert row.module == module_path(ops_a[h][-1].module_hierarchy) and row.key.startswith(row.module + "/")
        b_kinds = [op_kind(o.op_type) for hb in row.handles_b for o in ops_b[hb]]
        assert kind in b_kinds  # the quantized build's conv / linear
        # its q/dq ops joined it (the weight's dequantize at least), never rows of their own
        assert any(qdq_kind(k) == "dequantize" for k in b_kinds), row.key
        # the quantized layer's time is its op's plus its q/dq ops', summed per run, then the median
        events = _timed_events(q8, row.handles_b)
        assert len(events) == len(row.events_b) and len(events) > 1
        assert row.latency_b == pytest.approx(float(np.median(np.sum([e.perf_data.raw for e in events], axis=0))))
    assert not [r.key for r in c.rows if all(qdq_kind(o) for o in r.ops)]
    if name == "cnn":  # PT2E folded every batch norm into its conv: A's norm joins the conv's row
        folded = [r for r in c.rows if "folded in" in r.join_note]
        assert len(folded) == 17 - 1 and all("convolution" in r.key for r in folded)


def test_outputs_are_dequantized_and_the_planted_layer_is_the_top_numeric_change(pair):
    name, p, q8, c = pair
    fl = p.float
    # every row compared its output: the quantized side's integer codes dequantized, int8-sized error
    assert c.summary.compared_outputs == len(c.rows) and not [r.numeric_note for r in c.rows if r.numeric_note]
    planted_key = PLANTED[name][1]
    top, second = c.top(2, "added")
    assert top.key == planted_key and top.added_error > 1.5 * second.added_error
    assert c.summary.biggest_numeric.startswith(planted_key) and c.summary.worst_added[0] == planted_key
    # the planted row's B value is a quantize's int8 output
    q_events = [e for e in _timed_events(q8, top.handles_b) if "quantize_per_tensor" in e.name]
    assert q_events and all(str(t.dtype) == "torch.int8" for e in q_events for t in e.debug_data)
    assert all(20 < r.sqnr < 60 for r in c.rows if r.key != planted_key), [(r.key, r.sqnr) for r in c.rows]
    assert "biggest numeric change " + planted_key in c.summary.text(c.unit)
    # the same graph on both sides still joins by debug handle, exactly; a quantized one with its
    # q/dq attached to their ops there too
    for ins in (fl, q8):
        same = ins.compare(ins)
        assert same.by == "debug_handle" and all(r.join == "debug_handle" and r.max_abs == 0 for r in same.rows)
        assert not [r.key for r in same.rows if all(qdq_kind(o) for o in r.ops)]
    assert len(q8.compare(q8).rows) == len(c.rows)


def test_cli_in_a_fresh_process_reads_the_quantized_etrecord_and_shows_the_join(tmp_path):
    p = planted_pair("mlp")
    a, b = p.folder("float"), p.folder("int8")
    out = subprocess.run([sys.executable, "-m", "etlab.cli", "compare", str(a), str(b), "--top", "3", "--json",
                          str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr
    text = " ".join(out.stdout.split())  # the summary and notes wrap to the terminal
    assert "joined by module+op" in text and "+rel.err" in text and "module+op" in text
    assert "biggest numeric change root/relu#1" in text
    assert "numeric differences start at (relative error added over the inputs'): root/relu#1 (+" in text
    data = json.loads((tmp_path / "c.json").read_text())
    assert {r["join"] for r in data["rows"]} == {"module+op"} and data["summary"]["matched_pct"] == 100.0


def test_dynamic_quantization_joins_choose_qparams_and_q_dq_to_the_linear_they_feed(tmp_path):
    from etlab.compiler import EtlabQuantizer, int8_dynamic_config

    p = build_pair("mlp", tmp_path, quantizer=EtlabQuantizer(int8_dynamic_config()))
    c = p.float.compare(p.int8)
    assert c.by == "module+op" and c.summary.matched_pct == 100.0 and len(c.rows) == 5
    for row in (r for r in c.rows if r.key.startswith("fc")):
        names = [e.rsplit(".", 1)[0] for e in row.events_b]
        assert names[-2:] == ["native_call_permute_copy", "native_call_addmm"], names
        assert {"native_call_choose_qparams", "native_call_quantize_per_tensor", "native_call_dequantize_per_tensor",
                "native_call_dequantize_per_channel"} <= set(names)
    assert all(r.events_b == r.events_a for r in c.rows if r.key.startswith("root/relu"))  # float relus
    assert c.summary.compared_outputs == 5 and all(r.sqnr > 25 for r in c.rows)


# --- the keying, on hand-built facts ---------------------------------------------------------------------


def _op(op_type: str, module: str = "") -> list[OpInfo]:
    return [OpInfo(name=op_type.split(".")[1], op_type=op_type,
                   module_hierarchy={"m": (module, "Mod")} if module else None)]


Q, DQ = "quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.dequantize_per_tensor.default"
DQC = "quantized_decomposed.dequantize_per_channel.default"


def test_qdq_attach_to_the_op_they_wrap_by_graph_and_by_order():
    # weight dequantize hoisted first (1), input q (2) / dq (3), conv (4), relu (5), q (6), dq (7), linear (8)
    ops = {1: _op(DQC), 2: _op(Q), 3: _op(DQ), 4: _op("aten.convolution.default", "conv"),
           5: _op("aten.relu.default", "act"), 6: _op(Q), 7: _op(DQ), 8: _op("aten.addmm.default", "fc")}
    producers = {2: set(), 3: {2}, 4: {1, 3}, 5: {4}, 6: {5}, 7: {6}, 8: {7}}
    graph = HandleGraph(producers={k: v for k, v in producers.items() if v},
                        users={1: {4}, 2: {3}, 3: {4}, 4: {5}, 5: {6}, 6: {7}, 7: {8}}, qparams={6: (0.5, 3)})
    keys = side_keys(ops, graph)
    assert keys.anchor == {1: 4, 2: 4, 3: 4, 4: 4, 5: 5, 6: 5, 7: 8, 8: 8}
    assert [keys.role[h] for h in (1, 2, 3, 6, 7)] == ["in", "in", "in", "out", "in"]
    assert keys.key == {4: ("conv", "aten.convolution", 0), 5: ("act", "aten.relu", 0), 8: ("fc", "aten.addmm", 0)}
    assert keys.inputs == {4: set(), 5: {4}, 8: {5}} and keys.qparams == {6: (0.5, 3)}
    # without a graph: by handle order (the hoisted weight dequantize goes to the first op)
    order = side_keys(ops, None)
    assert order.anchor == keys.anchor and not order.has_graph and order.inputs == {4: set(), 5: {4}, 8: {5}}


def test_upstream_handles_that_group_an_op_with_its_q_dq():
    """Upstream's ETRecords give an input's quantize and dequantize one handle, and an op one handle
    with the q/dq on its output: the first attaches to its consumer, the second keys as its op."""
    ops = {1: _op(DQC), 2: [*_op(Q), *_op(DQ)], 3: [*_op("aten.addmm.default", "fc"), *_op(Q), *_op(DQ)]}
    keys = side_keys(ops, HandleGraph(producers={3: {1, 2}}, users={1: {3}, 2: {3}}))
    assert keys.anchor == {1: 3, 2: 3, 3: 3} and keys.role == {1: "in", 2: "in", 3: "op"}
    assert keys.key == {3: ("fc", "aten.addmm", 0)}


def test_dynamic_input_quantization_attaches_forward_through_handles_without_ops():
    """choose_qparams -> getitem (5, 6: handles the ETRecord names no op for) -> quantize.tensor ->
    dequantize.tensor -> linear: all of it is the linear's input."""
    from etlab.inspector._compare_join import MethodJoin

    ops = {4: _op("quantized_decomposed.choose_qparams.tensor"),
           7: _op("quantized_decomposed.quantize_per_tensor.tensor"),
           8: _op("quantized_decomposed.dequantize_per_tensor.tensor"), 9: _op("aten.addmm.default", "fc")}
    producers = {5: {4}, 6: {4}, 7: {5, 6}, 8: {7}, 9: {8}}
    users = {4: {5, 6}, 5: {7}, 6: {7}, 7: {8}, 8: {9}}
    keys = side_keys(ops, HandleGraph(producers=producers, users=users))
    assert keys.anchor == {4: 9, 7: 9, 8: 9, 9: 9} and {keys.role[h] for h in (4, 7, 8)} == {"in"}
    join = MethodJoin(keys, keys, by_handle=False)
    assert join.link("b", "Execute", 8) == ("m", "Execute", "fc", "aten.addmm", 0)
    assert join.link("b", "Execute", 5) == ("h", "Execute", 5)  # a handle without ops keys as itself


def test_ops_only_the_operator_keeps_apart_pair_by_order_in_their_module():
    """One build lowers a linear to addmm, another keeps aten.linear: same module, one op each side."""
    from etlab.inspector._compare_join import MethodJoin, pair_leftovers

    a = side_keys({1: _op("aten.addmm.default", "fc"), 2: _op("aten.relu.default", "act")}, None)
    b = side_keys({3: _op(DQC), 4: _op("aten.linear.default", "fc"), 5: _op("aten.relu.default", "act"),
                   6: _op("aten.gelu.default", "act2")}, None)
    pair_leftovers(a, b)
    assert b.key[4] == a.key[1] == ("fc", "aten.addmm", 0) and b.key[6] == ("act2", "aten.gelu", 0)
    join = MethodJoin(a, b, by_handle=False)
    assert join.notes("b", [4]) == ["addmm (A) and linear (B) paired by order in fc"]
    # a unit of q/dq alone that wraps ops of several layers joins none of them
    two = side_keys({1: _op(DQC), 2: _op(DQC), 3: _op("aten.convolution.default", "c1"),
                     4: _op("aten.convolution.default", "c2")},
                    HandleGraph(producers={3: {1}, 4: {2}}, users={1: {3}, 2: {4}}))
    join = MethodJoin(two, two, by_handle=False)
    assert join.links("b", "Execute", (1, 2)) == [] and join.links("b", "Execute", (1,)) == [
        ("m", "Execute", "c1", "aten.convolution", 0)]
    assert join.links("b", "Execute", (1, 4)) == [("m", "Execute", "c2", "aten.convolution", 0)]


def test_batch_norm_folds_into_its_producer_only_when_the_other_side_lacks_it():
    bn = "aten._native_batch_norm_legit_no_training.default"
    a = side_keys({1: _op("aten.convolution.default", "c.0"), 2: _op(bn, "c.1"), 3: _op("aten.relu.default", "c.2")},
                  HandleGraph(producers={2: {1}, 3: {2}}, users={1: {2}, 2: {3}}))
    b = side_keys({5: _op("aten.convolution.default", "c.0"), 6: _op("aten.relu.default", "c.2")},
                  HandleGraph(producers={6: {5}}, users={5: {6}}))
    fold_unmatched(a, b)
    assert a.folded == {2: 1} and a.target(2) == 1 and b.folded == {}
    keep = side_keys({1: _op("aten.convolution.default", "c.0"), 2: _op(bn, "c.1")}, None)
    fold_unmatched(keep, side_keys({1: _op("aten.convolution.default", "c.0"), 2: _op(bn, "c.1")}, None))
    assert keep.folded == {}


def test_kinds_and_handle_alignment():
    assert op_kind("aten.add.Tensor") == "aten.add" and op_kind("getitem") == "getitem"
    assert qdq_kind(Q) == "quantize" and qdq_kind(DQC) == "dequantize" and qdq_kind("aten.relu.default") is None
    assert qdq_kind("quantized_decomposed.choose_qparams.tensor") == "quantize"
    ops = {1: _op("aten.relu.default"), 2: _op("aten.add.Tensor")}
    assert handles_line_up(ops, dict(ops)) and not handles_line_up(ops, {1: _op(DQ), 2: ops[2]})
    assert not handles_line_up(ops, {7: _op("aten.relu.default")})  # no handle in common


def test_a_graph_that_cannot_be_rebuilt_falls_back_to_handle_order(caplog):
    from etlab.errors import FormatError
    from etlab.inspector._compare_join import recorded_graph

    class Broken:
        def get_exported_program(self, key):
            raise FormatError(f"model.etrecord: graph {key}: unknown operator 'evil.op'")

    class Missing:
        def get_exported_program(self, key):
            raise KeyError(key)

    with caplog.at_level("WARNING", logger="etlab.inspector._compare_join"):
        assert recorded_graph(Broken(), "forward") is None
    assert "unknown operator 'evil.op'" in caplog.text and "handle order" in caplog.text
    assert recorded_graph(Missing(), "forward") is None
