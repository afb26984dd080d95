"""The delegation explainer: why each node a partitioner left out stayed out, everywhere it is shown.

A planted model has one node of each kind DemoBackend refuses (an operator it does not run, a float64
value, a dynamic dimension, an argument it cannot take) next to nodes it takes; each must come out
with its category in get_delegation_info's node table, through an ETRecord round trip, in the
delegation view's HTML and in `etlab info` run as a command (in a child process).
"""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph, GraphModule

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner, why_unsupported
from etlab.devtools import NODE_COLUMNS, _delegation_info, get_delegation_info
from etlab.etrecord import parse_etrecord
from etlab.facts.lowered import DELEGATE_PARTITION_META, DELEGATION_REFUSAL_META, DelegationRefusal


class Planted(torch.nn.Module):
    """Two delegated adds around one node of each refusal category."""

    def forward(self, x, y, w, d):
        a = x + y
        b = torch.sub(a, y)  # PLANT operator
        c = w * w  # PLANT dtype
        e = d + d  # PLANT dynamic_shape
        f = torch.add(a, b, alpha=2)  # PLANT argument
        return f + x, c, e


def _inputs():
    return (torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3))


# node source line marker -> the category the explainer must give it
PLANTED = {"operator": "PLANT operator", "dtype": "PLANT dtype", "dynamic_shape": "PLANT dynamic_shape",
           "argument": "PLANT argument"}


@pytest.fixture(scope="module")
def planted_edge():
    n = torch.export.Dim("n", min=2, max=16)
    ep = torch.export.export(Planted(), _inputs(), dynamic_shapes=(None, None, None, {0: n}))
    return to_edge_transform_and_lower(ep, partitioner=[DemoPartitioner()], generate_etrecord=True)


def _by_marker(df):
    """The row of each planted node, found by its source line."""
    rows = {}
    for category, marker in PLANTED.items():
        hits = df[df["source"].str.contains(marker, regex=False)]
        assert len(hits) == 1, f"{marker}: {hits[['node', 'op', 'source']].to_dict('records')}"
        rows[category] = hits.iloc[0]
    return rows


def test_node_table_names_each_planted_refusal(planted_edge):
    info = get_delegation_info(planted_edge.exported_program())
    df = info.get_node_delegation_dataframe()
    assert list(df.columns) == NODE_COLUMNS
    for category, row in _by_marker(df).items():
        assert not row["delegated"] and row["backend"] == "DemoBackend", row.to_dict()
        assert row["category"] == category, row.to_dict()
        assert row["reason"] and "test_delegation_explainer.py" in row["source"]
    rows = _by_marker(df)
    assert "aten.sub.Tensor" in rows["operator"]["reason"]
    assert "float64" in rows["dtype"]["reason"] and "dynamic dimension" in rows["dynamic_shape"]["reason"]
    assert "alpha=2" in rows["argument"]["reason"] and rows["argument"]["hint"]
    delegated = df[df["delegated"]]
    assert len(delegated) == 2 and set(delegated["backend"]) == {"DemoBackend"}
    assert (delegated["category"] == "").all() and (delegated["reason"] == "").all()
    assert len(info.get_node_delegation_dataframe(delegated=False)) == len(df) - 2
    # the partitioner recorded a reason for every node it left out
    assert info.unexplained == []
    groups = {g.category: g.count for g in info.refusal_groups()}
    assert {"operator", "dtype", "dynamic_shape", "argument"} <= set(groups)
    assert sum(groups.values()) == len(df) - 2


def test_refusals_survive_the_etrecord(planted_edge, tmp_path):
    record = planted_edge.to_executorch().get_etrecord()
    record.save(tmp_path / "model.etrecord")
    edge = parse_etrecord(str(tmp_path / "model.etrecord")).edge_dialect_program
    edge = edge["forward"] if isinstance(edge, dict) else edge
    before = get_delegation_info(planted_edge.exported_program()).get_node_delegation_dataframe()
    after = get_delegation_info(edge).get_node_delegation_dataframe()
    assert after.equals(before)


def test_format_refusals_groups_by_category(planted_edge):
    text = get_delegation_info(planted_edge.exported_program()).format_refusals()
    for category, marker in PLANTED.items():
        assert f"\n  {category}: 1 node(s)\n" in text or category == "operator", text
        assert marker in text
    assert text.startswith("left out of delegation: ")
    assert "1 x aten.add.Tensor: keyword argument alpha=2" in text


def test_demo_why_unsupported_returns_refusals():
    g = Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 2)
    node = g.call_function(torch.ops.aten.cos.default, (x,))
    node.meta["val"] = torch.empty(2, 2)
    refusal = why_unsupported(node)
    assert isinstance(refusal, DelegationRefusal) and refusal.category == "operator"
    add = g.call_function(torch.ops.aten.add.Tensor, (x, x))
    add.meta["val"] = torch.empty(2, 2)
    assert why_unsupported(add) is None


