"""The data of MemoryTimeline, DelegationView, NumericGapView, ProfileView, the dashboard, the
offline HTML export, the report command and the reprs."""

from __future__ import annotations

import json
import re

import pytest

from etlab.inspector import execute_timings, op_timings, timings_counted_once
from etlab.visualizer import (
    DelegationView,
    MemoryTimeline,
    NumericGapView,
    ProfileView,
    event_block_html,
    inspector_html,
    report_main,
    repr_mimebundle,
    show,
)


def test_memory_timeline_has_one_rectangle_per_planned_tensor(mlp_run):
    view = MemoryTimeline(mlp_run.manager)
    df = view.data
    plan = mlp_run.manager.memory_plans["forward"]
    bars = [t for t in view.figure.data if t.type == "bar"]
    assert len(bars) == 1 and len(bars[0].x) == len(df) == view.num_tensors > 0
    # a rectangle spans [first instruction, last instruction + 1] x [offset, offset + size]
    assert list(bars[0].base) == df["offset"].tolist()
    assert list(bars[0].width) == (df["last_step"] - df["first_step"] + 1).tolist()
    assert all(t in txt for t, txt in zip(df["tensor"], bars[0].hovertext))
    assert all("op: " in txt and "last read by " in txt for txt in bars[0].hovertext)
    # the x axis is the method's instructions: the first tensor starts at 0, the last ends at the end
    steps = df.attrs["num_steps"]
    assert steps == len(df.attrs["instructions"]) == 5  # 3 delegate calls + 2 relu
    assert min(bars[0].x - bars[0].width / 2) == 0 and max(bars[0].x + bars[0].width / 2) == steps
    relu = df[df["producing_op"] == "aten.relu.out"].iloc[0]
    assert f"written by {relu.first_step}: {relu.tensor} (aten.relu.out)" in bars[0].hovertext[relu.name]
    names = {t.name for t in view.figure.data if t.type == "scatter"}
    assert names == {"live bytes", "lower bound", "arena size"}
    bound = next(t for t in view.figure.data if t.name == "lower bound")
    arena = next(t for t in view.figure.data if t.name == "arena size")
    assert bound.y[0] == plan.lower_bounds[1] and arena.y[0] == plan.buffer_sizes[1]
    live = next(t for t in view.figure.data if t.name == "live bytes")
    assert max(live.y) == plan.lower_bounds[1] and max(live.x) == steps
    assert "instruction 1: relu (aten.relu.out)" in live.hovertext[2]
    summary = view.summary()
    assert summary.loc[0, "tensors"] == len(df) and summary.loc[0, "arena_bytes"] == plan.buffer_sizes[1]


def test_delegation_view_rows_point_at_graph_nodes(mlp_run):
    view = DelegationView(mlp_run.manager)
    assert view.summary_rows == [{"backend": "DemoBackend", "subgraphs": 3, "delegated_nodes": 6}]
    # upstream's columns and operator types; getitem (3 outputs of delegate calls) listed apart
    assert [c["label"] for c in view.table.columns] == ["op_type", "occurrences_in_delegated_graphs",
                                                  "occurrences_in_non_delegated_graphs"]
    rows = {r["op_type"]: r for r in view.table.rows}
    assert list(rows) == ["aten_addmm_default", "aten_permute_copy_default", "aten_relu_default", "Total"]
    assert rows["aten_addmm_default"]["delegated"] == 3 and rows["aten_relu_default"]["non_delegated"] == 2
    assert (rows["Total"]["delegated"], rows["Total"]["non_delegated"]) == (6, 2) and view.getitems == 3
    html = view.html_fragments()[1].body
    assert "6 of 8 operators delegated (75%)" in html and "3 <code>getitem</code> node(s)" in html
    assert rows["aten_relu_default"]["focus"] == {"name": "relu", "kind": "edge"}
    assert rows["aten_addmm_default"]["focus"] == {"name": "addmm_default", "kind": "edge"}  # inside a delegate
    view.table.clicked = {"index": 0, "row": rows["aten_relu_default"]}  # what a click in the browser sends
    assert view.graph.focus_target["name"] == "relu"


def test_numeric_gap_view(mlp_inspector):
    view = NumericGapView(mlp_inspector, threshold=1e-9)
    assert len(view.rows) == 5 and [r.order for r in view.rows] == list(range(5))
    assert view.figure.layout.yaxis.type == "log"
    assert all(r.gap >= 0 for r in view.rows)
    assert view.rows[1].aot_ops == ["relu"] and "zoo.py" in view.rows[1].source
    view.slider.value = 1e-3
    assert view.threshold == 1e-3 and view.above_threshold() == [r for r in view.rows if r.gap > 1e-3]
    assert view.graph is not None and view.graph.overlay == "gap"
    exact = sum(r.gap == 0 for r in view.rows)
    assert view.summary_text().startswith(f"5 matched intermediate outputs (MSE): {exact} exact (gap 0), "
                                          f"{len(view.above_threshold())} above the threshold 1.0e-03")
    assert "1.0e-03" in view.note.value
    # zero gaps sit on a floor labeled as such, not on a made-up small number
    axis = view.figure.layout.yaxis
    assert (axis.ticktext[0] == "0 (exact)") == (exact > 0)
    if exact:
        zeros = [y for r, y in zip(view.rows, view.figure.data[0].y) if r.gap == 0]
        assert set(zeros) == {axis.tickvals[0]}


