"""QuantizationView: where a quantized program loses accuracy, layer by layer (a QuantReport drawn).

A chart of per-layer SQNR in execution order (the error each layer introduced as bars, the error
accumulated up to it as a line), the layer table, and the float graph with each node colored by the
noise it introduced. A click on a bar, a point or a row selects the layer in the graph and shows its
numbers and the user's source line.
"""

from __future__ import annotations

import html
import math
import os

import ipywidgets as widgets
import plotly.graph_objects as go

from etlab.visualizer import _html
from etlab.visualizer._graph_model import GraphModel, build_graph_model
from etlab.visualizer._graph_view import GraphView
from etlab.visualizer._plot_view import PlotView
from etlab.visualizer._table import TableView
from etlab.visualizer._text import TextForm, table_lines, wrap

GRAPH_KIND = "aten"  # the float model's exported graph: the one the user's layers are named in
NOISE_METRIC = "local noise / signal"
PAGE_GRAPH = "etlabQuantGraphView"  # where a page keeps this view's graph
SQNR_CAP = 100.0  # dB drawn for an exact layer (SQNR inf): above every real int8 error
TABLE_COLUMNS = [("order", "#", True), ("layer", "layer", False), ("op", "op", False), ("module", "module", False),
                 ("quantized", "int8 out", False), ("local_sqnr", "local SQNR (dB)", True),
                 ("sqnr", "SQNR (dB)", True), ("input_sqnr", "input SQNR (dB)", True), ("cosine", "cosine", True),
                 ("max_abs", "max |err|", True), ("min", "min", True), ("max", "max", True), ("std", "std", True),
                 ("nan", "NaN", True), ("inf", "Inf", True), ("source", "source", False)]


# In a page: a chart click or a table row (etlab:focus of the float graph's kind) selects the layer here.
_FOCUS_SCRIPT = ("<script>(function(){"
                 "function focus(name){var g=window.__GRAPH__;"
                 "if(g&&name)g.model.set('focus_target',{name:name,handles:[],kind:'__KIND__'});}"
                 "var d=document.getElementById(__ID__);"
                 "if(d&&d.on)d.on('plotly_click',function(e){var p=e.points[0];"
                 "if(p&&p.customdata)focus(p.customdata[0]);});"
                 "document.addEventListener('etlab:focus',function(e){"
                 "if(e.detail&&e.detail.kind==='__KIND__')focus(e.detail.name);});"
                 "})();</script>").replace("__GRAPH__", PAGE_GRAPH).replace("__KIND__", GRAPH_KIND)


def _capped(v: float) -> float | None:
    """A finite SQNR for the chart: inf (exact) drawn at the cap, NaN left out."""
    if v is None or math.isnan(v):
        return None
    return min(v, SQNR_CAP) if v > -math.inf else -SQNR_CAP