def test_upstream_style_graph_is_explained_by_xnnpack_rules(monkeypatch):
    """A graph lowered to XNNPACK without recorded reasons (upstream's records) asks the XNNPACK
    rules about each node left out; of a node the rules accept, it says so."""
    g = Graph()
    x = g.placeholder("x")
    taken = g.call_function(torch.ops.aten.add.Tensor, (x, x))
    taken.meta[DELEGATE_PARTITION_META] = ("XnnpackBackend", 0)
    refused = g.call_function(torch.ops.aten.cos.default, (taken,))
    accepted = g.call_function(torch.ops.aten.mul.Tensor, (refused, refused))
    g.output((accepted,))
    gm = GraphModule(torch.nn.Module(), g)

    def rules(node):
        if node.target is torch.ops.aten.cos.default:
            return DelegationRefusal("XnnpackBackend", "operator", "cos is not an XNNPACK op", "none")
        return None

    monkeypatch.setattr(_delegation_info, "_xnnpack_rules", lambda: rules)
    df = get_delegation_info(gm).get_node_delegation_dataframe().set_index("node")
    assert df.loc[taken.name, "delegated"] and df.loc[taken.name, "backend"] == "XnnpackBackend"
    assert df.loc[refused.name, "category"] == "operator"
    assert df.loc[refused.name, "reason"] == "cos is not an XNNPACK op"
    assert df.loc[accepted.name, "category"] == "other" and not df.loc[accepted.name, "delegated"]
    assert "etlab's XNNPACK rules accept this node" in df.loc[accepted.name, "reason"]
    # a recorded refusal wins over the rules; without an XNNPACK partition the rules are not asked
    refused.meta[DELEGATION_REFUSAL_META] = DelegationRefusal("XnnpackBackend", "dtype", "recorded", "")
    assert get_delegation_info(gm).get_node_delegation_dataframe().set_index("node").loc[refused.name,
                                                                                         "reason"] == "recorded"
    refused.meta.pop(DELEGATION_REFUSAL_META)
    taken.meta.pop(DELEGATE_PARTITION_META)
    assert get_delegation_info(gm).get_node_delegation_dataframe().set_index("node").loc[refused.name,
                                                                                         "category"] == ""


def test_getitems_are_not_rows(planted_edge):
    gm = planted_edge.exported_program().graph_module
    getitems = [n.name for n in gm.graph.nodes if n.target is operator.getitem]
    assert getitems  # the delegate calls are unpacked by getitems ...
    names = set(get_delegation_info(gm).get_node_delegation_dataframe()["node"])
    assert not names & set(getitems)  # ... which run no kernel: nothing to delegate


def test_delegation_view_html_groups_the_reasons(planted_edge, tmp_path):
    from etlab.visualizer import DelegationView, repr_mimebundle

    view = DelegationView(planted_edge, show_graph=False)
    by_node = {r["node"]: r for r in view.refusal_table.rows}
    df = get_delegation_info(planted_edge.exported_program()).get_node_delegation_dataframe()
    for category, row in _by_marker(df).items():
        assert by_node[row["node"]]["category"] == category
        assert by_node[row["node"]]["focus"] == {"name": row["node"], "kind": "edge"}
    text = view.save_html(tmp_path / "delegation.html").read_text()
    groups = {g.category: g.count for g in view.refusal_groups}
    for category in PLANTED:
        assert f"<tr data-category='{category}'><td>{category}</td><td>{groups[category]}</td>" in text
    assert "PLANT argument" in text and "alpha=2" in text
    # the notebook repr of DelegationInfo shows the same groups
    html = repr_mimebundle(get_delegation_info(planted_edge.exported_program()))["text/html"]
    assert all(f"<td>{category}</td>" in html for category in PLANTED)


@pytest.fixture(scope="module")
def planted_files(planted_edge, tmp_path_factory):
    d = tmp_path_factory.mktemp("planted")
    et = planted_edge.to_executorch()
    et.write_to_file(d / "model.pte")
    et.get_etrecord().save(d / "model.etrecord")
    return d


def _assert_grouped(out: str) -> None:
    for category in PLANTED:
        assert f"      {category}: " in out, out
    assert "alpha=2" in out and "hint: fold alpha into an explicit mul" in out
    assert "PLANT dtype" in out and "float64" in out and "dynamic dimension" in out