def test_profile_view(mlp_inspector):
    view = ProfileView(mlp_inspector)
    names = [r["name"] for r in view.table.rows]
    assert names.count("native_call_relu.out") == 2
    # delegate-internal events the backend names "0" are named by backend, id and the ops they cover
    assert "DemoBackend #0: permute_copy, addmm" in names and "0" not in names
    tree = view.rollup_figure.data[0]
    assert tree.type == "treemap" and "p50" in view.rollup_figure.layout.title.text
    ids = list(tree.ids)
    total, fc1 = tree.values[ids.index("model")], tree.values[ids.index("model/fc1")]
    # the median, not the average: the fc1 box is its delegate call's p50 (the call, overhead included,
    # not also the backend's event inside it)
    (call,) = [t for t in view.timings if t.module == "fc1" and t.name == "DELEGATE_CALL"]
    assert any(t.module == "fc1" and t.is_delegated for t in view.timings)
    assert fc1 == pytest.approx(call.p50) and 0 < fc1 < total
    # leaves colored by op kind, delegated work in the backend's graph color; module boxes neutral
    colors = dict(zip(ids, tree.marker.colors))
    assert view.kind_colors == {"DemoBackend (delegated)": "#d62728", "relu": "#4c78a8"}
    leaves = [i for i in ids if "#" in i]
    assert {colors[i] for i in leaves} == {"#d62728", "#4c78a8"} and colors["model/fc1"] == colors["model"]
    # timeline: a bar trace per op kind (the legend), each with one bar per event and run
    runs = 3
    traces = {t.name: t for t in view.timeline_figure.data}
    assert list(traces) == list(view.kind_colors)
    assert len(traces["relu"].x) == 2 * runs and len(traces["DemoBackend (delegated)"].x) == 3 * runs
    hovers = [h for t in traces.values() for h in t.hovertext]
    assert sum("DELEGATE_CALL" in h for h in hovers) == 3 * runs and not any("DemoBackend #" in h for h in hovers)
    assert all(y.startswith(("run 0 · ", "run 1 · ", "run 2 · ")) for y in traces["relu"].y)


def test_dashboard_and_offline_report(mlp_run, mlp_inspector, tmp_path):
    dash = show(mlp_inspector, mlp_run.manager)
    assert list(dash.views) == ["summary", "graph", "memory", "delegation", "gap", "profile"]
    assert dash.missing == {}
    assert [m.kind for m in dash.views["graph"].models] == ["aten", "edge", "runtime"]
    assert dash.views["graph"].options["shown"] == ["aten", "edge"]  # the third pane one click away
    # summary: each delegate call counted once, as the call (not also the backend's event inside it)
    summary = dash.views["summary"].value
    timed = timings_counted_once(execute_timings(op_timings(mlp_inspector)))
    assert [t.name for t in timed].count("DELEGATE_CALL") == 3 and "DemoBackend #" not in summary
    assert f"sum of op p50: {sum(t.p50 for t in timed):.4g} ms" in summary
    dash.views["profile"].table.clicked = {"index": 0, "row": dash.views["profile"].table.rows[2]}
    assert dash.selected_index == 1  # a row click opens the graph tab
    path = dash.save_html(tmp_path / "report.html")
    text = path.read_text()
    assert not re.search(r"""<script[^>]+src=|<link[^>]+href=["']?http""", text)  # all inline
    assert text.count('data-etlab-view="memory"') == 1 and "composeLayout" in text and "ELK" not in text


def test_each_view_saves_standalone_html(mlp_run, mlp_inspector, tmp_path):
    for name, view in {"memory": MemoryTimeline(mlp_run.manager), "delegation": DelegationView(mlp_run.manager),
                       "gap": NumericGapView(mlp_inspector, show_graph=False),
                       "profile": ProfileView(mlp_inspector)}.items():
        text = view.save_html(tmp_path / f"{name}.html").read_text()
        assert text.startswith("<!DOCTYPE html>") and ("Plotly" in text) == (name != "delegation"), name


