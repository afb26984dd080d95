"""The notebook view of a fleet diff: a sortable table and the p50 change per op with its interval.

In a notebook it is a widget: the table (sorted by the column picked above it) and a plotly chart.
`etlab.fleet` sits below `etlab.visualizer` in the layering, so the view is built from ipywidgets
and plotly directly. `save_html(path)` writes the same as one offline page (plotly.js inlined, a
table sortable by clicking a header). A graph overlay is not drawn: a fleet store has no program
graph, only op names and handles.
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets
import plotly.graph_objects as go

from etlab.schema import write_atomic

FLAG_COLORS = {"regression": "#d62728", "improvement": "#2ca02c", "": "#7f7f7f"}


def _label(row, cols: list[str]) -> str:
    return " · ".join(str(row[c]) for c in cols)


def diff_rows(result) -> tuple[list[tuple[str, str, bool]], list[dict]]:
    """TableView columns and rows of a FleetDiff (times in microseconds, changes in percent)."""
    cols = [*result.strata, *result.key]
    columns = [(c, c, False) for c in cols] + [
        ("n_base", "runs base", True), ("n_head", "runs head", True), ("p50_base_us", "p50 base (us)", True),
        ("p50_head_us", "p50 head (us)", True), ("change_pct", "p50 change (%)", True),
        ("ci_low_pct", "CI low (%)", True), ("ci_high_pct", "CI high (%)", True),
        ("p_adjusted", "p (Holm)", True), ("flag", "flag", False)]
    rows = []
    for _, r in result.table.iterrows():
        rows.append({**{c: str(r[c]) for c in cols}, "n_base": int(r["n_base"]), "n_head": int(r["n_head"]),
                     "p50_base_us": r["p50_base_ns"] / 1e3, "p50_head_us": r["p50_head_ns"] / 1e3,
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


def _page(result, columns, rows, fig: go.Figure) -> str:
    """One self-contained HTML page: the table (click a header to sort) and the chart."""
    sort_js = """
document.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
  const tb = th.closest('table').tBodies[0], num = th.dataset.num === '1';
  const dir = th.dataset.dir = th.dataset.dir === 'asc' ? 'desc' : 'asc';
  const key = tr => { const t = tr.cells[i].textContent; return num ? (t === '' ? -Infinity : +t) : t; };
  [...tb.rows].sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (dir === 'asc' ? 1 : -1))
    .forEach(tr => tb.appendChild(tr));
}));"""
    title = html.escape(result.format().splitlines()[0])
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>etlab fleet diff</title><style>"
            "body{font-family:sans-serif;margin:16px} table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ddd;padding:3px 8px} th{cursor:pointer;background:#f4f4f4}"
            "</style></head><body>"
            f"<h3>{title}</h3>{table_html(columns, rows)}"
            f"{fig.to_html(full_html=False, include_plotlyjs=True)}<script>{sort_js}</script></body></html>")


def table_html(columns, rows) -> str:
    """The rows as an HTML table (header cells carry data-num for the page's sort script)."""
    head = "".join(f"<th data-num='{int(num)}'>{html.escape(label)}</th>" for _, label, num in columns)

    def cell(v) -> str:
        if isinstance(v, float):
            return "" if not math.isfinite(v) else f"{v:.4g}"
        return html.escape(str(v))

    body = "".join("<tr>" + "".join(f"<td>{cell(r[k])}</td>" for k, _, _ in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def sorted_rows(rows: list[dict], key: str, descending: bool) -> list[dict]:
    """Rows sorted by one column; missing values (None, NaN) last either way."""
    def missing(v) -> bool:
        return v is None or (isinstance(v, float) and not math.isfinite(v))

    present = [r for r in rows if not missing(r[key])]
    return sorted(present, key=lambda r: r[key], reverse=descending) + [r for r in rows if missing(r[key])]


class DiffView(widgets.VBox):
    """A FleetDiff in a notebook: the table, sortable by any column, above the change chart."""

    def __init__(self, result, **kwargs):
        self.result = result
        self.columns, self.rows = diff_rows(result)
        self.figure = change_figure(result)
        self.sort_by = widgets.Dropdown(options=[(label, k) for k, label, _ in self.columns], value="change_pct",
                                        description="sort by")
        self.descending = widgets.ToggleButton(value=True, description="descending")
        self.table = widgets.HTML()
        self.sort_by.observe(self._render, names="value")
        self.descending.observe(self._render, names="value")
        self._render()
        title = widgets.HTML(f"<b>{html.escape(result.format().splitlines()[0])}</b>")
        super().__init__([title, widgets.HBox([self.sort_by, self.descending]), self.table,
                          go.FigureWidget(self.figure)], **kwargs)

    def _render(self, _change=None) -> None:
        rows = sorted_rows(self.rows, self.sort_by.value, self.descending.value)
        self.table.value = f"<div style='max-height:360px;overflow:auto'>{table_html(self.columns, rows)}</div>"

    def save_html(self, path):
        """Writes the view as one offline HTML file (atomically); returns the path."""
        return write_atomic(path, _page(self.result, self.columns, self.rows, self.figure).encode("utf-8"))
