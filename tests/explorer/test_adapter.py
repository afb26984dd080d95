"""etlab's Model Explorer adapter: every zoo model's .pte and .etrecord (XNNPACK-lowered by etlab) become
graphs Model Explorer's own classes accept, overlays keyed to existing node ids with the values the
views show, and `etlab export-me` through the command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.inspector import Inspector
from etlab.model_explorer import (
    export,
    graph_id,
    load_graphs,
    main,  # Model Explorer is installed by make setup; missing, this fails
    me_graphs,
)
from etlab.models import METHOD_INPUTS, ZOO, export_zoo
from etlab.runtime import Runtime

ETLAB = str(Path(sys.executable).with_name("etlab"))  # the console script the README tells users to run


def check_graph(g: dict) -> None:
    """Ids unique, every edge's source a node of the graph, namespaces without empty segments."""
    ids = [n["id"] for n in g["nodes"]]
    assert len(ids) == len(set(ids)), g["id"]
    known = set(ids)
    for n in g["nodes"]:
        for e in n["incomingEdges"]:
            assert e["sourceNodeId"] in known, (g["id"], n["id"], e)
        assert "" not in n["namespace"].split("/") or n["namespace"] == "", n["namespace"]
        for m in n["outputsMetadata"]:
            assert [a["key"] for a in m["attrs"]] == ["tensor_shape"]


def served(path) -> dict:
    """What Model Explorer's server sends the page for `path`: the adapter's `convert` answer encoded as
    its server encodes it (`convert_adapter_response`: dataclasses.asdict, then JSON)."""
    from model_explorer.utils import convert_adapter_response

    return json.loads(json.dumps(convert_adapter_response(main.EtlabAdapter().convert(str(path), {}))))


def connected(g: dict) -> int:
    parent = {n["id"]: n["id"] for n in g["nodes"]}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in g["nodes"]:
        for e in n["incomingEdges"]:
            parent[find(n["id"])] = find(e["sourceNodeId"])
    return len({find(x) for x in parent})


def check_xnnpack_layers(graphs: list[dict], pte_path) -> None:
    """Each XNNPACK call of the .pte is a layer holding the call and one node per payload node, in order;
    the payload's nodes read only the call or each other; what reads the call's results reads them."""
    from etlab.schema import load_pte
    from etlab.schema.program import DelegateCall
    from etlab.schema.xnnpack import deserialize_xnnpack, node_kind

    pte = load_pte(pte_path)
    for plan in pte.program.execution_plan:
        g = next(g for g in graphs if g["id"] == f"{plan.name} (instructions)")
        for step, ins in enumerate(plan.chains[0].instructions):
            if not isinstance(ins.instr_args, DelegateCall):
                continue
            delegate = plan.delegates[ins.instr_args.delegate_index]
            xnodes = deserialize_xnnpack(pte.delegate_bytes(delegate)).graph.xnodes
            layer = f"XnnpackBackend · instruction {step}"  # sections of a large payload sit below it
            inside = [n for n in g["nodes"] if layer in n["namespace"].split("/")]
            call = [n for n in inside if n["label"] == "XnnpackBackend call"]
            assert len(call) == 1 and [n["label"] for n in inside if n is not call[0]] == \
                [node_kind(x) for x in xnodes], (plan.name, step)
            ids = {n["id"] for n in inside}
            for n in inside:
                if n is not call[0]:
                    assert {e["sourceNodeId"] for e in n["incomingEdges"]} <= ids
            outside_readers = [n for n in g["nodes"] if n["id"] not in ids
                               and any(e["sourceNodeId"] in ids for e in n["incomingEdges"])]
            assert all(call[0]["id"] not in {e["sourceNodeId"] for e in n["incomingEdges"]} for n in outside_readers)


@pytest.fixture(scope="module", params=sorted(ZOO))
def zoo_files(request, tmp_path_factory):
    name = request.param
    edge = to_edge_transform_and_lower(export_zoo(name), partitioner=[XnnpackPartitioner()], generate_etrecord=True)
    et = edge.to_executorch()
    d = tmp_path_factory.mktemp(f"me-{name}")
    et.write_to_file(d / "model.pte")
    et.get_etrecord().save(d / "model.etrecord")
    return name, d, et


def test_zoo_files_convert_to_model_explorer_graphs(zoo_files):
    name, d, et = zoo_files
    for path in (d / "model.pte", d / "model.etrecord"):
        response = me_graphs(path)
        graphs = main.checked_graph_classes(response)  # Model Explorer's own dataclasses, strict
        assert len(graphs) == len(response["graphs"]) > 0
        assert main.checked_graph_classes(served(path)) == graphs  # what the page receives: the same graphs
        for g in response["graphs"]:
            check_graph(g)
        if path.suffix == ".pte":
            assert {g["id"] for g in response["graphs"]} == {f"{m} (instructions)" for m in et.methods}
            if name != "cond":  # a .pte method's instructions are one piece (the Lab's data-flow rule)
                assert all(connected(g) == 1 for g in response["graphs"]), name
            check_xnnpack_layers(response["graphs"], d / "model.pte")
        else:
            kinds = {g["id"].rsplit("(", 1)[1].rstrip(")") for g in response["graphs"]}
            assert {"ATen", "Edge"} <= kinds, (name, kinds)