def test_report_command(mlp_run, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert report_main(["--etdump", str(mlp_run.etdump), "-o", str(out)]) == 0
    assert out.exists() and str(out) in capsys.readouterr().out
    assert report_main(["--etdump", str(tmp_path / "missing.etdp"), "-o", str(out)]) == 2
    assert "error" in capsys.readouterr().err


def test_reprs(mlp_inspector, mlp_run):
    from etlab.devtools._delegation_info import get_delegation_info

    html = inspector_html(mlp_inspector)
    assert "Execute" in html and "native_call_relu.out" in html
    block = mlp_inspector.event_blocks[-1]
    assert "EventBlock" in event_block_html(block)
    bundle = repr_mimebundle(get_delegation_info(mlp_run.manager.exported_program()))
    assert "DemoBackend" in bundle["text/html"] and bundle["text/plain"]
    with pytest.raises(TypeError):
        repr_mimebundle(object())
    json.dumps(bundle)


def test_rich_reprs_and_show_are_wired(mlp_inspector, mlp_run):
    """Notebooks render the Inspector, an EventBlock and delegation info as HTML, and
    inspector.show() is the dashboard."""
    from etlab.devtools import get_delegation_info
    from etlab.visualizer import Dashboard

    assert "<table" in mlp_inspector._repr_html_()
    assert "<table" in mlp_inspector.event_blocks[-1]._repr_html_()
    info = get_delegation_info(mlp_run.manager.exported_program().graph_module)
    assert "delegated" in info._repr_html_()
    assert isinstance(mlp_inspector.show(mlp_run.manager), Dashboard)


def test_dashboard_says_on_its_first_tab_why_a_tab_is_missing(mlp_inspector, tmp_path):
    """Without the program manager there is no Memory tab; the Summary tab says why and what to pass."""
    dash = show(mlp_inspector)
    assert "memory" not in dash.views and "memory" in dash.missing
    summary = dash.views["summary"].value
    assert "data-role='missing-tabs'" in summary and "Memory" in summary and "inspector.show(et)" in summary
    page = dash.page()
    assert "inspector.show(et)" in page


def test_every_view_carries_a_static_html_copy(mlp_run, mlp_inspector):
    """Saved notebooks, nbconvert and front ends without the widget manager show the text/html copy:
    the message saying what is missing, the tables and what the graphs hold."""
    def data(bundle):
        return bundle[0] if isinstance(bundle, tuple) else bundle

    dash = show(mlp_inspector, mlp_run.manager)
    bundle = data(dash._repr_mimebundle_())
    assert "application/vnd.jupyter.widget-view+json" in bundle
    static = bundle["text/html"]
    assert "data-role='widget-fallback'" in static and "pip install anywidget ipywidgets" in static
    assert "native_call_relu.out" in static  # the profile table's rows
    assert "relu" in static and "nodes" in static  # the graph's summary
    for name in ("graph", "delegation", "gap", "profile", "memory"):
        view_bundle = data(dash.views[name]._repr_mimebundle_())
        assert "widget-fallback" in view_bundle["text/html"], name
    table = dash.views["profile"].table
    assert table.static_html().count("<tr>") == len(table.rows) + 1


def test_numeric_gap_view_reports_ops_whose_outputs_were_not_kept(mlp_inspector, tmp_path):
    """A debug buffer too small for the run drops intermediates; the view names the ops it could not
    compare instead of leaving them out silently."""
    import warnings

    import torch

    from etlab.compiler import to_edge
    from etlab.inspector import Inspector, ops_without_outputs
    from etlab.models import make_mlp
    from etlab.runtime import Runtime

    assert ops_without_outputs(mlp_inspector) == []  # 1 MiB was enough for the MLP
    model, inputs = make_mlp()
    manager = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    manager.write_to_file(tmp_path / "m.pte")
    program = Runtime.get().load_program(tmp_path / "m.pte", enable_etdump=True, debug_buffer_size=2048)
    program.load_method("forward").execute(list(inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runtime warns that events were dropped
        program.write_etdump_result_to_file(tmp_path / "run.etdp", tmp_path / "run.bin")
    record = manager.get_etrecord()
    record.update_representative_inputs(list(inputs))
    small = Inspector(etdump_path=tmp_path / "run.etdp", debug_buffer_path=tmp_path / "run.bin", etrecord=record)
    missing = ops_without_outputs(small)
    assert missing, "2 KiB cannot hold the MLP's intermediates"
    view = NumericGapView(small, show_graph=False)
    assert f"{len(missing)} ops ran without a recorded output" in view.summary_text()
    assert "debug_buffer_size" in view.summary_text()
    # the count is in the view's output and on the dashboard's first tab, with the hint
    # the count the ETDump carries (values dropped at run time), else the ops without an output
    assert small.dropped_debug_values > 0 and view.dropped == small.dropped_debug_values
    assert f"data-count='{small.dropped_debug_values}'" in view.note.value and "Hint" in view.note.value
    from etlab.visualizer import show

    dash = show(small)
    assert "data-role='dropped-intermediates'" in dash.views["summary"].value
    assert NumericGapView(mlp_inspector, show_graph=False).dropped_html() == ""