def _db(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def noise_ratio(sqnr: float) -> float | None:
    """Noise power over signal power for an SQNR in dB (0 for an exact layer): the graph overlay's
    value, larger where a layer introduced more error, on the overlay's log scale."""
    if sqnr is None or math.isnan(sqnr):
        return None
    return 0.0 if sqnr == math.inf else 10.0 ** (-sqnr / 10.0)


def graph_with_noise(report) -> GraphModel:
    """The float graph, each joined layer (and the ops folded into it) annotated with its local noise."""
    model = build_graph_model(report.float_graph, GRAPH_KIND, title="float model (local quantization noise)")
    by_name = {n.name: n for n in model.nodes}
    for r in report.layers.itertuples(index=False):
        for name in [r.layer, *r.folded]:
            node = by_name.get(name)
            if node is not None:
                node.gap = noise_ratio(r.local_sqnr)
    model.gap_metric = NOISE_METRIC
    return model


class _LayerView(TextForm, widgets.VBox):
    """What both quantization views share: rows keyed by layer, a details pane and an optional float graph;
    `select(layer)` shows a layer in both."""

    rows: list[dict]
    details: widgets.HTML
    graph: GraphView | None

    def select(self, layer: str | None) -> None:
        """Shows `layer`'s numbers and source line in the details pane, and selects it in the graph when shown."""
        if not layer:
            return
        self.details.value = self._details_html(layer)
        if self.graph is not None:
            try:
                self.graph.focus(layer, kind=GRAPH_KIND)
            except KeyError:
                pass  # a layer drawn under another node (getitem)

    def _row(self, layer: str | None) -> dict | None:
        return next((r for r in self.rows if r["layer"] == layer), None)

    def _details_html(self, layer: str | None) -> str:
        raise NotImplementedError


class QuantizationView(_LayerView):
    """Per-layer error of a quantized program (an `etlab.devtools.QuantReport`): SQNR chart linked to
    the graph and the source line, the layer table (sortable), and the float graph colored by the noise
    each layer introduced. `worst`: how many of the worst layers (by local SQNR) the note names."""

    def __init__(self, report, *, show_graph: bool = True, worst: int = 3, **kwargs):
        if not hasattr(report, "layers") or not hasattr(report, "worst"):
            raise TypeError(f"QuantizationView takes an etlab.devtools.QuantReport, got {type(report).__name__}")
        self.report = report
        self.rows = [dict(r) for r in report.layers.to_dict(orient="records")]
        self.worst_layers = list(report.worst(worst)["layer"]) if len(report.layers) else []
        self.graph = None
        if show_graph and report.float_graph is not None:
            self.graph = GraphView.from_models([graph_with_noise(report)], overlay="gap", height=480)
        self.figure = self._figure()
        self.plot = PlotView(self.figure)
        self.plot.on_click(lambda point: self.select((point.get("customdata") or [None])[0]))
        self.table = TableView(TABLE_COLUMNS, [
            {**{k: r.get(k) for k, _, _ in TABLE_COLUMNS}, "focus": {"name": r["layer"], "kind": GRAPH_KIND}}
            for r in self.rows], title="Layers (click a row to show it in the graph)", height=300)
        self.table.observe(lambda c: self.select(((c["new"] or {}).get("row") or {}).get("layer")), names="clicked")
        self.note = widgets.HTML(f"<p class='etlab-note'>{html.escape(self.summary_text())}</p>")
        self.details = widgets.HTML(self._details_html(self.worst_layers[0] if self.worst_layers else None))
        super().__init__([self.note, self.plot, self.details, self.table] + ([self.graph] if self.graph else []),
                         **kwargs)

    def summary_text(self) -> str:
        """One paragraph: the report's summary and the layers that introduced the most error, with the tools that keep
        them in float."""
        if not self.rows:
            return "No layer of the quantized program was joined to the float model."
        names = ", ".join(self.worst_layers)
        return (f"{self.report.summary()}. Worst by local error (what a layer introduced, not what it inherited): "
                f"{names}. Keep them in float with etlab.devtools.requantize_excluding / sensitivity_table.")

    def _details_html(self, layer: str | None) -> str:
        row = self._row(layer)
        if row is None:
            return ""
        folded = f" (with {', '.join(row['folded'])} folded in)" if row["folded"] else ""
        return (f"<div class='etlab-note' data-role='layer-details'><b>{html.escape(row['layer'])}</b> "
                f"{html.escape(row['op'])}{html.escape(folded)} in <code>{html.escape(row['module'] or '-')}</code>: "
                f"local SQNR {_db(row['local_sqnr'])} dB, SQNR {_db(row['sqnr'])} dB, inputs "
                f"{_db(row['input_sqnr'])} dB, cosine {row['cosine']:.5f}, max |err| {row['max_abs']:.3g}, range "
                f"[{row['min']:.3g}, {row['max']:.3g}]{', NaN ' + str(row['nan']) if row['nan'] else ''}"
                f"{', Inf ' + str(row['inf']) if row['inf'] else ''}<br>"
                f"<code>{html.escape(row['source'] or 'no source line recorded')}</code></div>")

    def text_lines(self, width: int) -> list[str]:
        """The summary and the layers that introduced the most error (TextForm: a plain REPL's repr)."""
        keys = ["layer", "local_sqnr", "sqnr", "input_sqnr", "op", "quantized", "cosine", "max_abs", "module",
                "order", "source"]
        return [wrap(self.summary_text(), width),
                *table_lines(self.table, width, keys=keys, sort_by="local_sqnr", descending=False)]

    def _figure(self) -> go.Figure:
        order = [r["order"] for r in self.rows]
        names = [[r["layer"]] for r in self.rows]
        hover = [f"<b>{html.escape(r['layer'])}</b> {html.escape(r['op'])}<br>{html.escape(r['module'])}<br>"
                 f"local {r['local_sqnr']:.2f} dB · total {r['sqnr']:.2f} dB<br>{html.escape(r['source'])}"
                 for r in self.rows]
        worst = set(self.worst_layers)
        fig = go.Figure()
        fig.add_trace(go.Bar(x=order, y=[_capped(r["local_sqnr"]) for r in self.rows], name="local SQNR (introduced)",
                             marker={"color": ["#e45756" if r["layer"] in worst else "#4c78a8" for r in self.rows]},
                             customdata=names, hovertext=hover, hoverinfo="text"))
        fig.add_trace(go.Scatter(x=order, y=[_capped(r["sqnr"]) for r in self.rows], name="SQNR (accumulated)",
                                 mode="lines+markers", line={"color": "#f58518"}, customdata=names,
                                 hovertext=hover, hoverinfo="text"))
        fig.update_layout(height=340, template="plotly_white", margin={"l": 60, "r": 20, "t": 40, "b": 40},
                          title=f"SQNR per layer (dB; higher is better, exact layers drawn at {SQNR_CAP:.0f})",
                          legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0.5}, bargap=0.15)
        fig.update_xaxes(title_text="layer (execution order)", tickvals=order,
                         ticktext=[r["layer"] for r in self.rows], tickangle=-60)
        fig.update_yaxes(title_text="dB")
        return fig

    def static_html(self) -> str:
        """A plain HTML copy (summary, details, the first 40 table rows) for front ends without the widget, such as a
        rendered notebook."""
        return (f"<p class='etlab-note'>{html.escape(self.summary_text())}</p>{self.details.value}"
                f"{self.table.static_html(max_rows=40)}")

    def html_fragments(self) -> list[_html.Fragment]:
        """The view in a page: chart, table and its own graph (exposed apart from the dashboard's graph,
        so a click here selects the layer in this graph)."""
        eid = _html.new_id("quant")
        plot = _html.plotly_fragment(self.figure, element_id=eid)
        plot.scripts.append(_FOCUS_SCRIPT.replace("__ID__", _html.json_for_script(eid)))
        parts = [_html.Fragment(f"<h2 style='font-size:15px'>Quantization</h2><p class='etlab-note'>"
                                f"{html.escape(self.summary_text())}</p>"), plot, self.table.html_fragment()]
        if self.graph is not None:
            parts.append(_html.anywidget_fragment(_html.graph_module_source(), self.graph.state(), what="GraphView",
                                                  expose=PAGE_GRAPH))
        return parts

    def save_html(self, path: str | os.PathLike, title: str = "Quantization") -> os.PathLike:
        """Writes the view as one offline HTML page (its pieces from `html_fragments()`, scripts inlined, no server or
        network needed) atomically to `path` and returns it."""
        return _html.write_page(path, _html.page(title, self.html_fragments()))


