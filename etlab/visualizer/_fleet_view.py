"""The notebook view of a fleet diff (`etlab.fleet.FleetDiff.view()`): a sortable table and the p50
change per op with its interval.

In a notebook it is a widget (TableView and PlotView); `save_html(path)` writes the same as one
offline page. A graph overlay is not drawn: a fleet store has no program graph, only op names and
handles.
"""

from __future__ import annotations

import math
import os

import ipywidgets as widgets
import plotly.graph_objects as go

from etlab.visualizer import _html
from etlab.visualizer._plot_view import PlotView
from etlab.visualizer._table import TableView
from etlab.visualizer._text import TextForm, table_lines

FLAG_COLORS = {"regression": "#d62728", "improvement": "#2ca02c", "": "#7f7f7f"}


def _label(row, cols: list[str]) -> str:
    return " · ".join(str(row[c]) for c in cols)


def diff_rows(result) -> tuple[list[tuple[str, str, bool]], list[dict]]:
    """TableView columns and rows of a FleetDiff (times in microseconds, memory in KiB, changes in percent)."""
    cols = [*result.strata, *result.key]
    memory = getattr(result, "metric", "time") == "memory"
    unit, source, scale = ("KiB", "bytes", 1024) if memory else ("us", "ns", 1e3)
    columns = [(c, c, False) for c in cols] + [
        ("n_base", "runs base", True), ("n_head", "runs head", True), ("p50_base_us", f"p50 base ({unit})", True),
        ("p50_head_us", f"p50 head ({unit})", True), ("change_pct", "p50 change (%)", True),
        ("ci_low_pct", "CI low (%)", True), ("ci_high_pct", "CI high (%)", True),
        ("p_adjusted", "p (Holm)", True), ("flag", "flag", False)]
    rows = []
    for _, r in result.table.iterrows():
        rows.append({**{c: str(r[c]) for c in cols}, "n_base": int(r["n_base"]), "n_head": int(r["n_head"]),
                     "p50_base_us": r[f"p50_base_{source}"] / scale, "p50_head_us": r[f"p50_head_{source}"] / scale,
                     "change_pct": 100 * r["change"], "ci_low_pct": 100 * r["ci_low"],
                     "ci_high_pct": 100 * r["ci_high"], "p_adjusted": r["p_adjusted"], "flag": r["flag"]})
    rows.sort(key=lambda d: -d["change_pct"] if math.isfinite(d["change_pct"]) else math.inf)
    return columns, rows


def change_figure(result) -> go.Figure:
    """p50 change per op (dots) with its confidence interval (bars), colored by flag, threshold lines."""
    cols = [*result.strata, *result.key]
    t = result.table.sort_values("change", na_position="first")
    labels = [_label(r, cols) for _, r in t.iterrows()]
    fig = go.Figure(go.Scatter(
        x=100 * t["change"], y=labels, mode="markers",
        marker={"color": [FLAG_COLORS.get(f, "#7f7f7f") for f in t["flag"]], "size": 9},
        error_x={"type": "data", "symmetric": False, "array": 100 * (t["ci_high"] - t["change"]),
                 "arrayminus": 100 * (t["change"] - t["ci_low"]), "thickness": 1.5},
        hovertext=[f"{lab}<br>{100 * c:+.1f}% [{100 * lo:+.1f}%, {100 * hi:+.1f}%] p={p:.2g} {f}"
                   for lab, c, lo, hi, p, f in zip(labels, t["change"], t["ci_low"], t["ci_high"],
                                                   t["p_adjusted"], t["flag"])],
        hoverinfo="text"))
    for x in (-100 * result.threshold, 0.0, 100 * result.threshold):
        fig.add_vline(x=x, line={"dash": "dot" if x else "solid", "color": "#999", "width": 1})
    sel = lambda s: ",".join(f"{k}={v}" for k, v in s.items())
    fig.update_layout(
        title=f"p50 change, {sel(result.head)} vs {sel(result.base)} ({int(result.level * 100)}% bootstrap "
              f"interval; red: regression, green: improvement)",
        xaxis_title="p50 change (%)", template="plotly_white", height=160 + 24 * len(labels),
        margin={"l": 220, "r": 20, "t": 60, "b": 40})
    return fig


class FleetDiffView(TextForm, widgets.VBox):
    """A FleetDiff in a notebook: sortable table above the change chart."""

    def __init__(self, result, **kwargs):
        self.result = result
        self.columns, self.rows = diff_rows(result)
        self.figure = change_figure(result)
        self.table = TableView(self.columns, self.rows, title=result.format().splitlines()[0], height=320)
        super().__init__([self.table, PlotView(self.figure)], **kwargs)

    def text_lines(self, width: int) -> list[str]:
        """The comparison's verdict and its rows, flagged first (TextForm: a plain REPL's repr)."""
        return table_lines(self.table, width, sort_by="change_pct", keys=[
            *(c for c, _, _ in self.columns[:-9]), "change_pct", "flag", "p50_base_us", "p50_head_us", "ci_low_pct",
            "ci_high_pct", "p_adjusted", "n_base", "n_head"])

    def save_html(self, path: str | os.PathLike, title: str = "etlab fleet diff") -> os.PathLike:
        """Writes the view as one offline HTML file (atomically); returns the path."""
        frags = [self.table.html_fragment(), _html.plotly_fragment(self.figure)]
        return _html.write_page(path, _html.page(title, frags))
