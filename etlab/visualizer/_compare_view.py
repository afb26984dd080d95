"""CompareView: two runs or builds side by side (`etlab.inspector.Comparison`): the summary, a sortable
table of every row, the latency of the rows that moved most (A and B bars), and the program's Edge
graph colored by the latency ratio B/A or by the numeric delta of each op's output.

The numbers come from the analysis (`Inspector.compare`); this module only draws them. The graph
uses GraphView's overlays: "latency" carries the ratio (unit "× B/A") and "gap" the max |B - A|.
Rows say how they were joined (debug handle, module + op for builds whose graphs differ, such as
float vs quantized, or unmatched); each row is placed on the drawn graph by that build's own handles.
"""

from __future__ import annotations

import html
import os

import ipywidgets as widgets
import plotly.graph_objects as go

from etlab.inspector import cell_text
from etlab.visualizer import _html
from etlab.visualizer._analysis_views import NumericGapView, _fragments, _link_table_to_graph
from etlab.visualizer._graph_model import GraphModel
from etlab.visualizer._graph_view import GraphView, graph_models
from etlab.visualizer._plot_view import PlotView
from etlab.visualizer._sources import resolve_sources
from etlab.visualizer._table import TableView
from etlab.visualizer._text import TextForm, table_lines, wrap

OVERLAYS = {"ratio": "latency", "numeric": "gap", "none": "none"}
RATIO_UNIT = "× (B/A)"
DELTA_METRIC = "max |B−A|"
COLOR_A, COLOR_B = "#4c78a8", "#f58518"


def captured_intermediates(inspector) -> bool | None:
    """Whether a run logged intermediate outputs (debug events in its ETDump); None without an Inspector."""
    if inspector is None:
        return None
    return any(e.debug_data for block in inspector.event_blocks for e in block.events)


def capture_warning(comparison) -> str:
    """Why the latency ratios may mislead: one run logged its ops' outputs and the other did not. Copying
    every output into the debug buffer slows the logging run's ops, so B/A then measures the logging."""
    a, b = captured_intermediates(comparison.inspector_a), captured_intermediates(comparison.inspector_b)
    if a is None or b is None or a == b:
        return ""
    logged, plain = ("A", "B") if a else ("B", "A")
    return (f"Run {logged} captured intermediate outputs and run {plain} did not: copying each op's output into "
            f"the debug buffer slows run {logged}'s ops, so the latency ratios compare unlike runs. Run both with "
            "the same debug settings (or compare numerics only).")


def _warning_html(text: str) -> str:
    return f"<p class='etlab-warn' data-role='capture-warning'>{html.escape(text)}</p>" if text else ""


def compare_columns(unit: str) -> list[tuple[str, str, bool]]:
    """TableView columns of a Comparison's rows."""
    return [("key", "row", False), ("label", "ops", False), ("present", "in", False), ("join", "joined by", False),
            ("events_a", "events A", False), ("events_b", "events B", False),
            ("latency_a", f"A ({unit})", True), ("latency_b", f"B ({unit})", True),
            ("delta", f"B − A ({unit})", True), ("ratio", "B / A", True), ("max_abs", "max |B−A|", True),
            ("relative", "rel. diff", True), ("added_error", "+rel. diff", True), ("sqnr", "SQNR (dB)", True),
            ("cosine", "cosine", True), ("module", "module", False), ("source", "source", False),
            ("note", "note", False)]


def _side_handles(row, side: str) -> tuple[int, ...]:
    """A row's handles in the graph of build `side` ("a" or "b"); the union when the sides share handles."""
    own = row.handles_a if side == "a" else row.handles_b
    return own if row.join == "module+op" else (own or row.handles)