def quant_report_html(report) -> str:
    """The notebook repr of a QuantReport: the summary and the worst layers."""
    worst = report.worst(5)[["layer", "op", "module", "local_sqnr", "sqnr", "input_sqnr", "source"]]
    return (f"<div class='etlab-theme'><p>{html.escape(report.summary())}</p>"
            f"{worst.to_html(index=False, float_format=lambda v: f'{v:.2f}', classes='etlab-table')}</div>")


# --- over a dataset ----------------------------------------------------------------------------------------

DATASET_COLUMNS = [("order", "#", True), ("layer", "layer", False), ("op", "op", False), ("module", "module", False),
                   ("local_sqnr_p95", "local SQNR p95 (dB)", True), ("local_sqnr_mean", "local SQNR mean", True),
                   ("local_sqnr_min", "local SQNR worst", True), ("local_worst_input", "worst input", True),
                   ("sqnr_p95", "SQNR p95", True), ("sqnr_mean", "SQNR mean", True),
                   ("input_sqnr_p95", "inherited p95", True), ("max_abs_p95", "max |err| p95", True),
                   ("range_lo", "range used lo", True), ("range_hi", "range used hi", True),
                   ("seen_min", "seen min", True), ("seen_max", "seen max", True),
                   ("clipped_inputs", "inputs clipped", True), ("source", "source", False)]
