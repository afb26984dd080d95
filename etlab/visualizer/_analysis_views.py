"""DelegationView, NumericGapView and ProfileView: tables and plotly charts that click through to a GraphView."""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field

import ipywidgets as widgets
import plotly.graph_objects as go
from torch.fx import GraphModule

from etlab.inspector import (
    OpTiming,
    execute_timings,
    numeric_gaps,
    op_timings,
    ops_without_outputs,
    time_unit,
    timings_counted_once,
)
from etlab.visualizer import _html
from etlab.visualizer._graph_view import GraphView
from etlab.visualizer._plot_view import PlotView
from etlab.visualizer._profile_data import kind_colors, op_kind
from etlab.visualizer._reprs import refusal_groups_html
from etlab.visualizer._sources import resolve_sources
from etlab.visualizer._table import TableView
from etlab.visualizer._text import TextForm, frame_lines, table_lines, wrap


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


GETITEM = "getitem"


class DelegationView(TextForm, widgets.VBox):
    """How much of the program each backend took: a summary per backend, the operator table
    (upstream's columns: op_type, occurrences in delegated / non-delegated graphs), why each node
    left out was left out (grouped by category with counts, then one row per node with its reason,
    hint and source line) and the lowered graph; a row click selects the op in the graph.

    `getitem` nodes only pick one output of a multi-output op or delegate call (no kernel runs):
    get_delegation_info counts them as upstream does, this view lists them apart.
    """

    def __init__(self, program, method: str = "forward", *, show_graph: bool = True, **kwargs):
        from etlab.devtools import (
            OCCURRENCES_IN_DELEGATED_GRAPHS,
            OCCURRENCES_IN_NON_DELEGATED_GRAPHS,
            get_delegation_info,
            lowered_modules,
            op_type_of,
        )

        sources = resolve_sources(program, method)
        edge = sources.graph("edge")
        self.info = get_delegation_info(edge)
        self.graph = GraphView(edge, "edge", method=method) if show_graph else None
        gm = edge if isinstance(edge, GraphModule) else edge.graph_module
        first_node: dict[str, str] = {}  # op type -> the first edge node of it (what a row click selects)
        for g in [gm] + [lowered.original_module.graph_module for _, lowered in lowered_modules(gm)]:
            for node in g.graph.nodes:
                if node.op == "call_function":
                    first_node.setdefault(op_type_of(node), node.name)
        self.summary_rows = [
            {"backend": b.backend_id, "subgraphs": b.num_subgraphs, "delegated_nodes": b.num_nodes}
            for b in sorted(self.info.delegation_by_backend.values(), key=lambda b: b.backend_id)
        ]
        by_op = self.info.delegation_by_operator
        self.getitems = by_op[GETITEM].non_delegated + by_op[GETITEM].delegated if GETITEM in by_op else 0
        rows = []
        for b in sorted(by_op.values(), key=lambda b: b.op_type):
            if b.op_type == GETITEM:
                continue
            row = {"op_type": b.op_type, "delegated": b.delegated, "non_delegated": b.non_delegated}
            if b.op_type in first_node:
                row["focus"] = {"name": first_node[b.op_type], "kind": "edge"}
            rows.append(row)
        self.total = {"op_type": "Total", "delegated": sum(r["delegated"] for r in rows),
                      "non_delegated": sum(r["non_delegated"] for r in rows)}
        rows.append(self.total)
        self.table = TableView([("op_type", "op_type", False), ("delegated", OCCURRENCES_IN_DELEGATED_GRAPHS, True),
                                ("non_delegated", OCCURRENCES_IN_NON_DELEGATED_GRAPHS, True)], rows,
                               title="Operators (click a row to show it in the graph)", height=300)
        _link_table_to_graph(self.table, self.graph)
        self.refusal_groups = self.info.refusal_groups()
        self.refusal_table = TableView(
            [("node", "node", False), ("op", "op", False), ("category", "category", False),
             ("reason", "reason", False), ("hint", "hint", False), ("module", "module", False),
             ("source", "source line", False)],
            [{**{k: getattr(n, k) for k in ("node", "op", "category", "reason", "hint", "module", "source")},
              "focus": {"name": n.node, "kind": "edge"}}
             for g in self.refusal_groups for n in g.nodes] +
            [{"node": n.node, "op": n.op, "category": "", "reason": "no reason recorded", "hint": "",
              "module": n.module, "source": n.source, "focus": {"name": n.node, "kind": "edge"}}
             for n in self.info.unexplained],
            title="Left out of delegation: why (click a row to show it in the graph)", height=300)
        _link_table_to_graph(self.refusal_table, self.graph)
        self.summary = widgets.HTML(self._summary_html())
        parts = [self.summary, self.table] + ([self.refusal_table] if self.refusal_table.rows else [])
        super().__init__(parts + ([self.graph] if self.graph else []), **kwargs)

    def _summary_text(self) -> str:
        delegated = self.total["delegated"]
        ops = delegated + self.total["non_delegated"]
        share = f" ({delegated / ops:.0%})" if ops else ""
        getitem = f" ({self.getitems} getitem node(s) not counted: they run no kernel)" if self.getitems else ""
        return f"{self.info.num_delegated_subgraphs} delegated subgraph(s): {delegated} of {ops} operators " \
               f"delegated{share}.{getitem}"

    def text_lines(self, width: int) -> list[str]:
        """The share delegated, per backend, the operators and why nodes were left out, by category (TextForm: a
        plain REPL's repr)."""
        import pandas as pd

        lines = [wrap(self._summary_text(), width)]
        if self.summary_rows:
            lines += frame_lines(pd.DataFrame(self.summary_rows), width)
        lines += table_lines(self.table, width, top=None)  # one row per operator type, then the total
        groups = [(g.category, g.count, [n.node for n in g.nodes]) for g in self.refusal_groups]
        if self.info.unexplained:
            groups.append(("no reason recorded", len(self.info.unexplained), [n.node for n in self.info.unexplained]))
        if groups:
            lines.append(wrap(f"Left out of delegation: {sum(g[1] for g in groups)} node(s), by reason "
                              "(each node and its reason: .refusal_table.rows)", width))
            lines += [wrap(f"{category}: {count} ({', '.join(nodes[:4])}{', …' if count > 4 else ''})", width, "  ")
                      for category, count, nodes in groups]
        return lines

    def _summary_html(self) -> str:
        delegated = self.total["delegated"]
        ops = delegated + self.total["non_delegated"]
        share = f" ({delegated / ops:.0%})" if ops else ""
        lines = "".join(f"<tr><td>{html.escape(r['backend'])}</td><td>{r['subgraphs']}</td>"
                        f"<td>{r['delegated_nodes']}</td></tr>"
                        for r in self.summary_rows) or "<tr><td colspan=3>no delegated partitions</td></tr>"
        getitem = (f" Not counted as operators: {self.getitems} <code>getitem</code> node(s), which pick one "
                   "output of a multi-output op or delegate call and run no kernel (get_delegation_info counts "
                   "them, as upstream does)." if self.getitems else "")
        return (f"<div data-etlab-view='delegation'><p class='etlab-note'>{self.info.num_delegated_subgraphs} "
                f"delegated subgraph(s): {delegated} of {ops} operators delegated{share}.{getitem}</p>"
                f"<table class='etlab-table'><tr><th>backend</th><th>subgraphs</th><th>delegated operators</th></tr>"
                f"{lines}</table>{refusal_groups_html(self.info)}</div>")

    def html_fragments(self) -> list[_html.Fragment]:
        """The view's pieces for an offline page (the dashboard's tab or `save_html`): the backend summary, the operator
        table, the refusal table when nodes were left out, and the graph when shown; clicks keep working in the page
        through the shared glue script."""
        refusals = [self.refusal_table] if self.refusal_table.rows else []
        return _fragments("Delegation", [_html.Fragment(self._summary_html()), self.table] + refusals +
                          ([self.graph] if self.graph else []))

    def save_html(self, path: str | os.PathLike, title: str = "Delegation") -> os.PathLike:
        """Writes the view as one offline HTML page (its pieces from `html_fragments()`, scripts inlined, no server or
        network needed) atomically to `path` and returns it."""
        return _html.write_page(path, _html.page(title, self.html_fragments()))


