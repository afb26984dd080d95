"""DelegationView, NumericGapView and ProfileView: tables and plotly charts that click through to a GraphView."""

from __future__ import annotations

import math
import os

import ipywidgets as widgets
import plotly.graph_objects as go

from etlab.visualizer import _html
from etlab.visualizer._graph_model import build_graph_model
from etlab.visualizer._graph_view import GraphView
from etlab.visualizer._profile_data import OpTiming, execute_timings, leaf_timings, numeric_gaps, op_timings, time_unit
from etlab.visualizer._sources import resolve_sources
from etlab.visualizer._table import TableView


def _link_table_to_graph(table: TableView, graph: GraphView | None) -> None:
    if graph is None:
        return

    def on_click(change):
        focus = (change["new"] or {}).get("row", {}).get("focus")
        if focus:
            try:
                graph.focus(focus.get("name"), handles=focus.get("handles"), kind=focus.get("kind"))
            except KeyError:
                pass  # the row's op is not drawn in this graph

    table.observe(on_click, names="clicked")


def _fragments(title: str, parts: list) -> list[_html.Fragment]:
    frags = [_html.Fragment(body=f"<h2 style='font-size:15px'>{title}</h2>")]
    for p in parts:
        frags.append(p if isinstance(p, _html.Fragment) else p.html_fragment())
    return frags


# --- delegation ----------------------------------------------------------------------------------


class DelegationView(widgets.VBox):
    """How much of the program each backend took: a summary per backend, the operator table
    (delegated / not delegated occurrences) and the lowered graph; a row click selects the op in the graph."""

    def __init__(self, program, method: str = "forward", *, show_graph: bool = True, **kwargs):
        from etlab.devtools._delegation_info import get_delegation_info, op_type_of  # no public devtools API yet

        sources = resolve_sources(program, method)
        edge = sources.graph("edge")
        self.info = get_delegation_info(edge)
        self.graph = GraphView(edge, "edge", method=method) if show_graph else None
        first_node: dict[str, str] = {}  # op type -> the first edge node of it (what a row click selects)
        nodes = self.graph.model.nodes if self.graph else build_graph_model(edge, "edge", method=method).nodes
        for n in nodes:
            first_node.setdefault(op_type_of(n.name), n.name)
        self.summary_rows = [
            {"backend": b.backend_id, "subgraphs": b.num_subgraphs, "delegated_nodes": b.num_nodes}
            for b in sorted(self.info.delegation_by_backend.values(), key=lambda b: b.backend_id)
        ]
        df = self.info.get_operator_delegation_dataframe()
        rows = []
        for r in df.itertuples(index=False):
            row = {"op_type": r[0], "delegated": int(r[1]), "non_delegated": int(r[2])}
            if r[0] in first_node:
                row["focus"] = {"name": first_node[r[0]], "kind": "edge"}
            rows.append(row)
        self.table = TableView([("op_type", "operator", False), ("delegated", "delegated", True),
                                ("non_delegated", "not delegated", True)], rows,
                               title="Operators (click a row to show it in the graph)", height=260)
        _link_table_to_graph(self.table, self.graph)
        self.summary = widgets.HTML(self._summary_html())
        super().__init__([self.summary, self.table] + ([self.graph] if self.graph else []), **kwargs)

    def _summary_html(self) -> str:
        i = self.info
        lines = "".join(f"<tr><td>{r['backend']}</td><td>{r['subgraphs']}</td><td>{r['delegated_nodes']}</td></tr>"
                        for r in self.summary_rows) or "<tr><td colspan=3>no delegated partitions</td></tr>"
        return (f"<div data-etlab-view='delegation'><p class='etlab-note'>{i.num_delegated_subgraphs} delegated "
                f"subgraph(s), {i.num_delegated_nodes} delegated node(s), {i.num_non_delegated_nodes} not delegated"
                f"</p><table class='etlab-table'><tr><th>backend</th><th>subgraphs</th><th>delegated nodes</th></tr>"
                f"{lines}</table></div>")

    def html_fragments(self) -> list[_html.Fragment]:
        return _fragments("Delegation", [_html.Fragment(self._summary_html()), self.table] +
                          ([self.graph] if self.graph else []))

    def save_html(self, path: str | os.PathLike, title: str = "Delegation") -> os.PathLike:
        return _html.write_page(path, _html.page(title, self.html_fragments()))


# --- numeric gap ------------------------------------------------------------------------------------


