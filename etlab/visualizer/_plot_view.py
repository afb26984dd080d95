"""PlotView: a plotly figure as a widget whose state is the figure's JSON only.

plotly's own FigureWidget carries plotly.js (about 5 MB) in every widget's state, so a notebook with
a few charts weighs tens of MB and sends the library once per chart. Here the front end loads
plotly.js once per page (static/shared_lib.js) and each chart sends only its data.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anywidget
import plotly.graph_objects as go
import traitlets

from etlab.visualizer import _html
from etlab.visualizer._figure_svg import figure_svg
from etlab.visualizer._text import TextForm, figure_lines


def _figure_json(fig: go.Figure) -> dict:
    return json.loads(fig.to_json() or "{}")  # plotly's encoder: numpy arrays, dates, NaN as null


class PlotView(TextForm, anywidget.AnyWidget):
    """A plotly figure; `update(fig)` redraws it, `on_click(fn)` calls fn(point) for a clicked point
    (`{"curve", "index", "customdata", "label", "id"}`)."""

    _esm = traitlets.Unicode(_html.plot_module_source()).tag(sync=True)
    _css = traitlets.Unicode(_html.theme_css()).tag(sync=True)
    figure = traitlets.Dict().tag(sync=True)
    clicked = traitlets.Dict(default_value={}).tag(sync=True)

    def __init__(self, fig: go.Figure, **kwargs):
        if not isinstance(fig, go.Figure):
            raise TypeError(f"PlotView takes a plotly Figure, got {type(fig).__name__}")
        self.fig = fig
        super().__init__(figure=_figure_json(fig), **kwargs)
        _html.serve_libraries(self)

    def update(self, fig: go.Figure) -> None:
        """Replaces the figure; the front end redraws from the synced JSON without re-creating the widget (the threshold
        slider uses it)."""
        self.fig = fig
        self.figure = _figure_json(fig)

    def on_click(self, callback: Callable[[dict], None]) -> None:
        """Calls `callback(point)` for each clicked point (curve, index, customdata, label, id): how a chart selects a
        node in the graph."""
        self.observe(lambda change: change["new"] and callback(change["new"]), names="clicked")

    def static_html(self) -> str:
        """The chart as an SVG (`figure_svg`): what a saved notebook shows once its kernel is gone."""
        return figure_svg(self.fig)

    def text_lines(self, width: int) -> list[str]:
        """The chart's title and its traces (TextForm: a plain REPL's repr)."""
        return figure_lines(self.fig, width)

    def html_fragment(self) -> _html.Fragment:
        """The chart as a page piece (plotly.js loaded once by the page)."""
        return _html.plotly_fragment(self.fig)
