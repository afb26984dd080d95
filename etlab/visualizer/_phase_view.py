"""PhaseView: an LLM-shaped profile, prefill and decode as phases (the dashboard's Phases tab).

A table with one row per method (`etlab.inspector.phases`: runs, tokens per run, latency and
per-token latency p50/p90/p99, tokens/s), a chart of the per-token latency of every run by phase
(a box per phase with each run as a point: the decode distribution, the prefill latency per prompt
token), and the KV cache each method plans (`etlab.devtools.kv_cache_dataframe`) as a legend entry.
"""

from __future__ import annotations

import os

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from etlab.visualizer import _html
from etlab.visualizer._plot_view import PlotView
from etlab.visualizer._table import TableView
from etlab.visualizer._text import TextForm, table_lines

PHASE_COLORS = {"prefill": "#f58518", "decode": "#4c78a8"}
KV_COLOR = "#b279a2"


def phase_frames(inspector, program) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(phases table, KV-cache table) of a run and its program; the KV table is empty when the
    program is not a compiled program manager (a .pte has no record of which buffers are mutable)."""
    from etlab.inspector import phases

    table = phases(inspector, program)
    try:
        from etlab.devtools import kv_cache_dataframe

        kv = kv_cache_dataframe(program)
    except (AttributeError, TypeError, ValueError, KeyError):
        kv = pd.DataFrame(columns=["method", "buffer", "tensor", "role", "bytes"])
        kv.attrs["kv_cache_bytes"] = {}
    return table, kv


def phase_figure(table: pd.DataFrame, kv: pd.DataFrame) -> go.Figure:
    """Per-token latency of every run, one box per method (points shown), KV-cache bytes in the legend."""
    unit = table.attrs.get("unit", "ms")
    runs = table.attrs.get("runs", pd.DataFrame())
    kv_bytes = kv.attrs.get("kv_cache_bytes", {})
    fig = go.Figure()
    for row in table.to_dict("records"):
        method, phase = row["method"], row["phase"]
        part = runs[runs["method"] == method] if len(runs) else runs
        kv_b = kv_bytes.get(method)
        fig.add_trace(go.Box(
            y=part["latency_per_token"] if len(part) else [], name=f"{method} ({phase})",
            boxpoints="all", jitter=0.3, pointpos=0, marker={"color": PHASE_COLORS.get(phase, "#54a24b")},
            hovertemplate=f"{method}: %{{y:.4g}} {unit}/token<extra></extra>",
            legendgroup=method, showlegend=True,
            meta={"etlab": "phase", "method": method, "tokens_per_run": int(row["tokens_per_run"])},
        ))
        if kv_b:  # a legend entry for the method's KV cache (bytes), the band the memory view draws
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker={"color": KV_COLOR, "symbol": "square"},
                                     name=f"{method} KV cache: {kv_b:,} bytes",
                                     legendgroup=method, meta={"etlab": "kv_cache", "bytes": int(kv_b)}))
    fig.update_layout(title=f"latency per token by phase ({unit}/token; prefill: per prompt token)",
                      yaxis_title=f"{unit} per token", template="plotly_white", height=420,
                      margin={"l": 70, "r": 20, "t": 60, "b": 60},
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.12, "yanchor": "top"})
    return fig


_COLUMNS = [("method", "method", False), ("phase", "phase", False), ("runs", "runs", True),
            ("tokens_per_run", "tokens/run", True), ("latency_p50", "latency p50", True),
            ("latency_p90", "latency p90", True), ("latency_p99", "latency p99", True),
            ("per_token_p50", "per token p50", True), ("per_token_p90", "per token p90", True),
            ("per_token_p99", "per token p99", True), ("tokens_per_s", "tokens/s", True),
            ("kv_cache_bytes", "KV cache bytes", True)]


class PhaseView(TextForm, widgets.VBox):
    """Prefill and decode of one ETDump as phases: `.data` (phases table, with `kv_cache_bytes`), `.kv`
    (the mutable buffers), `.figure`; `save_html(path)` writes an offline page."""

    def __init__(self, inspector, program, **kwargs):
        self.data, self.kv = phase_frames(inspector, program)
        if self.data.empty:
            raise ValueError("no execution block of the run could be attributed to a method of the program")
        kv_bytes = self.kv.attrs.get("kv_cache_bytes", {})
        self.data["kv_cache_bytes"] = [int(kv_bytes.get(m, 0)) for m in self.data["method"]]
        self.figure = phase_figure(self.data, self.kv)
        unit = self.data.attrs.get("unit", "ms")
        self.table = TableView(_COLUMNS, self.data.to_dict("records"), title=f"phases (times in {unit})",
                               height=160)
        super().__init__([self.table, PlotView(self.figure)], **kwargs)

    def text_lines(self, width: int) -> list[str]:
        """The phases table: latency and per-token percentiles, tokens/s per method (TextForm: a plain REPL's repr)."""
        keys = ["method", "phase", "runs", "tokens_per_run", "latency_p50", "per_token_p50", "tokens_per_s",
                "kv_cache_bytes", "latency_p90", "per_token_p90", "latency_p99", "per_token_p99"]  # p90/p99 cut first
        return table_lines(self.table, width, keys=keys, more="all: .data")

    @staticmethod
    def applies(program) -> bool:
        """Whether the program has a prefill or decode method (the dashboard shows the tab then)."""
        from etlab.inspector import phase_of

        methods = getattr(program, "methods", None)
        return bool(methods) and any(phase_of(m) in ("prefill", "decode") for m in methods)

    def html_fragments(self) -> list[_html.Fragment]:
        """The view's pieces for an offline page (the dashboard's tab or `save_html`): the phases table and the
        per-token latency chart; clicks keep working in the page through the shared glue script."""
        plot = _html.plotly_fragment(self.figure, element_id=_html.new_id("phases"))
        plot.body = f'<div data-etlab-view="phases" data-methods="{len(self.data)}">{plot.body}</div>'
        return [self.table.html_fragment(), plot]

    def save_html(self, path: str | os.PathLike, title: str = "Phases") -> os.PathLike:
        """Writes the view as one offline HTML page (its pieces from `html_fragments()`, scripts inlined, no server or
        network needed) atomically to `path` and returns it."""
        return _html.write_page(path, _html.page(title, self.html_fragments()))