# --- numeric gap ------------------------------------------------------------------------------------


NO_GAP_NOTE = "No numeric gap: the Inspector needs an ETRecord with AOT intermediates and a debug buffer."


class NumericGapView(TextForm, widgets.VBox):
    """The numeric gap of every matched intermediate output, in execution order (log scale), with
    a threshold; ops above it are red. A click on a point or row selects the op in the graph."""

    def __init__(self, inspector, *, distance: str = "MSE", threshold: float | None = None,
                 show_graph: bool = True, method: str = "forward", **kwargs):
        self.distance = distance
        self.rows = numeric_gaps(inspector, distance)
        self.unrecorded = ops_without_outputs(inspector)
        self.dropped = int(getattr(inspector, "dropped_debug_values", 0) or 0)  # counted in the ETDump at run time
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
        self.plot = PlotView(self.figure)
        if self.graph is not None:
            self.plot.on_click(self._on_point)
        self.slider = widgets.FloatLogSlider(value=self.threshold, base=10, min=-12, max=6, step=0.25,
                                             description="threshold", readout_format=".1e")
        self.slider.observe(self._on_threshold, names="value")
        self.note = widgets.HTML(f"<p class='etlab-note'>{html.escape(self.summary_text())}</p>"
                                 f"{self.dropped_html()}")
        super().__init__([self.note, self.slider, self.plot, self.table] + ([self.graph] if self.graph else []),
                         **kwargs)

    def above_threshold(self) -> list:
        """The matched outputs whose gap exceeds the current threshold (the red points): where to look first for a
        numerical divergence."""
        return [r for r in self.rows if r.gap > self.threshold]

    def dropped_html(self) -> str:
        """A warning with the count of intermediates the run did not keep: the values the runtime
        dropped because the debug buffer was full (counted in the ETDump, `Inspector.dropped_debug_values`),
        and the ops that ran without a recorded output; with how to keep them."""
        if not self.unrecorded and not self.dropped:
            return ""
        count = self.dropped or len(self.unrecorded)
        why = "the debug buffer was full" if self.dropped else "not in the debug buffer: it was full, or " \
            "intermediates were not recorded"
        names = ", ".join(self.unrecorded[:6]) + (", …" if len(self.unrecorded) > 6 else "")
        ops = f" Ops without a recorded output: {html.escape(names)}." if names else ""
        return (f"<p class='etlab-warn' data-role='dropped-intermediates' data-count='{count}' "
                "style='border-left: 4px solid #e8a400; padding: 4px 8px'>"
                f"<b>{count} intermediate output(s) dropped</b> ({why}); their numeric gap is unknown.{ops} "
                "Hint: load the program with <code>debug_buffer_size</code> left unset (sized from the memory "
                "plan) or larger, e.g. <code>Runtime.get().load_program(pte, enable_etdump=True)</code>.</p>")

    def summary_text(self) -> str:
        """One line: how many matched outputs are exact, above the threshold, and the largest gap."""
        missing = ""
        if self.unrecorded:
            names = ", ".join(self.unrecorded[:4]) + (", …" if len(self.unrecorded) > 4 else "")
            missing = (f" {len(self.unrecorded)} ops ran without a recorded output ({names}): their gap is unknown; "
                       "load the program with a larger debug_buffer_size.")
        if not self.rows:
            return NO_GAP_NOTE + missing
        exact = sum(1 for r in self.rows if r.gap == 0)
        above = len(self.above_threshold())
        largest = max((r for r in self.rows if math.isfinite(r.gap)), key=lambda r: r.gap, default=None)
        text = (f"{len(self.rows)} matched intermediate outputs ({self.distance}): {exact} exact (gap 0), "
                f"{above} above the threshold {self.threshold:.1e}")
        if largest is not None and largest.gap > 0:
            text += f"; largest gap {largest.gap:.3e} at {', '.join(largest.aot_ops)}"
        return text + "." + missing

    def text_lines(self, width: int) -> list[str]:
        """The summary and the matched outputs with the largest gap (TextForm: a plain REPL's repr)."""
        lines = [wrap(self.summary_text(), width)]
        if self.dropped:
            lines.append(wrap(f"{self.dropped} intermediate output(s) dropped (the debug buffer was full): load the "
                              "program with a larger debug_buffer_size", width))
        return lines + (table_lines(self.table, width, sort_by="gap") if self.rows else [])

    def _figure(self) -> go.Figure:
        positive = [r.gap for r in self.rows if r.gap > 0 and math.isfinite(r.gap)]
        floor = min([*positive, self.threshold]) / 100  # exact matches (gap 0) sit on this floor, drawn as ▽
        top = max([*positive, self.threshold])
        gaps = [max(r.gap, floor) if math.isfinite(r.gap) else None for r in self.rows]
        colors = ["#e45756" if r.gap > self.threshold else "#4c78a8" for r in self.rows]
        symbols = ["triangle-down" if r.gap == 0 else "circle" for r in self.rows]
        fig = go.Figure(go.Scatter(
            x=[r.order for r in self.rows], y=gaps, mode="markers+lines", line={"color": "#c8d0da", "width": 1},
            marker={"color": colors, "size": 8, "symbol": symbols},
            customdata=[[r.aot_ops[-1] if r.aot_ops else "", list(r.handles)] for r in self.rows],
            hovertext=[f"<b>#{r.order} {', '.join(r.aot_ops)}</b><br>gap {r.gap:.3e}"
                       f"{' (exact)' if r.gap == 0 else ''}<br>{r.source}" for r in self.rows],
            hoverinfo="text", name="gap"))
        fig.add_hline(y=self.threshold, line={"dash": "dash", "color": "#e45756"},
                      annotation_text=f"threshold {self.threshold:.1e}", annotation_position="top left")
        # decades up to the largest gap, and the floor labeled for what it is: no gap at all
        decades = [10.0 ** k for k in range(math.floor(math.log10(floor)) + 1, math.ceil(math.log10(top)) + 1)]
        decades = decades[::max(1, len(decades) // 8)]
        exact = any(r.gap == 0 for r in self.rows)
        fig.update_yaxes(type="log", title_text=f"gap ({self.distance})",
                         tickvals=[floor, *decades] if exact else decades,
                         ticktext=(["0 (exact)"] if exact else []) + [f"{v:.0e}" for v in decades],
                         range=[math.log10(floor) - 0.5, math.log10(top) + 0.5])
        fig.update_xaxes(title_text="op (execution order)", tickformat="d", dtick=1 if len(self.rows) <= 30 else None)
        fig.update_layout(height=340, template="plotly_white", margin={"l": 80, "r": 20, "t": 30, "b": 40},
                          title="numeric gap per op")
        return fig

    def _on_threshold(self, change) -> None:
        self.threshold = float(change["new"])
        self.figure = self._figure()
        self.plot.update(self.figure)
        self.note.value = f"<p class='etlab-note'>{html.escape(self.summary_text())}</p>{self.dropped_html()}"

    def _on_point(self, point: dict) -> None:
        name, handles = point.get("customdata") or (None, [])
        if self.graph is None:  # registered only with a graph; kept for a caller that drops it later
            return
        try:
            self.graph.focus(name or None, handles=list(handles), kind="edge")
        except (KeyError, ValueError):
            pass

    def html_fragments(self) -> list[_html.Fragment]:
        """The view's pieces for an offline page (the dashboard's tab or `save_html`): the gap chart (a point click
        selects its node), the matched-outputs table and the graph when shown; clicks keep working in the page
        through the shared glue script."""
        eid = _html.new_id("gap")
        plot = _html.plotly_fragment(self.figure, element_id=eid)
        # a click on a point selects its node in the page's graph (dashboard glue listens for etlab:focus)
        plot.scripts.append(
            "<script>(function(){const d=document.getElementById(" + _html.json_for_script(eid) + ");"
            "if(!d||!d.on)return;d.on('plotly_click',function(e){const p=e.points[0];if(!p||!p.customdata)return;"
            "d.dispatchEvent(new CustomEvent('etlab:focus',{bubbles:true,detail:{name:p.customdata[0],"
            "handles:p.customdata[1],kind:'edge'}}));});})();</script>")
        parts = [_html.Fragment(f"<p class='etlab-note'>{html.escape(self.summary_text())}</p>{self.dropped_html()}"),
                 plot, self.table]
        parts += [self.graph] if self.graph else []
        return _fragments("Numeric gap", parts)

    def save_html(self, path: str | os.PathLike, title: str = "Numeric gap") -> os.PathLike:
        """Writes the view as one offline HTML page (its pieces from `html_fragments()`, scripts inlined, no server or
        network needed) atomically to `path` and returns it."""
        return _html.write_page(path, _html.page(title, self.html_fragments()))


# --- profile ---------------------------------------------------------------------------------------


@dataclass
class ModuleRollup:
    """Treemap data: module boxes (full path labels), then one leaf per timed event (value: p50)."""

    ids: list[str] = field(default_factory=lambda: ["model"])
    labels: list[str] = field(default_factory=lambda: ["model"])
    parents: list[str] = field(default_factory=lambda: [""])
    values: list[float] = field(default_factory=lambda: [0.0])
    colors: list[str] = field(default_factory=lambda: [MODULE_FILL])
    hover: list[str] = field(default_factory=lambda: ["whole model"])


MODULE_FILL = "#eef1f5"


def module_rollup(timings: list[OpTiming], colors: dict[str, str], unit: str) -> ModuleRollup:
    """p50 per event summed up the module tree. p50, not avg: a few warm-up or preempted runs
    would otherwise decide which module looks slow."""
    r = ModuleRollup()
    index = {"model": 0}
    for t in timings:
        parent = "model"
        path = t.module.split(".") if t.module else []
        for depth in range(len(path)):
            mid = "model/" + ".".join(path[:depth + 1])
            if mid not in index:
                index[mid] = len(r.ids)
                module = ".".join(path[:depth + 1])
                r.ids.append(mid)
                r.labels.append(module)
                r.parents.append(parent)
                r.values.append(0.0)
                r.colors.append(MODULE_FILL)
                r.hover.append(module)
            parent = mid
        kind = op_kind(t)
        r.ids.append(f"{parent}#{t.index}")
        r.labels.append(kind)
        r.parents.append(parent)
        r.values.append(t.p50)
        r.colors.append(colors[kind])
        r.hover.append(f"{t.name} ({', '.join(t.op_types)})<br>{t.module}<br>p50 {t.p50:.4g} {unit} · "
                       f"avg {t.avg:.4g} · max {t.max:.4g}" + (f"<br>{t.source}" if t.source else ""))
        node = parent
        while node:  # "total" branch values: every ancestor sums its events
            r.values[index[node]] += t.p50
            node = r.parents[index[node]]
    return r


def _kind_key(colors: dict[str, str]) -> str:
    """A one-line color key for a chart title."""
    return " ".join(f"<span style='color:{c}'>■</span> {k}" for k, c in colors.items())


class ProfileView(TextForm, widgets.VBox):
    """Where the time goes: a sortable, filterable op table, a rollup of p50 by module (treemap,
    colored by op kind) and the per-run timeline."""

    def __init__(self, inspector, program=None, method: str = "forward", **kwargs):
        handles = resolve_sources(program, method).instruction_handles() if program is not None else None
        self.unit = time_unit(inspector)
        self.timings = execute_timings(op_timings(inspector, handles))
        self.kind_colors = kind_colors(timings_counted_once(self.timings))
        u = self.unit
        total = sum(t.p50 for t in timings_counted_once(self.timings) if math.isfinite(t.p50))
        # the event and its p50 first: a notebook cell shows them without scrolling past the long text columns
        self.table = TableView(
            [("name", "event", False), ("p50", f"p50 ({u})", True), ("share", "share %", True),
             ("runs", "runs", True), ("ops", "ops", False), ("module", "module", False),
             ("backend", "backend", False), ("avg", f"avg ({u})", True), ("min", f"min ({u})", True),
             ("max", f"max ({u})", True), ("source", "source", False)],
            [{"name": t.name, "ops": ", ".join(t.op_types), "module": t.module, "backend": t.backend or "",
              "share": round(100.0 * t.p50 / total, 2) if total > 0 and math.isfinite(t.p50) else None,
              "p50": t.p50, "avg": t.avg, "min": t.min, "max": t.max, "runs": t.runs, "source": t.source,
              "focus": {"name": t.nodes[-1] if t.nodes else None, "handles": list(t.handles)} if t.handles else None}
             for t in self.timings], title="Operators", height=300)
        self.rollup_figure = self._rollup()
        self.timeline_figure = self._timeline()
        super().__init__([self.table, PlotView(self.rollup_figure), PlotView(self.timeline_figure)], **kwargs)

    def text_lines(self, width: int) -> list[str]:
        """The time per run, the events that took longest (p50) and where (TextForm: a plain REPL's repr)."""
        timed = timings_counted_once(self.timings)
        total = sum(t.p50 for t in timed if math.isfinite(t.p50))
        runs = max((t.runs for t in timed), default=0)
        lines = [wrap(f"{len(self.timings)} timed events over {runs} run(s); sum of p50 {total:.4g} {self.unit} "
                      f"(a delegate call counted once, not also its insides)", width)]
        return lines + table_lines(self.table, width, sort_by="p50")

    def _rollup(self) -> go.Figure:
        r = module_rollup(timings_counted_once(self.timings), self.kind_colors, self.unit)
        fig = go.Figure(go.Treemap(
            ids=r.ids, labels=r.labels, parents=r.parents, values=r.values, branchvalues="total",
            marker={"colors": r.colors, "line": {"color": "#fff", "width": 1}}, customdata=r.hover,
            texttemplate="%{label}<br>%{value:.3g} " + self.unit, tiling={"pad": 2},
            pathbar={"visible": True}, hovertemplate=f"%{{customdata}}<br><b>%{{value:.4g}} {self.unit}</b>"
                                                     "<extra></extra>"))
        fig.update_layout(height=520, margin={"l": 10, "r": 10, "t": 60, "b": 10},
                          title={"text": f"p50 time by module ({self.unit}; the median run, not the average, so "
                                         f"warm-up runs do not dominate)<br><sup>{_kind_key(self.kind_colors)}"
                                         "</sup>", "font": {"size": 14}})
        return fig

    def _timeline(self) -> go.Figure:
        """Each run's events from the run's start, colored by op kind. The x range fits a typical
        run; slower runs (warm-up, a busy machine) run off the right edge with their total in the label."""
        fig = go.Figure()
        timed = timings_counted_once(self.timings)
        runs = max((len(t.start) for t in timed), default=0)
        ends = [max((t.start[r] + t.raw[r] for t in timed if r < len(t.start) and r < len(t.raw)), default=0.0)
                for r in range(runs)]
        labels = [f"run {r} · {ends[r]:.3g} {self.unit}" for r in range(runs)]
        for kind, color in self.kind_colors.items():
            ts = [(r, t) for t in timed if op_kind(t) == kind for r in range(min(len(t.start), len(t.raw)))]
            fig.add_trace(go.Bar(
                orientation="h", y=[labels[r] for r, _ in ts], x=[t.raw[r] for r, t in ts],
                base=[t.start[r] for r, t in ts], name=kind, marker={"color": color, "line": {"width": 0}},
                hovertext=[f"<b>{t.name}</b> {', '.join(t.op_types)}<br>{t.module}<br>run {r}: {t.raw[r]:.4g} "
                           f"{self.unit} at {t.start[r]:.4g}" for r, t in ts], hoverinfo="text"))
        typical = sorted(ends)[len(ends) // 2] if ends else 0.0
        fig.update_layout(barmode="overlay", height=160 + 26 * runs, template="plotly_white",
                          title=f"per-run timeline ({self.unit} from run start; drag or double-click to zoom out)",
                          margin={"l": 130, "r": 20, "t": 80, "b": 40},
                          legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0})
        fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=labels)
        fig.update_xaxes(title_text=self.unit, range=[0, typical * 1.6] if typical > 0 else None)
        return fig

    def html_fragments(self) -> list[_html.Fragment]:
        """The view's pieces for an offline page (the dashboard's tab or `save_html`): the op table, the module rollup
        and the per-run timeline; clicks keep working in the page through the shared glue script."""
        return _fragments("Profile", [self.table, _html.plotly_fragment(self.rollup_figure),
                                      _html.plotly_fragment(self.timeline_figure)])

    def save_html(self, path: str | os.PathLike, title: str = "Profile") -> os.PathLike:
        """Writes the view as one offline HTML page (its pieces from `html_fragments()`, scripts inlined, no server or
        network needed) atomically to `path` and returns it."""
        return _html.write_page(path, _html.page(title, self.html_fragments()))