class NumericGapView(widgets.VBox):
    """The numeric gap of every matched intermediate output, in execution order (log scale), with
    a threshold; ops above it are red. A click on a point or row selects the op in the graph."""

    def __init__(self, inspector, *, distance: str = "MSE", threshold: float | None = None,
                 show_graph: bool = True, method: str = "forward", **kwargs):
        self.distance = distance
        self.rows = numeric_gaps(inspector, distance)
        positive = [r.gap for r in self.rows if r.gap > 0 and math.isfinite(r.gap)]
        self.threshold = threshold if threshold is not None else (
            10 ** math.ceil(math.log10(max(positive))) / 100 if positive else 1e-6)
        self.graph = None
        if show_graph:
            try:
                self.graph = GraphView(inspector, "edge", method=method, overlay="gap" if self.rows else "none")
            except ValueError:
                self.graph = None  # the Inspector has no recorded graph
        self.figure = self._figure()
        self.table = TableView(
            [("order", "#", True), ("ops", "AOT ops", False), ("runtime_ops", "runtime events", False),
             ("gap", f"gap ({distance})", True), ("source", "source", False)],
            [{"order": r.order, "ops": ", ".join(r.aot_ops), "runtime_ops": ", ".join(r.runtime_ops), "gap": r.gap,
              "source": r.source, "focus": {"name": r.aot_ops[-1] if r.aot_ops else None, "handles": list(r.handles),
                                            "kind": "edge"}} for r in self.rows],
            title="Matched intermediate outputs", height=240)
        _link_table_to_graph(self.table, self.graph)
        self.fig_widget = go.FigureWidget(self.figure)
        if self.graph is not None and self.fig_widget.data:
            self.fig_widget.data[0].on_click(self._on_point)
        self.slider = widgets.FloatLogSlider(value=self.threshold, base=10, min=-12, max=6, step=0.25,
                                             description="threshold", readout_format=".1e")
        self.slider.observe(self._on_threshold, names="value")
        note = widgets.HTML("<p class='etlab-note'>No numeric gap: the Inspector needs an ETRecord with AOT "
                            "intermediates and a debug buffer.</p>") if not self.rows else widgets.HTML("")
        super().__init__([note, self.slider, self.fig_widget, self.table] + ([self.graph] if self.graph else []),
                         **kwargs)

    def above_threshold(self) -> list:
        return [r for r in self.rows if r.gap > self.threshold]

    def _figure(self) -> go.Figure:
        positive = [r.gap for r in self.rows if r.gap > 0 and math.isfinite(r.gap)]
        floor = min([*positive, self.threshold]) / 100  # exact matches (gap 0) sit on this floor, drawn as ▽
        gaps = [max(r.gap, floor) if math.isfinite(r.gap) else None for r in self.rows]
        colors = ["#e45756" if r.gap > self.threshold else "#4c78a8" for r in self.rows]
        symbols = ["triangle-down" if r.gap == 0 else "circle" for r in self.rows]
        fig = go.Figure(go.Scatter(
            x=[r.order for r in self.rows], y=gaps, mode="markers+lines", line={"color": "#c8d0da", "width": 1},
            marker={"color": colors, "size": 8, "symbol": symbols},
            customdata=[[r.aot_ops[-1] if r.aot_ops else "", list(r.handles)]
                                                             for r in self.rows],
            hovertext=[f"<b>{', '.join(r.aot_ops)}</b><br>gap {r.gap:.3e}{' (exact)' if r.gap == 0 else ''}"
                       f"<br>{r.source}"
                       for r in self.rows],
            hoverinfo="text", name="gap"))
        fig.add_hline(y=self.threshold, line={"dash": "dash", "color": "#e45756"},
                      annotation_text=f"threshold {self.threshold:.1e}", annotation_position="top left")
        fig.update_yaxes(type="log", title_text=f"gap ({self.distance})")
        fig.update_xaxes(title_text="op (execution order)", tickformat="d", dtick=1 if len(self.rows) <= 30 else None)
        fig.update_layout(height=340, template="plotly_white", margin={"l": 70, "r": 20, "t": 30, "b": 40},
                          title="numeric gap per op")
        return fig

    def _on_threshold(self, change) -> None:
        self.threshold = float(change["new"])
        fig = self._figure()
        with self.fig_widget.batch_update():
            self.fig_widget.data[0].marker.color = fig.data[0].marker.color
            self.fig_widget.layout.shapes = fig.layout.shapes
            self.fig_widget.layout.annotations = fig.layout.annotations

    def _on_point(self, trace, points, state) -> None:
        for i in points.point_inds[:1]:
            name, handles = trace.customdata[i]
            try:
                self.graph.focus(name or None, handles=list(handles), kind="edge")
            except (KeyError, ValueError):
                pass

    def html_fragments(self) -> list[_html.Fragment]:
        eid = _html.new_id("gap")
        plot = _html.plotly_fragment(self.figure, element_id=eid)
        # a click on a point selects its node in the page's graph (dashboard glue listens for etlab:focus)
        plot.scripts.append(
            "<script>(function(){const d=document.getElementById(" + _html.json_for_script(eid) + ");"
            "if(!d||!d.on)return;d.on('plotly_click',function(e){const p=e.points[0];if(!p||!p.customdata)return;"
            "d.dispatchEvent(new CustomEvent('etlab:focus',{bubbles:true,detail:{name:p.customdata[0],"
            "handles:p.customdata[1],kind:'edge'}}));});})();</script>")
        parts = [plot, self.table] + ([self.graph] if self.graph else [])
        if not self.rows:
            parts.insert(0, _html.Fragment("<p class='etlab-note'>No numeric gap: the Inspector needs an ETRecord "
                                           "with AOT intermediates and a debug buffer.</p>"))
        return _fragments("Numeric gap", parts)

    def save_html(self, path: str | os.PathLike, title: str = "Numeric gap") -> os.PathLike:
        return _html.write_page(path, _html.page(title, self.html_fragments()))