def test_partitions_are_layers_named_by_backend(zoo_files):
    name, d, _ = zoo_files
    edge = next(g for g in me_graphs(d / "model.etrecord")["graphs"] if g["id"].endswith("(Edge)"))
    layers = {n["namespace"] for n in edge["nodes"] if "XnnpackBackend" in n["namespace"]}
    if name in ("cond",):
        return
    assert layers, f"{name}: no XNNPACK partition layer"
    for space in layers:  # the partition layer, or its section holding this node (large partitions)
        parts = space.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]
        owner = next(p for p in prefixes if "XnnpackBackend" in p.rsplit("/", 1)[-1])
        assert edge["groupNodeAttributes"][owner]["backend"] == "XnnpackBackend"
        assert any(c["namespaceRegex"].startswith("^") for c in edge["groupNodeConfigs"])


def test_a_node_left_out_carries_the_explainers_reason(tmp_path):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + torch.cumsum(x, 0)  # cumsum: no XNNPACK node

    ep = torch.export.export(M(), (torch.randn(4, 4),))
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()], generate_etrecord=True)
    et = edge.to_executorch()
    et.get_etrecord().save(tmp_path / "m.etrecord")
    g = next(g for g in me_graphs(tmp_path / "m.etrecord")["graphs"] if g["id"].endswith("(Edge)"))
    cumsum = [n for n in g["nodes"] if n["label"] == "cumsum"]
    assert len(cumsum) == 1
    attrs = {a["key"]: a["value"] for a in cumsum[0]["attrs"]}
    assert attrs["delegation"].startswith("left out (operator)"), attrs
    assert "cumsum" in attrs["op"]


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("me-run")
    model, inputs = ZOO["cnn"]()
    ep = torch.export.export(model, inputs)
    et = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()], generate_etrecord=True).to_executorch()
    et.write_to_file(d / "model.pte")
    et.get_etrecord().save(d / "model.etrecord")
    program = Runtime.get().load_program(d / "model.pte", enable_etdump=True, debug_buffer_size=1 << 22)
    method = program.load_method("forward")
    for _ in range(3):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(d / "run.etdp", d / "run.bin")
    return d


def test_overlays_are_keyed_to_graph_nodes_and_equal_the_views(cnn_run, tmp_path):
    d = cnn_run
    ins = Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord", debug_buffer_path=d / "run.bin")
    written = export(ins, tmp_path)
    graphs = {g["id"]: g for g in json.loads(written["graphs"].read_text())["graphs"]}
    assert {"latency_p50", "latency_p90", "run_share", "output_bytes"} <= set(written)
    for key in ("latency_p50", "latency_p90", "run_share", "output_bytes"):
        data = json.loads(written[key].read_text())
        for gid, gd in data.items():
            ids = {n["id"] for n in graphs[gid]["nodes"]}
            assert set(gd["results"]) <= ids, (key, gid)
            assert all(math.isfinite(r["value"]) for r in gd["results"].values())
    # the values are the annotated models' (what GraphView shows), and a delegate's nodes sum to its call
    models = {graph_id(m): m for m, _ in load_graphs(ins)}
    p50 = json.loads(written["latency_p50"].read_text())
    for gid, gd in p50.items():
        m = models[gid]
        for nid, r in gd["results"].items():
            assert r["value"] == pytest.approx(m.nodes[int(nid)].latency["p50"])
    df = ins.to_dataframe()
    calls = df[df.event_name == "DELEGATE_CALL"]
    edge = p50["forward (Edge)"]["results"]
    partition_nodes = [n for n in graphs["forward (Edge)"]["nodes"] if "XnnpackBackend" in n["namespace"]]
    assert sum(edge[n["id"]]["value"] for n in partition_nodes if n["id"] in edge) == \
        pytest.approx(sum(calls["p50 (ms)"]), rel=1e-6)
    share = json.loads(written["run_share"].read_text())["forward (Edge)"]["results"]
    assert sum(r["value"] for r in share.values()) == pytest.approx(100.0)
    (tmp_path / "method").mkdir()
    by_method = ins.to_model_explorer(tmp_path / "method")  # the Inspector's own spelling writes the same files
    assert set(by_method) == set(written)
    assert json.loads(by_method["latency_p50"].read_text()) == p50