def compare_rows(comparison, side: str = "b") -> list[dict]:
    """The rows as TableView dicts; a row with debug handles in build `side`'s graph selects its node there."""
    out = []
    for r in comparison.rows:
        notes = "; ".join(n for n in (r.join_note, r.numeric_note) if n)
        row = {"key": r.key, "label": r.label, "present": r.present, "join": r.join, "events_a": ", ".join(r.events_a),
               "events_b": ", ".join(r.events_b), "latency_a": r.latency_a, "latency_b": r.latency_b,
               "delta": r.delta, "ratio": r.ratio, "max_abs": r.max_abs, "relative": r.relative,
               "added_error": r.added_error, "sqnr": r.sqnr, "cosine": r.cosine, "module": r.module,
               "source": r.source, "note": notes}
        handles = _side_handles(r, side)
        if handles:
            row["focus"] = {"name": r.nodes[-1] if r.nodes else None, "handles": list(handles), "kind": "edge"}
        out.append(row)
    return out


def latency_figure(comparison, top: int = 25, side: str = "b") -> go.Figure:
    """A and B latency of the `top` rows with the largest |delta|, as paired horizontal bars (a bar
    carries its row's node and handles in build `side`'s graph, for a click to select)."""
    rows = list(reversed(comparison.top(top, "latency")))
    labels = [f"{r.key} {r.label}"[:48] for r in rows]
    fig = go.Figure()
    for side, color, name in (("a", COLOR_A, comparison.name_a), ("b", COLOR_B, comparison.name_b)):
        vals = [getattr(r, f"latency_{side}") for r in rows]
        fig.add_trace(go.Bar(orientation="h", y=labels, x=vals, name=f"{side.upper()}: {os.path.basename(name)}",
                             marker={"color": color},
                             customdata=[_click_data(r, side) for r in rows],
                             hovertext=[f"<b>{lab}</b><br>{side.upper()}: {v:.4g} {comparison.unit}"
                                        f"{f'<br>B/A {r.ratio:.3f}' if r.ratio is not None else ''}"
                                        for lab, v, r in zip(labels, vals, rows)], hoverinfo="text"))
    fig.update_layout(barmode="group", template="plotly_white", height=140 + 30 * max(1, len(rows)),
                      title=f"latency per row, A vs B ({comparison.unit}; the {len(rows)} rows that moved most)",
                      margin={"l": 260, "r": 20, "t": 60, "b": 40},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0})
    fig.update_xaxes(title_text=comparison.unit)
    return fig


def _click_data(row, side: str) -> list:
    """What a bar of a row carries for a click: its last graph node and its handles on `side`."""
    return [row.nodes[-1] if row.nodes else "", list(_side_handles(row, side))]


def numeric_figure(comparison, side: str = "b") -> go.Figure | None:
    """Per row in execution order, where both sides' outputs were compared: the relative error of B's
    output (a line) and the part of it the row added over its inputs' (bars): where quantization, or
    any other difference, enters the network rather than where it is carried. None without numbers."""
    rows = [r for r in comparison.rows if r.relative is not None]
    if not rows:
        return None
    labels = [r.key for r in rows]
    custom = [_click_data(r, side) for r in rows]
    added = [r.added_error for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=added, name="added by the row", customdata=custom,
                         marker={"color": [COLOR_B if (v or 0) > 0 else "#9aa5b1" for v in added]},
                         hovertext=[f"<b>{r.key}</b><br>added {_fmt(r.added_error)}<br>relative {r.relative:.3g}"
                                    f"<br>SQNR {_fmt(r.sqnr)} dB" for r in rows], hoverinfo="text"))
    fig.add_trace(go.Scatter(x=labels, y=[r.relative for r in rows], name="relative error ‖B−A‖/‖A‖",
                             mode="lines+markers", customdata=custom, marker={"color": COLOR_A}))
    fig.update_layout(template="plotly_white", height=360, barmode="overlay",
                      title="numeric difference per row, in execution order (bars: the error a row adds)",
                      margin={"l": 60, "r": 20, "t": 60, "b": 140},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0})
    fig.update_xaxes(tickangle=-45, tickfont={"size": 9})
    return fig


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3g}"


def overlay_models(comparison, program=None, method: str = "forward") -> list[GraphModel]:
    """The Edge graph (of `program`, else of B's ETRecord, the build under study, else of A's) with each
    node's ratio B/A as its "latency" and its max |B - A| as its "gap"; [] when no graph is available or
    the rows carry no debug handles."""
    return drawn_graph(comparison, program, method)[0]