INPUT_COLUMNS = [("input", "input", True), ("output_sqnr", "output SQNR (dB)", True),
                 ("output_cosine", "cosine", True), ("top1_agree", "top-1 agrees", True),
                 ("program_vs_torch", "program vs torch", True)]


def _quantiles(stream, qs=(0.05, 0.25, 0.5, 0.75)) -> list[float | None]:
    return [_capped(stream.quantile(q)) for q in qs]


def distribution_figure(report, metric: str = "local_sqnr") -> go.Figure:
    """Per layer, the distribution of `metric` over the inputs as a box (fences: the p95 SQNR, i.e. the 5th
    percentile, and the best input), from the report's streaming histograms; the worst input as a dot."""
    rows = [r for r in report.layers.to_dict(orient="records") if r["layer"] in report.distributions]
    fig = go.Figure()
    names, low, q1, med, q3, high, worst = [], [], [], [], [], [], []
    for r in rows:
        s = report.distributions[r["layer"]][metric]
        if not s.n:
            continue
        p5, a, m, b = _quantiles(s)
        names.append(r["layer"])
        low.append(p5)
        q1.append(a)
        med.append(m)
        q3.append(b)
        high.append(_capped(s.high))
        worst.append(_capped(s.low))
    fig.add_trace(go.Box(x=names, lowerfence=low, q1=q1, median=med, q3=q3, upperfence=high, name=metric,
                         marker={"color": "#4c78a8"}, customdata=[[n] for n in names], hoverinfo="x+y"))
    fig.add_trace(go.Scatter(x=names, y=worst, mode="markers", name="worst input", marker={"color": "#e45756"},
                             customdata=[[n] for n in names]))
    title = {"local_sqnr": "local SQNR per layer over the dataset (dB; box: quartiles, whiskers: p95 and best)",
             "sqnr": "SQNR per layer over the dataset (dB; accumulated)"}.get(metric, metric)
    fig.update_layout(height=360, template="plotly_white", margin={"l": 60, "r": 20, "t": 40, "b": 40}, title=title,
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0.5}, showlegend=True)
    fig.update_xaxes(title_text="layer (execution order)", tickangle=-60)
    fig.update_yaxes(title_text="dB")
    return fig