def test_the_collector_stays_paused_until_model_explorer_drops_the_answer(cnn_run, monkeypatch):
    import gc

    from model_explorer.utils import convert_adapter_response

    from etlab.errors import FormatError

    assert gc.isenabled()
    answer = main.EtlabAdapter().convert(str(cnn_run / "model.etrecord"), {})
    assert not gc.isenabled()  # Model Explorer's server encodes the answer next, then drops it
    encoded = convert_adapter_response(answer)
    assert not gc.isenabled()
    del answer
    assert gc.isenabled()
    assert main.checked_graph_classes(json.loads(json.dumps(encoded)))

    def broken():
        raise FormatError("bad file")

    with pytest.raises(FormatError):
        main.collector_paused_until_freed(broken)
    assert gc.isenabled()  # resumed when convert raised
    assert main.collector_paused_until_freed(list) == [] and gc.isenabled()  # nothing to wait for
    monkeypatch.setattr(main, "RESUME_AFTER_S", 3.0)
    held = main.EtlabAdapter().convert(str(cnn_run / "model.etrecord"), {})
    assert not gc.isenabled()
    for _ in range(600):  # an answer held (a cache, a notebook): resumed after RESUME_AFTER_S anyway
        if gc.isenabled():
            break
        time.sleep(0.1)
    assert gc.isenabled() and held
    del held
    gc.disable()  # off already: the caller owns it, left off after the answer is gone
    try:
        answer = main.EtlabAdapter().convert(str(cnn_run / "model.pte"), {})
        del answer
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_export_me_through_the_command_line(cnn_run, tmp_path):
    d = cnn_run
    out = tmp_path / "me"
    nofolder = subprocess.run([ETLAB, "export-me", str(d / "model.etrecord"), "-o", str(out)], capture_output=True,
                              text=True, timeout=600)
    assert nofolder.returncode == 2 and "no such folder" in nofolder.stderr and not out.exists()
    out.mkdir()
    cmd = [ETLAB, "export-me", str(d / "run.etdp"), "--etrecord", str(d / "model.etrecord"),
           "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (out / "graphs.json").is_file() and (out / "latency_p50.json").is_file()
    # the command one argument a line (shell continuations), within 120 columns
    assert (f"open with:\n  model-explorer \\\n      {out / 'graphs.json'} \\\n"
            f"      --node_data_paths={out / 'latency_p50.json'}\n") in r.stdout, r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 120, r.stdout
    bad = subprocess.run([ETLAB, "export-me", str(d / "run.etdp"), "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--etrecord" in bad.stderr and "Traceback" not in bad.stderr
    missing = subprocess.run([ETLAB, "export-me", str(tmp_path / "nope.etrecord"), "-o",
                              str(tmp_path / "x" / "y")], capture_output=True, text=True, timeout=600)
    assert missing.returncode == 2 and "nope.etrecord: no such file" in missing.stderr


def test_other_files_are_refused_with_the_file_named(tmp_path):
    from etlab.errors import FormatError

    p = tmp_path / "model.onnx"
    p.write_bytes(b"\0" * 16)
    with pytest.raises(FormatError, match=r"model\.onnx"):
        me_graphs(p)
    bad = tmp_path / "broken.pte"
    bad.write_bytes(b"not a program")
    with pytest.raises(FormatError, match=r"broken\.pte"):
        me_graphs(bad)


def test_multi_method_records_give_a_graph_per_method(tmp_path):
    assert "make_two_methods" in METHOD_INPUTS
    edge = to_edge_transform_and_lower(export_zoo("two_methods"), partitioner=[XnnpackPartitioner()],
                                       generate_etrecord=True)
    et = edge.to_executorch()
    et.get_etrecord().save(tmp_path / "m.etrecord")
    ids = {g["id"] for g in me_graphs(tmp_path / "m.etrecord")["graphs"]}
    assert {"forward (Edge)", "encode (Edge)"} <= ids, ids


def test_quantization_overlays_on_the_float_graph(cnn_run, tmp_path):
    pytest.importorskip("torchao")
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    from etlab.devtools import quantization_report
    from etlab.devtools._quant_debug import float_graph_of
    from etlab.devtools._quant_debug_fix import quantize_pt2e

    model, inputs = ZOO["cnn"]()
    float_gm = float_graph_of(model, inputs)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    report = quantization_report(model, quantize_pt2e(float_gm, quantizer, [inputs]), inputs)
    d = cnn_run
    ins = Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord")
    written = export(ins, tmp_path, quant_report=report)
    graphs = {g["id"]: g for g in json.loads(written["graphs"].read_text())["graphs"]}
    float_graph = graphs["quantization (ATen)"]
    local = json.loads(written["quant_local_sqnr"].read_text())["quantization (ATen)"]
    label_of = {n["id"]: n["label"] for n in float_graph["nodes"]}
    rows = report.layers.set_index("layer")
    names = {n["id"]: next(a["value"] for a in n["attrs"] if a["key"] == "name") for n in float_graph["nodes"]}
    assert any(label_of[i] == "conv2d" for i in local["results"])
    for nid, r in local["results"].items():
        name = names[nid]
        if name in rows.index:
            assert r["value"] == pytest.approx(rows.loc[name, "local_sqnr"])
    assert {"quant_sqnr", "quant_input_sqnr"} <= set(written)


def test_show_serves_model_explorer_on_loopback_and_stops(cnn_run):
    import urllib.request

    from etlab.model_explorer import show

    d = cnn_run
    ins = Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord")
    session = ins.show(engine="model-explorer", overlay="latency_p90", height=500)  # the documented call
    try:
        assert session.url.startswith("http://127.0.0.1:")
        assert "latency_p90.json" in urllib.parse.unquote(session.url)
        with urllib.request.urlopen(session.url.split("?")[0], timeout=60) as r:
            assert r.status == 200 and b"Model Explorer" in r.read()
        html = session._repr_html_()
        assert "<iframe" in html and 'height:500px' in html
        workdir = session.workdir
        assert (workdir / "graphs.json").is_file()
    finally:
        session.stop()
    assert session.process.poll() is not None and not workdir.exists()
    with pytest.raises(ValueError, match="overlay must be one of"):
        show(ins, overlay="nope")
    with pytest.raises(ValueError, match="unknown engine 'netron'"):
        ins.show(engine="netron")


def layer_children(g: dict) -> dict[str, set]:
    """Layer path -> its direct children (sub-layer paths and op node ids), as Model Explorer nests them."""
    kids: dict[str, set] = {}
    for n in g["nodes"]:
        space = n["namespace"]
        kids.setdefault(space, set()).add(n["id"])
        while space:
            parent = space.rsplit("/", 1)[0] if "/" in space else ""
            kids.setdefault(parent, set()).add(space)
            space = parent
    return kids


def test_long_chains_are_split_into_sections_model_explorer_can_lay_out(tmp_path):
    # 260 sibling modules (a long nn.Sequential): Model Explorer's own layout overflows its stack on such
    # chains, so the adapter splits every layer past SECTION_SIZE children into sections
    from etlab.compiler import to_edge
    from etlab.model_explorer._graphs import SECTION_SIZE, sectioned

    model = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(260)])
    et = to_edge(torch.export.export(model, (torch.randn(2, 3),)), generate_etrecord=True).to_executorch()
    et.get_etrecord().save(tmp_path / "chain.etrecord")
    g = me_graphs(tmp_path / "chain.etrecord", kinds=["edge"])["graphs"][0]
    check_graph(g)
    assert len(g["nodes"]) == 262 and connected(g) == 1
    kids = layer_children(g)
    assert max(len(k) for k in kids.values()) <= SECTION_SIZE
    assert len(kids[""]) == 3  # the top level: three sections of consecutive children
    assert sum(s.startswith(("input_1 .. ", "x .. ")) for s in kids[""]) == 1  # named by first and last child
    # the same chain's .pte: 260 instructions all named "relu", still sections of at most SECTION_SIZE
    (tmp_path / "chain.pte").write_bytes(et.buffer)
    p = me_graphs(tmp_path / "chain.pte")["graphs"][0]
    check_graph(p)
    assert max(len(k) for k in layer_children(p).values()) <= SECTION_SIZE
    # a module keeps its own path below its section, and its attributes follow it
    relu_7 = next(n for n in g["nodes"] if n["namespace"].endswith("/7 (ReLU)"))
    assert relu_7["namespace"].count("/") == 1
    assert relu_7["namespace"] in g["groupNodeAttributes"]
    # pure function: op nodes of a flat layer are sectioned by graph order, small layers are untouched
    spaces, _ = sectioned([""] * 250, [f"op{i}" for i in range(250)], size=100)
    assert spaces[0] == spaces[99] == "op0 .. op99" and spaces[100] == "op100 .. op199"
    assert spaces[249] == "op200 .. op249"
    # sections whose first and last names repeat (a .pte's instructions are named by their op) stay apart:
    # Model Explorer groups by namespace, so equal names would merge them into one layer of every such node
    ops = ["addmm", "relu"] * 150
    spaces, _ = sectioned([""] * 300, ops, size=100)
    assert len(set(spaces)) == 3 and [spaces.count(s) for s in dict.fromkeys(spaces)] == [100, 100, 100]
    assert spaces[0] == "addmm .. relu" and spaces[100] == "addmm .. relu [2]"
    small = sectioned(["a", "a/b", "c"], ["p", "q", "r"], size=100)
    assert small == (["a", "a/b", "c"], {"": "", "a": "a", "a/b": "a/b", "c": "c"})