@pytest.fixture(scope="module")
def info_runs(planted_files, tmp_path_factory) -> dict[str, dict]:
    """`etlab info` on the planted files as a user runs it, every case in one child process (tests/_cli_batch.py:
    torch imported once, not once per command): name -> {status, stdout, stderr}."""
    from tests._cli_batch import run_etlab

    alone = tmp_path_factory.mktemp("alone") / "alone.pte"
    alone.write_bytes((planted_files / "model.pte").read_bytes())
    other_dir = tmp_path_factory.mktemp("other")
    other = to_edge_transform_and_lower(torch.export.export(torch.nn.Linear(3, 3), (torch.randn(2, 3),)),
                                        partitioner=[DemoPartitioner()], generate_etrecord=True).to_executorch()
    (other_dir / "model.pte").write_bytes((planted_files / "model.pte").read_bytes())
    other.get_etrecord().save(other_dir / "model.etrecord")
    (other_dir / "bad.etrecord").write_bytes(b"not a zip")
    cases = {"pte": ["info", planted_files / "model.pte"], "etrecord": ["info", planted_files / "model.etrecord"],
             "alone": ["info", alone],
             "alone+etrecord": ["info", alone, "--etrecord", planted_files / "model.etrecord"],
             "other": ["info", other_dir / "model.pte"],
             "bad": ["info", other_dir / "model.pte", "--etrecord", other_dir / "bad.etrecord"]}
    return dict(zip(cases, run_etlab(list(cases.values()))))


@pytest.mark.slow  # etlab info in a child process: left out of make test-fast
def test_etlab_info_explains_a_pte_with_its_etrecord_beside_it(info_runs):
    p = info_runs["pte"]
    assert p["status"] == 0, p["stderr"]
    text = " ".join(p["stdout"].split())  # info wraps its lines to the terminal (120 columns when piped)
    assert "delegation of 'forward' (from " in text and "DemoBackend 2 partition(s) 2 node(s)" in text
    _assert_grouped(p["stdout"])


@pytest.mark.slow  # etlab info in a child process: left out of make test-fast
def test_etlab_info_on_an_etrecord_and_with_etrecord_option(info_runs):
    p = info_runs["etrecord"]
    assert p["status"] == 0, p["stderr"]
    _assert_grouped(p["stdout"])
    p = info_runs["alone"]
    assert p["status"] == 0 and "delegation" not in p["stdout"]  # nothing beside it to explain with
    p = info_runs["alone+etrecord"]
    assert p["status"] == 0, p["stderr"]
    _assert_grouped(p["stdout"])


@pytest.mark.slow  # etlab info in a child process: left out of make test-fast
def test_etlab_info_refuses_an_etrecord_of_another_program(info_runs):
    p = info_runs["other"]
    assert p["status"] == 0 and "not used: it records another program" in p["stdout"]
    p = info_runs["bad"]
    assert p["status"] == 2 and "bad.etrecord" in p["stderr"] and "Traceback" not in p["stderr"]


class PlantedForXnnpack(torch.nn.Module):
    """A conv and a linear XNNPACK takes, around one node of each refusal category."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, w, v, d):
        a = self.conv(x)
        b = torch.cumsum(a, dim=1)  # PLANT operator
        c = w * w  # PLANT dtype
        e = d[:, 1:]  # PLANT dynamic_shape
        f = torch.nn.functional.avg_pool2d(a, 2, ceil_mode=True)  # PLANT argument
        return b, c, e, f, self.lin(v)


def test_xnnpack_refusals_in_table_and_view(tmp_path):
    from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    from etlab.visualizer import DelegationView

    n = torch.export.Dim("n", min=2, max=16)
    inputs = (torch.randn(1, 3, 10, 10), torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 6), torch.randn(5, 3))
    ep = torch.export.export(PlantedForXnnpack(), inputs, dynamic_shapes=(None, None, None, {0: n}))
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    info = get_delegation_info(edge.exported_program())
    df = info.get_node_delegation_dataframe()
    for category, row in _by_marker(df).items():
        assert not row["delegated"] and row["backend"] == "XnnpackBackend" and row["category"] == category, \
            row.to_dict()
        assert row["reason"]
    assert {"aten.convolution.default", "aten.linear.default"} <= set(df[df["delegated"]]["op"])  # kept whole
    assert set(df[df["delegated"]]["backend"]) == {"XnnpackBackend"}
    text = DelegationView(edge, show_graph=False).save_html(tmp_path / "x.html").read_text()
    for category in PLANTED:
        assert f"<td>{category}</td><td>1</td>" in text


@pytest.mark.parametrize("bad", [
    {"": {"relu": ["DemoBackend", "not-a-category", "r", "h"]}},
    {"": {"relu": ["DemoBackend", "operator", "r"]}},
    {"": {"relu": ["DemoBackend", "operator", 7, "h"]}},
    {"": {"relu": ["DemoBackend", "operator", "x" * 5000, "h"]}},
    {"": ["relu"]},
    [],
], ids=["category", "short", "not-str", "long", "not-object", "not-map"])
def test_malformed_refusals_in_an_etrecord_are_a_format_error(bad):
    from etlab.errors import FormatError
    from tests.etrecord.conftest import compiled, read_entries, write_entries

    manifest, blob = read_entries(compiled("mlp", delegated=True).data)
    docs = [d for d in manifest["programs"] if "delegation_refusals" in d]
    assert docs and docs[0]["delegation_refusals"][""]  # the relus' reasons were recorded
    docs[0]["delegation_refusals"] = bad
    with pytest.raises(FormatError, match=r"delegation_refusals|delegation refusal"):
        parse_etrecord(write_entries(manifest, blob))