def coverage_figure(report) -> go.Figure:
    """Per calibrated activation, the range the quantizer holds (bar) against the range the dataset reached
    (markers); red where some input was clipped."""
    c = report.coverage
    labels = [str(x) for x in c["layer"]]
    clipped = [bool(v > 0) for v in c["clipped_inputs"]]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, base=list(c["range_lo"]), y=list(c["range_hi"] - c["range_lo"]),
                         name="range used (calibration)", marker={"color": "#9ecae9"},
                         customdata=[[x] for x in labels]))
    hover = [f"{html.escape(lbl)}: seen [{lo:.3g}, {hi:.3g}], used [{a:.3g}, {b:.3g}], inputs clipped {100 * p:.1f}%"
             for lbl, lo, hi, a, b, p in zip(labels, c["seen_min"], c["seen_max"], c["range_lo"], c["range_hi"],
                                             c["clipped_inputs"])]
    for key, name in (("seen_min", "seen min"), ("seen_max", "seen max")):
        fig.add_trace(go.Scatter(x=labels, y=list(c[key]), mode="markers", name=name, hovertext=hover,
                                 hoverinfo="text", customdata=[[x] for x in labels],
                                 marker={"color": ["#e45756" if k else "#4c78a8" for k in clipped], "size": 7}))
    fig.update_layout(height=320, template="plotly_white", margin={"l": 60, "r": 20, "t": 40, "b": 40},
                      title="Calibration coverage: range used vs range seen over the dataset (red: clipped)",
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0.5})
    fig.update_xaxes(tickangle=-60)
    return fig


