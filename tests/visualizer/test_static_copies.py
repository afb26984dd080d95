"""What a saved notebook shows once its kernel is gone: each chart as an SVG drawn from its figure (not a
caption), and each graph with its overlay's colors (the browser's scale: log, a ratio split at 1)."""

from __future__ import annotations

import re

import plotly.graph_objects as go

from etlab.visualizer import GraphView, PlotView
from etlab.visualizer._figure_svg import figure_svg

FILL = re.compile(r'<g><title>([^<]*?): [^<]*</title><rect [^>]*rx="4" fill="(rgb\([^)]*\))"')  # node name, fill


def _bars(svg: str) -> list[tuple[float, float, float, float]]:
    """(x, y, width, height) of the bars."""
    num = "([-0-9.]+)"
    pattern = f'<rect class="bar" x="{num}" y="{num}" width="{num}" height="{num}" fill="#'
    return [tuple(float(v) for v in m.groups()) for m in re.finditer(pattern, svg)]


def test_grouped_bars_are_drawn_to_scale():
    fig = go.Figure([go.Bar(x=["a", "b", "c"], y=[1.0, 2.0, 4.0], name="A", marker={"color": "#4c78a8"}),
                     go.Bar(x=["a", "b", "c"], y=[2.0, 2.0, 1.0], name="B", marker={"color": "#f58518"})])
    fig.update_layout(title="latency per row")
    svg = figure_svg(fig)
    assert svg.startswith("<svg") and 'data-role="chart-image"' in svg and "latency per row" in svg
    bars = _bars(svg)
    assert len(bars) == 6
    heights = [h for _, _, _, h in bars]
    assert heights[2] == max(heights) and abs(heights[1] - 2 * heights[0]) < 0.2  # 4 is the tallest, 2 = 2 × 1
    assert svg.count("#4c78a8") >= 4 and ">A</text>" in svg and ">B</text>" in svg  # colors and the legend


def test_horizontal_bars_start_at_their_base():
    """A timeline: each span a horizontal bar from its start (base) to its end."""
    fig = go.Figure([go.Bar(orientation="h", y=["run 0", "run 0", "run 1"], x=[2.0, 3.0, 5.0], base=[0.0, 2.0, 0.0])])
    fig.update_layout(barmode="overlay")
    bars = _bars(figure_svg(fig))
    assert len(bars) == 3
    (x0, _, w0, _), (x1, _, w1, _), (_, _, w2, _) = bars
    assert abs(x1 - (x0 + w0)) < 0.2 and abs(w0 + w1 - w2) < 0.3  # the second span starts where the first ends


def test_lines_and_a_log_axis():
    fig = go.Figure([go.Scatter(x=[1, 2, 3], y=[1e-6, 1e-3, 1.0], mode="lines+markers", name="gap")])
    fig.update_yaxes(type="log")
    svg = figure_svg(fig)
    ys = [float(v) for v in re.findall(r'<circle cx="[-0-9.]+" cy="([-0-9.]+)"', svg)]
    assert len(ys) == 3 and "<path d=" in svg
    assert abs((ys[0] - ys[1]) - (ys[1] - ys[2])) < 0.5  # equal decades are equal steps


def test_a_figure_with_nothing_drawable_keeps_its_caption():
    fig = go.Figure([go.Treemap(labels=["a", "b"], parents=["", "a"], values=[1, 1])])
    fig.update_layout(title="time by module")
    assert figure_svg(fig) == "<p><i>chart: time by module (treemap)</i></p>"


def test_plot_view_static_copy_is_the_chart():
    fig = go.Figure([go.Bar(x=["a"], y=[1.0])])
    assert 'data-role="chart-image"' in PlotView(fig).static_html()


def test_static_graph_keeps_its_latency_colors(mlp_run, mlp_inspector):
    view = GraphView(mlp_run.manager, "edge", inspector=mlp_inspector, overlay="latency")
    timed = [n for n in view.model.nodes if n.latency]
    fills = dict(FILL.findall(view.static_html()))
    assert timed and set(fills) == {n.name for n in timed} and len(set(fills.values())) > 1  # the ramp
    plain = GraphView(mlp_run.manager, "edge", inspector=mlp_inspector)  # no overlay: kind pastels only
    assert FILL.findall(plain.static_html()) == []


def test_static_ratio_graph_splits_at_one(mlp_inspector):
    from etlab.visualizer import CompareView

    c = mlp_inspector.compare(mlp_inspector)
    view = CompareView(c)
    model = view.models[0]
    drawn = [n for n in model.nodes if n.latency]
    assert drawn
    for n, ratio in ((drawn[0], 0.5), (drawn[-1], 2.0)):  # one faster, one slower
        n.latency = {**n.latency, "p50": ratio}
    fills = dict(FILL.findall(view.graph.static_html()))
    r_fast, _, b_fast = (int(v) for v in fills[drawn[0].name][4:-1].split(","))
    r_slow, _, b_slow = (int(v) for v in fills[drawn[-1].name][4:-1].split(","))
    assert b_fast > r_fast and r_slow > b_slow