# --- profile ---------------------------------------------------------------------------------------


def _module_rollup(timings: list[OpTiming]) -> tuple[list[str], list[str], list[str], list[float]]:
    """Sunburst ids/labels/parents/values: module path levels, then the events (value: avg time)."""
    ids, labels, parents, values = ["model"], ["model"], [""], [0.0]
    index = {"model": 0}
    for t in timings:
        parent = "model"
        path = t.module.split(".") if t.module else []
        for depth in range(len(path)):
            mid = "model/" + ".".join(path[:depth + 1])
            if mid not in index:
                index[mid] = len(ids)
                ids.append(mid)
                labels.append(path[depth])
                parents.append(parent)
                values.append(0.0)
            parent = mid
        leaf = f"{parent}#{t.index}"
        index[leaf] = len(ids)
        ids.append(leaf)
        labels.append(t.name)
        parents.append(parent)
        values.append(t.avg)
        node = parent
        while node:  # "total" branch values: every ancestor sums its events
            values[index[node]] += t.avg
            node = parents[index[node]]
    return ids, labels, parents, values


class ProfileView(widgets.VBox):
    """Where the time goes: a sortable, filterable op table, a rollup by module (sunburst) and the
    per-run timeline."""

    def __init__(self, inspector, program=None, method: str = "forward", **kwargs):
        handles = resolve_sources(program, method).instruction_handles() if program is not None else None
        self.unit = time_unit(inspector)
        self.timings = execute_timings(op_timings(inspector, handles))
        u = self.unit
        self.table = TableView(
            [("name", "event", False), ("ops", "ops", False), ("module", "module", False),
             ("backend", "backend", False), ("p50", f"p50 ({u})", True), ("avg", f"avg ({u})", True),
             ("min", f"min ({u})", True), ("max", f"max ({u})", True), ("runs", "runs", True),
             ("source", "source", False)],
            [{"name": t.name, "ops": ", ".join(t.op_types), "module": t.module, "backend": t.backend or "",
              "p50": t.p50, "avg": t.avg, "min": t.min, "max": t.max, "runs": t.runs, "source": t.source,
              "focus": {"name": t.nodes[-1] if t.nodes else None, "handles": list(t.handles)} if t.handles else None}
             for t in self.timings], title="Operators", height=300)
        self.rollup_figure = self._rollup()
        self.timeline_figure = self._timeline()
        super().__init__([self.table, go.FigureWidget(self.rollup_figure), go.FigureWidget(self.timeline_figure)],
                         **kwargs)

    def _rollup(self) -> go.Figure:
        ids, labels, parents, values = _module_rollup(leaf_timings(self.timings))
        fig = go.Figure(go.Sunburst(ids=ids, labels=labels, parents=parents, values=values, branchvalues="total",
                                    hovertemplate=f"%{{label}}: %{{value:.4g}} {self.unit}<extra></extra>",
                                    maxdepth=4))
        fig.update_layout(height=420, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                          title=f"average time by module ({self.unit})")
        return fig

    def _timeline(self) -> go.Figure:
        fig = go.Figure()
        leaves = leaf_timings(self.timings)
        runs = max((len(t.start) for t in leaves), default=0)
        for r in range(runs):
            ts = [t for t in leaves if r < len(t.start) and r < len(t.raw)]
            fig.add_trace(go.Bar(
                orientation="h", y=[f"run {r}"] * len(ts), x=[t.raw[r] for t in ts], base=[t.start[r] for t in ts],
                hovertext=[f"<b>{t.name}</b> {', '.join(t.op_types)}<br>{t.raw[r]:.4g} {self.unit}" for t in ts],
                hoverinfo="text",
                marker={"color": ["#e45756" if t.is_delegated or t.backend else "#4c78a8" for t in ts],
                                          "line": {"color": "#fff", "width": 0.5}}, showlegend=False))
        fig.update_layout(barmode="overlay", height=140 + 40 * runs, template="plotly_white",
                          title=f"per-run timeline ({self.unit} from run start; red: delegated)",
                          margin={"l": 60, "r": 20, "t": 40, "b": 40})
        fig.update_xaxes(title_text=self.unit)
        return fig

    def html_fragments(self) -> list[_html.Fragment]:
        return _fragments("Profile", [self.table, _html.plotly_fragment(self.rollup_figure),
                                      _html.plotly_fragment(self.timeline_figure)])

    def save_html(self, path: str | os.PathLike, title: str = "Profile") -> os.PathLike:
        return _html.write_page(path, _html.page(title, self.html_fragments()))
