"""The adapter draws an ETRecord from its torch.export JSON (`etlab.etrecord.record_graphs`) without
rebuilding its programs: the graphs (node ids, layers, labels, attributes, edges, partitions, the
explainer's reasons) are exactly the ones the views' builder draws from the rebuilt programs, for
every zoo model, portable and XNNPACK-lowered, in etlab's layout and upstream's, and for upstream's
own files; so overlays keyed to the Inspector's graphs land on the same ids. Malformed JSON is a
FormatError naming the file and what is wrong."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import pytest

from etlab.errors import FormatError
from etlab.etrecord import parse_etrecord, record_graphs
from etlab.model_explorer import main, me_graphs
from etlab.model_explorer._export import record_file_graphs, recorded_graphs, to_me_graph
from tests.explorer.test_adapter import served
from tests.interop.conftest import ref_python, upstream_artifacts  # noqa: F401  (upstream's files)
from tests.interop.test_upstream_xnnpack_views import xnnpack  # noqa: F401


def assert_same_graphs(path) -> None:
    new = record_file_graphs(path)
    old = recorded_graphs(parse_etrecord(path))
    assert [graph_id_of(m) for m, _ in new] == [graph_id_of(m) for m, _ in old]
    for (m_new, x_new), (m_old, x_old) in zip(new, old):
        assert m_new.nodes == m_old.nodes, (path, m_new.title)
        assert m_new.edges == m_old.edges and m_new.groups == m_old.groups, (path, m_new.title)
        assert m_new.backend_colors == m_old.backend_colors
        assert to_me_graph(m_new, x_new) == to_me_graph(m_old, x_old)


def graph_id_of(model) -> str:
    from etlab.model_explorer import graph_id

    return graph_id(model)


@pytest.fixture(scope="module", params=["xnnpack", "portable"])
def zoo_records(request, tmp_path_factory):
    """Every zoo model compiled by etlab, its record saved in etlab's layout and in upstream's."""
    from etlab.compiler import to_edge, to_edge_transform_and_lower
    from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    from etlab.models import ZOO, export_zoo

    d = tmp_path_factory.mktemp(f"records-{request.param}")
    paths = []
    for name in sorted(ZOO):
        ep = export_zoo(name)
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()], generate_etrecord=True) \
            if request.param == "xnnpack" else to_edge(ep, generate_etrecord=True)
        record = edge.to_executorch().get_etrecord()
        for layout in ("etlab", "upstream"):
            path = d / f"{name}-{layout}.etrecord"
            record.save(path, format=layout)
            paths.append(path)
    return paths


def test_zoo_records_draw_the_same_graphs_as_the_rebuilt_programs(zoo_records):
    for path in zoo_records:
        assert_same_graphs(path)
        response = me_graphs(path)
        # Model Explorer's classes, strictly, and the same graphs in what its server sends the page
        assert main.checked_graph_classes(served(path)) == main.checked_graph_classes(response)


def test_upstreams_files_draw_the_same_graphs(upstream_artifacts, xnnpack):  # noqa: F811
    for path in [*(d / "model.etrecord" for d in upstream_artifacts.values()), xnnpack / "model.etrecord"]:
        assert_same_graphs(path)
        main.checked_graph_classes(me_graphs(path))


def test_upstreams_xnnpack_partitions_from_json_are_the_marked_graphs(xnnpack):  # noqa: F811
    """Upstream's XNNPACK record keeps the edge graph before lowering: the nodes each delegate call took
    become its partition layer, from the debug-handle and delegate maps, as on the rebuilt graph. (The
    adapter still rebuilds this record: the explainer judges the nodes left out with etlab's rules.)"""
    from etlab.model_explorer._record_graphs import build_json_graph_model, partition_marks

    path = xnnpack / "model.etrecord"
    graphs = record_graphs(path)
    edge = graphs.edge("forward")
    marks = partition_marks(edge, graphs.debug_handle_map["forward"], graphs.delegate_map["forward"])
    assert marks
    mine = build_json_graph_model(edge, "edge", method="forward", partitions=marks)
    theirs = next(m for m, _ in recorded_graphs(parse_etrecord(path)) if m.kind == "edge")
    assert mine.nodes == theirs.nodes and mine.groups == theirs.groups and mine.edges == theirs.edges
    assert any(g.kind == "delegate" and g.backend == "XnnpackBackend" for g in mine.groups)


def test_drawing_a_record_neither_imports_torch_nor_rebuilds_a_program(zoo_records, tmp_path):
    path = next(p for p in zoo_records if p.name.startswith("cnn-etlab"))
    code = ("import sys, json; from etlab.etrecord import record_graphs; "
            f"g = record_graphs({str(path)!r}); e = g.edge('forward'); a = g.aten(); "
            "print(json.dumps([len(e.nodes), len(a.nodes), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    edge_nodes, aten_nodes, torch_loaded = json.loads(out.stdout)
    assert edge_nodes > 3 and aten_nodes > 3 and torch_loaded is False


def test_the_reader_mirrors_torch_fx_names_shapes_and_handles(zoo_records):
    path = next(p for p in zoo_records if p.name.startswith("mobilenet_v2-etlab"))
    ep = parse_etrecord(path).edge_program("forward")
    program = record_graphs(path).edge("forward")
    fx = [n for n in ep.graph.nodes if n.op != "get_attr"]
    assert [n.name for n in program.nodes] == [n.name for n in fx]
    for mine, theirs in zip(program.nodes, fx):
        assert mine.op == theirs.op
        assert mine.debug_handle == theirs.meta.get("debug_handle"), mine.name
        val = theirs.meta.get("val")
        if hasattr(val, "shape"):
            assert mine.val.dims == list(val.shape) and mine.val.dtype == str(val.dtype).removeprefix("torch.")


def test_dtype_table_is_torchs():
    import torch
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    from etlab.etrecord._program_json import DTYPES

    for enum, dtype in _SERIALIZE_TO_TORCH_DTYPE.items():
        if int(enum) in DTYPES:
            assert DTYPES[int(enum)] == (str(dtype).removeprefix("torch."), dtype.itemsize)
    assert {int(e) for e in _SERIALIZE_TO_TORCH_DTYPE if int(e)} <= set(DTYPES) | {0}
    assert torch.float32.itemsize == DTYPES[7][1]


def _tampered(path, tmp_path, change) -> str:
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(entries["etrecord.json"])
    change(manifest["programs"][manifest["edge_dialect_program"]["forward"]]["export"]["graph_module"]["graph"])
    entries["etrecord.json"] = json.dumps(manifest).encode()
    out = tmp_path / "bad.etrecord"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    out.write_bytes(buf.getvalue())
    return out


@pytest.mark.parametrize("change, message", [
    (lambda g: g.__setitem__("nodes", {"a": 1}), "graph nodes is not a list"),
    (lambda g: g["nodes"][0].__setitem__("target", "os.system"), "unknown operator 'os.system'"),
    (lambda g: g["nodes"][0].__setitem__("target", ["x"]), "node target is not a short string"),
    (lambda g: g["nodes"][0]["inputs"][0].__setitem__("arg", {"as_tensor": {"name": 7}}), "is not a name"),
    (lambda g: g["nodes"][0].__setitem__("metadata", {"nn_module_stack": "a,b"}), "is not key,path,type"),
    (lambda g: g["nodes"][0].__setitem__("metadata", {"stack_trace": 5}), "stack_trace is not a string"),
    (lambda g: next(iter(g["tensor_values"].values())).__setitem__("dtype", 99), "unknown dtype 99"),
    (lambda g: next(iter(g["tensor_values"].values())).__setitem__("sizes", [{"as_int": 1}] * 100),
     "more than 64"),
])
def test_malformed_program_json_is_a_format_error_naming_file_and_member(zoo_records, tmp_path, change, message):
    path = next(p for p in zoo_records if p.name.startswith("mlp-etlab"))
    bad = _tampered(path, tmp_path, change)
    with pytest.raises(FormatError, match=r"bad\.etrecord") as e:
        me_graphs(bad)
    assert message in str(e.value) and "program" in str(e.value)


def test_titles_and_colours_are_the_views():
    from etlab.model_explorer import _record_graphs
    from etlab.visualizer import _graph_model, _graph_view

    assert issubclass(_record_graphs._Builder, _graph_model.GraphModelBuilder)  # the views' colors and groups
    assert all(_graph_view.TITLES[k] == v for k, v in _record_graphs.TITLES.items())


def test_a_record_the_reader_does_not_mirror_is_rebuilt_and_drawn(zoo_records, monkeypatch):
    from etlab.etrecord import UnsupportedGraph
    from etlab.model_explorer import _export

    path = next(p for p in zoo_records if p.name.startswith("cnn-etlab"))
    expected = [to_me_graph(m, x) for m, x in record_file_graphs(path)]

    def refuse(*_args):
        raise UnsupportedGraph("a node without a result")

    monkeypatch.setattr(_export, "_json_graphs", refuse)
    assert [to_me_graph(m, x) for m, x in record_file_graphs(path)] == expected