def drawn_graph(comparison, program=None, method: str = "forward") -> tuple[list[GraphModel], str]:
    """(`overlay_models`, the build whose graph they are: "a" or "b"; `program` counts as B's build)."""
    if not any(r.handles for r in comparison.rows):
        return [], "b"
    for side, source in (("", program), ("B", comparison.inspector_b), ("A", comparison.inspector_a)):
        if source is None:
            continue
        try:
            sources = resolve_sources(source, method)
            sources.inspector = None  # the comparison's numbers go on the nodes, not one run's
            models = graph_models(sources, ["edge"])
        except (ValueError, TypeError, KeyError):
            continue
        for m in models:
            annotate_comparison(m, comparison, (side or "B").lower())
            if side:
                m.title += f", drawn on {side}'s graph"
        return models, (side or "B").lower()
    return [], "b"


def annotate_comparison(model: GraphModel, comparison, side: str = "b") -> GraphModel:
    """Puts the ratio and numeric delta of the row covering each node on it (rows placed by build
    `side`'s handles: rows joined by module + op carry two graphs' handles)."""
    by_handle = {h: r for r in comparison.rows for h in _side_handles(r, side)}
    model.title = f"Edge graph: latency B/A and output delta ({comparison.by})"
    model.time_unit, model.gap_metric = RATIO_UNIT, DELTA_METRIC
    model.latency_center = 1.0  # a ratio: faster and slower in two colors, split at B = A
    for n in model.nodes:
        rows = list({id(r): r for h in n.handles if (r := by_handle.get(h)) is not None}.values())
        n.latency, n.gap = None, None
        ratios = [r.ratio for r in rows if r.ratio is not None]
        if ratios:
            ratio = max(ratios, key=lambda x: abs(x - 1))
            n.latency = {"p50": ratio, "p10": ratio, "p90": ratio, "avg": ratio, "min": ratio, "max": ratio,
                         "runs": min(min(r.runs_a, r.runs_b) for r in rows), "events": [r.key for r in rows],
                         "shared": 1}
        deltas = [r.max_abs for r in rows if r.max_abs is not None]
        if deltas:
            n.gap = max(deltas)
    return model


def comparison_html(comparison, max_rows: int = 12) -> str:
    """The notebook repr of a Comparison: its summary and the rows that moved most."""
    columns = compare_columns(comparison.unit)[:10]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in columns)
    by_key = {r["key"]: r for r in compare_rows(comparison)}
    shown = [by_key[r.key] for r in comparison.top(max_rows)]
    shown += [by_key[r.key] for r in comparison.rows if r.present != "both"][: max(0, max_rows - len(shown))]
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell_text(r.get(k)))}</td>" for k, _, _ in columns) + "</tr>"
                   for r in shown)
    return (f"<div class='etlab-repr' data-etlab-view='compare-repr'>{_warning_html(capture_warning(comparison))}"
            f"<p><b>{html.escape(comparison.name_a)}</b> (A) vs "
            f"<b>{html.escape(comparison.name_b)}</b> (B), joined by {html.escape(comparison.by)}: "
            f"{html.escape(comparison.summary.text(comparison.unit))}</p>"
            f"<table class='etlab-table'><tr>{head}</tr>{body}</table></div>")


class _Rows:
    """What table_lines reads of a TableView (title, columns, rows): the compare table's rows in another order."""

    def __init__(self, title: str, columns: list[dict], rows: list[dict]):
        self.title, self.columns, self.rows = title, columns, rows


