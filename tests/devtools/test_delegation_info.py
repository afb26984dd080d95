"""get_delegation_info / format_delegated_graph on graphs lowered to the demo backend."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph, GraphModule

from etlab.compiler._lowered import LoweredBackendModule, executorch_call_delegate
from etlab.devtools import format_delegated_graph, get_delegation_info, print_delegated_graph

COLUMNS = ["op_type", "occurrences_in_delegated_graphs", "occurrences_in_non_delegated_graphs"]


def test_counts_on_demo_partitioned_mlp(mlp_lowered):
    info = get_delegation_info(mlp_lowered.exported_program().graph_module)
    # Three linear layers delegated (permute + addmm each); relus and getitems stay outside.
    assert (info.num_delegated_subgraphs, info.num_delegated_nodes, info.num_non_delegated_nodes) == (3, 6, 5)
    assert {k: (v.num_subgraphs, v.num_nodes) for k, v in info.delegation_by_backend.items()} == {"DemoBackend": (3, 6)}
    summary = info.get_summary()
    assert "Total delegated subgraphs: 3" in summary and "Number of non-delegated nodes: 5" in summary
    assert "Backend DemoBackend: 3 subgraphs, 6 delegated nodes" in summary

    df = info.get_operator_delegation_dataframe()
    assert list(df.columns) == COLUMNS
    assert df.iloc[-1].tolist() == ["Total", 6, 5]
    body = df.iloc[:-1]
    assert body["op_type"].tolist() == sorted(body["op_type"])
    rows = {r.op_type: (r[2], r[3]) for r in body.itertuples()}
    assert rows == {"addmm_default": (3, 0), "permute_default": (3, 0), "getitem": (0, 3), "relu": (0, 2)}


def test_undelegated_graph_has_no_subgraphs(mlp):
    _, _, et = mlp
    info = get_delegation_info(et.exported_program())
    assert info.num_delegated_subgraphs == 0 and info.num_delegated_nodes == 0
    assert info.num_non_delegated_nodes > 0 and info.delegation_by_backend == {}
    assert "lowered" not in format_delegated_graph(et.exported_program().graph_module)


def _hand_lowered() -> GraphModule:
    """x -> [delegate: sin(x) * 2 under an unconventional attribute name] -> cos."""

    class Inner(torch.nn.Module):
        def forward(self, x):
            return torch.sin(x) * 2

    x = torch.randn(3)
    lowered = LoweredBackendModule("HandBackend", b"blob", [], torch.export.export(Inner(), (x,)))
    g = Graph()
    inp = g.placeholder("x")
    attr = g.get_attr("my_delegate")
    call = g.call_function(executorch_call_delegate, (attr, inp))
    item = g.call_function(operator.getitem, (call, 0))
    g.output((g.call_function(torch.ops.aten.cos.default, (item,)),))
    return GraphModule({"my_delegate": lowered}, g)


def test_hand_made_lowered_module_any_attribute_name():
    gm = _hand_lowered()
    info = get_delegation_info(gm)
    assert (info.num_delegated_subgraphs, info.num_delegated_nodes, info.num_non_delegated_nodes) == (1, 2, 2)
    assert set(info.delegation_by_backend) == {"HandBackend"}
    text = format_delegated_graph(gm)
    lines = text.splitlines()
    call = next(i for i, ln in enumerate(lines) if "= executorch_call_delegate(%my_delegate, %x)" in ln)
    assert "backend 'HandBackend', 2 delegated nodes" in lines[call + 1]
    outer = len(lines[call]) - len(lines[call].lstrip())
    inner = [ln for ln in lines if "aten.sin.default" in ln or "aten.mul.Tensor" in ln]
    assert len(inner) == 2 and all(len(ln) - len(ln.lstrip()) == outer + 4 for ln in inner)
    # The get_attr line itself is folded into the delegate call.
    assert not any("get_attr" in ln for ln in lines)


def test_format_shows_each_lowered_graph(mlp_lowered, capsys):
    gm = mlp_lowered.exported_program().graph_module
    text = format_delegated_graph(gm)
    assert text.splitlines()[0] == "graph: 3 delegated subgraphs, 6 delegated and 5 non-delegated nodes"
    assert text.count("backend 'DemoBackend'") == 3
    assert text.count("aten.addmm.default(") == 3 and text.count("aten.relu.default(") == 2
    print_delegated_graph(gm)
    assert capsys.readouterr().out == text


def test_bad_input_names_argument():
    with pytest.raises(TypeError, match="graph_module must be"):
        get_delegation_info("not a graph")
