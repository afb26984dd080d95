"""The data of MemoryTimeline, DelegationView, NumericGapView, ProfileView, the dashboard, the
offline HTML export, the report command and the reprs."""

from __future__ import annotations

import json
import re

import pytest

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
    # a rectangle spans [first step, last step + 1] x [offset, offset + size]
    assert list(bars[0].base) == df["offset"].tolist()
    assert list(bars[0].width) == (df["last_step"] - df["first_step"] + 1).tolist()
    assert all(t in txt for t, txt in zip(df["tensor"], bars[0].hovertext))
    assert all("op: " in txt for txt in bars[0].hovertext)
    names = {t.name for t in view.figure.data if t.type == "scatter"}
    assert names == {"live bytes", "lower bound", "arena size"}
    bound = next(t for t in view.figure.data if t.name == "lower bound")
    arena = next(t for t in view.figure.data if t.name == "arena size")
    assert bound.y[0] == plan.lower_bounds[1] and arena.y[0] == plan.buffer_sizes[1]
    live = next(t for t in view.figure.data if t.name == "live bytes")
    assert max(live.y) == plan.lower_bounds[1]
    summary = view.summary()
    assert summary.loc[0, "tensors"] == len(df) and summary.loc[0, "arena_bytes"] == plan.buffer_sizes[1]


def test_delegation_view_rows_point_at_graph_nodes(mlp_run):
    view = DelegationView(mlp_run.manager)
    assert view.summary_rows == [{"backend": "DemoBackend", "subgraphs": 3, "delegated_nodes": 6}]
    rows = {r["op_type"]: r for r in view.table.rows}
    assert rows["addmm_default"]["delegated"] == 3 and rows["relu"]["non_delegated"] == 2
    assert rows["relu"]["focus"] == {"name": "relu", "kind": "edge"}
    view.table.clicked = {"index": 0, "row": rows["relu"]}  # what a click in the browser sends
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


def test_profile_view(mlp_inspector):
    view = ProfileView(mlp_inspector)
    names = [r["name"] for r in view.table.rows]
    assert names.count("native_call_relu.out") == 2
    assert "DemoBackend #0" in names  # delegate-internal events named by backend and id
    sun = view.rollup_figure.data[0]
    total = sun.values[list(sun.ids).index("model")]
    fc1 = sun.values[list(sun.ids).index("model/fc1")]
    assert 0 < fc1 < total
    # timeline: one bar trace per run, DELEGATE_CALLs not drawn twice
    assert len(view.timeline_figure.data) == 3
    assert all("DELEGATE_CALL" not in t for t in view.timeline_figure.data[0].hovertext)


def test_dashboard_and_offline_report(mlp_run, mlp_inspector, tmp_path):
    dash = show(mlp_inspector, mlp_run.manager)
    assert list(dash.views) == ["summary", "graph", "memory", "delegation", "gap", "profile"]
    assert dash.missing == {}
    assert [m.kind for m in dash.views["graph"].models] == ["aten", "edge", "runtime"]
    dash.views["profile"].table.clicked = {"index": 0, "row": dash.views["profile"].table.rows[2]}
    assert dash.selected_index == 1  # a row click opens the graph tab
    path = dash.save_html(tmp_path / "report.html")
    text = path.read_text()
    assert not re.search(r"""<script[^>]+src=|<link[^>]+href=["']?http""", text)  # all inline
    assert text.count('data-etlab-view="memory"') == 1 and "ELK_SOURCE" in text


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