class CompareView(TextForm, widgets.VBox):
    """A Comparison in a notebook: summary, rows (click one to select its node), the A/B latency of
    the rows that moved most, the numeric difference row by row (relative error, and the part each row
    adds), and the Edge graph colored by B/A ("ratio") or max |B−A| ("numeric").

        ins_a.compare(ins_b).show()                 # or CompareView(comparison, program=manager)
    """

    def __init__(self, comparison, *, program=None, overlay: str = "ratio", method: str = "forward",
                 top: int = 25, show_graph: bool = True, **kwargs):
        if overlay not in OVERLAYS:
            raise ValueError(f"overlay must be one of {list(OVERLAYS)}, got {overlay!r}")
        self.comparison = comparison
        self.warning = capture_warning(comparison)
        self.models, side = drawn_graph(comparison, program, method) if show_graph else ([], "b")
        self.graph = GraphView.from_models(self.models, overlay=OVERLAYS[overlay]) if self.models else None
        self.table = TableView(compare_columns(comparison.unit), compare_rows(comparison, side),
                               title="Rows (click one to show it in the graph)", height=320)
        _link_table_to_graph(self.table, self.graph)
        self.figure = latency_figure(comparison, top, side)
        self.plot = PlotView(self.figure)
        self.numeric = numeric_figure(comparison, side)
        self.numeric_plot = PlotView(self.numeric) if self.numeric is not None else None
        plots = [self.plot] + ([self.numeric_plot] if self.numeric_plot is not None else [])
        if self.graph is not None:
            for plot in plots:
                plot.on_click(self._on_point)
        self.note = widgets.HTML(self._note_html())
        super().__init__([self.note, self.table, *plots] + ([self.graph] if self.graph else []), **kwargs)

    def _note_html(self) -> str:
        c = self.comparison
        graph = "" if self.graph is not None else (
            " No graph overlay: it needs debug handles (an ETRecord for both runs) and a recorded Edge graph.")
        return (f"<div data-etlab-view='compare' data-rows='{len(c.rows)}'>{_warning_html(self.warning)}"
                f"<p class='etlab-note'>"
                f"A: <b>{html.escape(c.name_a)}</b>, B: <b>{html.escape(c.name_b)}</b>; joined by "
                f"{html.escape(c.by)}. {html.escape(c.summary.text(c.unit))}{html.escape(graph)}</p></div>")

    _on_point = NumericGapView._on_point  # a clicked bar selects its node, as a gap chart's point does

    def text_lines(self, width: int) -> list[str]:
        """A and B, how they were joined, the summary and the rows that moved most (TextForm: a plain REPL's repr)."""
        c = self.comparison
        lines = [wrap(f"A: {c.name_a}", width), wrap(f"B: {c.name_b}", width),
                 wrap(f"joined by {c.by}; {c.summary.text(c.unit)}", width)]
        if self.warning:
            lines.append(wrap(f"warning: {self.warning}", width))
        moved = {id(r): abs(r["delta"]) for r in self.table.rows if isinstance(r.get("delta"), (int, float))}
        rows = sorted(self.table.rows, key=lambda r: -moved.get(id(r), -1.0))
        view = _Rows(self.table.title + "; the rows that moved most (|B − A|) first", self.table.columns, rows)
        keys = ["key", "label", "latency_a", "latency_b", "delta", "ratio", "max_abs", "sqnr", "added_error",
                "present", "join", "module", "source"]
        return lines + table_lines(view, width, keys=keys)

    def html_fragments(self) -> list[_html.Fragment]:
        """The view's pieces for an offline page (the dashboard's tab or `save_html`): the summary note, the rows table,
        the A/B latency chart, the numeric-difference chart when both runs logged values, and the graph colored by
        B/A; clicks keep working in the page through the shared glue script."""
        parts = [_html.Fragment(self._note_html()), self.table, _html.plotly_fragment(self.figure)]
        if self.numeric is not None:
            parts.append(_html.plotly_fragment(self.numeric))
        return _fragments("Comparison", parts + ([self.graph] if self.graph else []))

    def save_html(self, path: str | os.PathLike, title: str | None = None) -> os.PathLike:
        """Writes the view as one offline HTML file (atomically); returns the path."""
        c = self.comparison
        title = title or f"etlab compare: {os.path.basename(c.name_a)} vs {os.path.basename(c.name_b)}"
        return _html.write_page(path, _html.page(title, self.html_fragments()))
