"""get_delegation_info / format_delegated_graph on graphs lowered to the demo backend."""

from __future__ import annotations

import inspect
import json
import operator
import os
import subprocess

import pandas as pd
import pytest
import torch
from torch.fx import Graph, GraphModule

from etlab.compiler import LoweredBackendModule, executorch_call_delegate, to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.devtools import format_delegated_graph, get_delegation_info, op_type_of, print_delegated_graph

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
    # types named as upstream's edge graphs name nodes, whatever etlab named them (relu, addmm_default)
    assert rows == {"aten_addmm_default": (3, 0), "aten_permute_copy_default": (3, 0), "getitem": (0, 3),
                    "aten_relu_default": (0, 2)}


class _MmAddSub(torch.nn.Module):
    """Upstream's own test model for get_delegation_info (backend_debug/tests/test_delegation_info.py)."""

    def forward(self, a, x, b):
        y = torch.mm(a, x)
        z = y + b
        a = z - a
        y = torch.mm(a, x)
        return y + b


_INPUTS = (torch.randn(2, 2), torch.randn(2, 2), torch.randn(2, 2))

# What upstream's test asserts for this model lowered with its add/mm demo partitioner.
UPSTREAM_TABLE = {"op_type": ["aten_add_tensor", "aten_mm_default", "aten_sub_tensor", "getitem", "Total"],
                  "occurrences_in_delegated_graphs": [2, 2, 0, 0, 4],
                  "occurrences_in_non_delegated_graphs": [0, 0, 1, 2, 3]}


def _ours_on_upstream_model() -> pd.DataFrame:
    edge = to_edge_transform_and_lower(torch.export.export(_MmAddSub(), _INPUTS, strict=True),
                                       partitioner=[DemoPartitioner()])
    info = get_delegation_info(edge.exported_program().graph_module)
    assert (info.num_delegated_subgraphs, info.num_delegated_nodes, info.num_non_delegated_nodes) == (2, 4, 3)
    return info.get_operator_delegation_dataframe()


def test_operator_table_of_upstreams_test_model():
    pd.testing.assert_frame_equal(_ours_on_upstream_model(), pd.DataFrame(UPSTREAM_TABLE))


# The same model (its source, pasted in) lowered by upstream with its add/mm demo partitioner.
_REF_SCRIPT = """
import json, sys, torch
from executorch.devtools.backend_debug import get_delegation_info
from executorch.exir import to_edge
from executorch.exir.backend.test.op_partitioner_demo import AddMulPartitionerDemo
{model}
inputs = tuple(torch.randn(2, 2) for _ in range(3))
edge = to_edge(torch.export.export(_MmAddSub(), inputs, strict=True)).to_backend(AddMulPartitionerDemo())
df = get_delegation_info(edge.exported_program().graph_module).get_operator_delegation_dataframe()
json.dump(df.astype({{c: "int64" for c in df.columns[1:]}}).to_dict(orient="list"), sys.stdout)
"""


@pytest.mark.interop
def test_operator_table_matches_upstream_on_the_same_model(ref_python):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    script = _REF_SCRIPT.format(model=inspect.getsource(_MmAddSub))
    p = subprocess.run([ref_python, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, f"upstream get_delegation_info failed:\n{p.stderr[-3000:]}"
    upstream = pd.DataFrame(json.loads(p.stdout.strip().splitlines()[-1]))
    pd.testing.assert_frame_equal(_ours_on_upstream_model(), upstream)


def test_op_type_of_names_operators_like_upstream_nodes():
    g = Graph()
    x = g.placeholder("x")
    nodes = [g.call_function(torch.ops.aten._native_batch_norm_legit_no_training.default, (x,)),
             g.call_function(torch.ops.aten.sum.dim_IntList, (x, [0])),
             g.call_function(operator.getitem, (x, 0)), g.call_function(executorch_call_delegate, (x,))]
    assert [op_type_of(n) for n in nodes] == ["aten__native_batch_norm_legit_no_training_default",
                                              "aten_sum_dim_int_list", "getitem", "executorch_call_delegate"]
    with pytest.raises(TypeError, match=r"torch\.fx Node"):
        op_type_of("relu_1")


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