class DatasetQuantizationView(_LayerView):
    """Quantization error over a dataset (an `etlab.devtools.DatasetQuantReport`): per-layer distributions of
    the local SQNR, calibration coverage, the layer table and the worst inputs. A click on a layer shows its
    numbers and source line (and selects it in the float graph when `show_graph`)."""

    def __init__(self, report, *, show_graph: bool = False, worst: int = 3, inputs: int = 20, **kwargs):
        if not hasattr(report, "distributions") or not hasattr(report, "per_input"):
            raise TypeError(f"DatasetQuantizationView takes an etlab.devtools.DatasetQuantReport, "
                            f"got {type(report).__name__}")
        self.report = report
        self.rows = [dict(r) for r in report.layers.to_dict(orient="records")]
        self.worst_layers = list(report.worst(worst)["layer"]) if len(report.layers) else []
        self.graph = None
        if show_graph and report.float_graph is not None:
            self.graph = GraphView.from_models([build_graph_model(report.float_graph, GRAPH_KIND,
                                                                  title="float model")], height=420)
        self.figure = distribution_figure(report)
        self.plot = PlotView(self.figure)
        self.coverage_plot = PlotView(coverage_figure(report))
        for plot in (self.plot, self.coverage_plot):
            plot.on_click(lambda point: self.select((point.get("customdata") or [None])[0]))
        self.table = TableView(DATASET_COLUMNS, [
            {**{k: r.get(k) for k, _, _ in DATASET_COLUMNS}, "focus": {"name": r["layer"], "kind": GRAPH_KIND}}
            for r in self.rows], title="Layers over the dataset (click a row)", height=300)
        self.table.observe(lambda c: self.select(((c["new"] or {}).get("row") or {}).get("layer")), names="clicked")
        worst_inputs = report.per_input.sort_values("output_sqnr", kind="stable").head(inputs)
        self.inputs_table = TableView(INPUT_COLUMNS, worst_inputs.to_dict(orient="records"),
                                      title=f"The {len(worst_inputs)} inputs with the lowest output SQNR", height=240)
        self.note = widgets.HTML(f"<p class='etlab-note'>{html.escape(report.summary())}</p>")
        self.details = widgets.HTML(self._details_html(self.worst_layers[0] if self.worst_layers else None))
        parts = [self.note, self.plot, self.details, self.coverage_plot, self.table, self.inputs_table]
        super().__init__(parts + ([self.graph] if self.graph else []), **kwargs)

    def _details_html(self, layer: str | None) -> str:
        row = self._row(layer)
        if row is None:
            return ""
        clip = ""
        if row["clipped_inputs"] == row["clipped_inputs"] and row["clipped_inputs"] > 0:
            clip = (f"; its output range [{row['range_lo']:.3g}, {row['range_hi']:.3g}] clipped on "
                    f"{100 * row['clipped_inputs']:.1f}% of the inputs (seen [{row['seen_min']:.3g}, "
                    f"{row['seen_max']:.3g}], first: input {row['first_clipped_input']})")
        return (f"<div class='etlab-note' data-role='layer-details'><b>{html.escape(row['layer'])}</b> "
                f"{html.escape(row['op'])} in <code>{html.escape(row['module'] or '-')}</code> over "
                f"{row['inputs']} inputs: local SQNR p95 {_db(row['local_sqnr_p95'])} dB, mean "
                f"{_db(row['local_sqnr_mean'])}, worst {_db(row['local_sqnr_min'])} (input "
                f"{row['local_worst_input']}); accumulated p95 {_db(row['sqnr_p95'])}, inherited p95 "
                f"{_db(row['input_sqnr_p95'])}{html.escape(clip)}<br>"
                f"<code>{html.escape(row['source'] or 'no source line recorded')}</code></div>")

    def text_lines(self, width: int) -> list[str]:
        """The summary, the layers with the lowest local SQNR (p95 over the inputs) and the inputs with the lowest
        output SQNR (TextForm: a plain REPL's repr)."""
        keys = ["layer", "local_sqnr_p95", "local_sqnr_mean", "sqnr_p95", "input_sqnr_p95", "clipped_inputs", "op",
                "local_sqnr_min", "local_worst_input", "module", "order", "source"]
        return [wrap(self.report.summary(), width),
                *table_lines(self.table, width, keys=keys, sort_by="local_sqnr_p95", descending=False),
                *table_lines(self.inputs_table, width, top=5, more="all: .inputs_table.rows")]

    def static_html(self) -> str:
        """A plain HTML copy (summary, details, both charts, the first rows of the layer and input tables) for front
        ends without the widget."""
        return (f"<p class='etlab-note'>{html.escape(self.report.summary())}</p>{self.details.value}"
                f"{self.plot.static_html()}{self.coverage_plot.static_html()}"
                f"{self.table.static_html(max_rows=40)}{self.inputs_table.static_html(max_rows=20)}")

    def html_fragments(self) -> list[_html.Fragment]:
        """The view's pieces for an offline page (the dashboard's tab or `save_html`): the heading with the input count,
        the summary, the SQNR distributions, calibration coverage, the layer table and the worst inputs; clicks keep
        working in the page through the shared glue script."""
        return [_html.Fragment(f"<h2 style='font-size:15px'>Quantization over {self.report.inputs} inputs</h2>"
                               f"<p class='etlab-note'>{html.escape(self.report.summary())}</p>"
                               f"{self.details.value}"),
                self.plot.html_fragment(), self.coverage_plot.html_fragment(), self.table.html_fragment(),
                self.inputs_table.html_fragment()]

    def save_html(self, path: str | os.PathLike, title: str = "Quantization over a dataset") -> os.PathLike:
        """Writes the view as one offline HTML page (its pieces from `html_fragments()`, scripts inlined, no server or
        network needed) atomically to `path` and returns it."""
        return _html.write_page(path, _html.page(title, self.html_fragments()))


def dataset_report_html(report) -> str:
    """The notebook repr of a DatasetQuantReport: the summary, the worst layers and the clipped ranges."""
    worst = report.worst(5)[["layer", "op", "module", "local_sqnr_p95", "local_sqnr_mean", "sqnr_p95",
                             "clipped_inputs", "source"]]
    clipped = report.clipped().head(5)[["node", "layer", "range_lo", "range_hi", "seen_min", "seen_max",
                                        "clipped_inputs"]]
    fmt = {"float_format": lambda v: f"{v:.3g}", "classes": "etlab-table", "index": False}
    return (f"<div class='etlab-theme'><p>{html.escape(report.summary())}</p>{worst.to_html(**fmt)}"
            + (f"<p>Calibrated ranges clipped on some inputs:</p>{clipped.to_html(**fmt)}" if len(clipped) else "")
            + "</div>")
