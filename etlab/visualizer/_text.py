"""The views' plain-text form: what a plain Python REPL (or IPython's terminal) prints for a view.

A view is an ipywidget: outside a notebook `repr(view)` was the widget's repr (the class and its traits,
kilobytes for the views holding graphs and figures) and IPython's terminal showed ipywidgets' text/plain,
cut at 110 characters. A view that mixes in `TextForm` (before the widget class) says what it shows in a
few lines instead: its `text_lines(width)` within the terminal's width, and the hint that the view itself
is for a notebook (or `save_html`). The tables go through etlab.inspector's `fit_frame`, as the CLI's do.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pandas as pd

from etlab.inspector import fit_frame, terminal_width
from etlab.visualizer import _html

TEXT_ROWS = 10  # rows of a table in the text form


class TextForm:
    """Mixin for a view (before the widget class in the bases): `repr(view)`, IPython's text/plain and
    `view.text(width)` are the view's text form; the view implements `text_lines(width)`. The mime
    bundle keeps the widget and its static HTML copy (`_html.with_static_fallback`)."""

    def text_lines(self, width: int) -> list[str]:
        """What the view shows, as lines of at most `width` characters."""
        raise NotImplementedError(f"{type(self).__name__} has no text form")

    def text(self, width: int | None = None) -> str:
        """The view outside a notebook, within `width` columns (the terminal's by default)."""
        width = width or terminal_width()
        return "\n".join([*self.text_lines(width), *notebook_hint(self, width)])

    def __repr__(self) -> str:
        try:
            return self.text()
        except Exception as e:  # a repr must not raise (a debugger, a log line): say why there is no text
            return f"<{type(self).__name__}: no text form ({type(e).__name__}: {e})>"

    def _repr_mimebundle_(self, **kwargs) -> Any:  # the widget's bundle: a dict, or a (data, metadata) pair
        bundle = _html.with_static_fallback(self, super()._repr_mimebundle_(**kwargs))  # type: ignore[misc]
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if data is not None:  # IPython's terminal shows text/plain (ipywidgets' own: the widget repr cut at 110)
            data["text/plain"] = repr(self)
        return bundle


def wrap(text: str, width: int, indent: str = "") -> str:
    """A sentence wrapped to `width`, continuation lines indented."""
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=True, break_on_hyphens=False)


def plain(markup: str) -> str:
    """Text of a chart title or hover label (plotly's <br>, <b>, <sup>... dropped, entities decoded)."""
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<br\s*/?>", " · ", markup or ""))).strip(" ·")


def figure_lines(fig, width: int) -> list[str]:
    """A plotly figure as text: its title and, per trace, its kind, name and how many points it draws (with the
    range of its values when they are numbers)."""
    title = plain(getattr(fig.layout.title, "text", None) or "")
    lines = [wrap(f"chart: {title or 'untitled'}", width)]
    for trace in fig.data:
        values = next((v for v in (getattr(trace, a, None) for a in ("values", "y", "x")) if v is not None), ())
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
        span = f", {min(numbers):.4g} to {max(numbers):.4g}" if numbers else ""
        lines.append(wrap(f"{trace.type} {trace.name or ''}".rstrip() + f": {len(values)} points{span}", width, "  "))
    return lines


def notebook_hint(view, width: int) -> list[str]:
    """The last line: the view is for a notebook (and, when it can write one, an offline page)."""
    page = ", or write it as one offline page with .save_html('view.html')" if hasattr(view, "save_html") else ""
    return [wrap(f"(a notebook view: display it in Jupyter{page})", width)]


def frame_lines(df: pd.DataFrame, width: int, *, flex: tuple[str, ...] = (), top: int | None = TEXT_ROWS,
                title: str = "", more: str = "") -> list[str]:
    """`df`'s first `top` rows as a table within `width` (etlab.inspector.fit_frame), under `title`, then a line
    saying how many rows and which columns were left out (`more`: where to get them all)."""
    lines = [wrap(title, width)] if title else []
    if not len(df):
        return [*lines, "  (no rows)"]
    shown = df if top is None else df.head(top)
    table, left_out = fit_frame(shown, width, flex)
    notes = [f"{len(shown)} of {len(df)} rows"] if len(shown) < len(df) else []
    if left_out:
        notes.append(f"columns left out: {', '.join(left_out)}")
    if notes and more:
        notes.append(more)
    return lines + table + ([wrap(f"({'; '.join(notes)})", width)] if notes else [])


def table_frame(columns: list[dict], rows: list[dict]) -> pd.DataFrame:
    """A TableView's rows as a frame with its column labels (each row's `focus` left out)."""
    keys = [c["key"] for c in columns]
    df = pd.DataFrame([{k: r.get(k) for k in keys} for r in rows], columns=keys)
    for c in columns:
        if c["numeric"]:  # None (NaN, inf in the widget's JSON) as an empty cell, the column right-aligned
            df[c["key"]] = pd.to_numeric(df[c["key"]], errors="coerce")
    return df.rename(columns={c["key"]: c["label"] for c in columns})


def table_lines(table, width: int, *, keys: list[str] | None = None, top: int | None = TEXT_ROWS,
                sort_by: str | None = None, descending: bool = True, more: str = "all: .table.rows") -> list[str]:
    """A TableView as text: its title, then `frame_lines` over its labelled columns (`keys`: which, in this
    order, the most telling first: the last ones are left out first on a narrow terminal; text columns may be
    cut); with `sort_by` (a column key) the rows by that value (largest first unless not `descending`; rows
    without a number last), else in the table's order."""
    columns = [c for c in table.columns if keys is None or c["key"] in keys]
    if keys is not None:
        columns.sort(key=lambda c: keys.index(c["key"]))
    rows = list(table.rows)
    title = table.title
    if sort_by is not None:
        number = lambda r: isinstance(r.get(sort_by), (int, float)) and r.get(sort_by) == r.get(sort_by)
        rows = sorted((r for r in rows if number(r)), key=lambda r: r[sort_by], reverse=descending) + \
            [r for r in rows if not number(r)]
        label = next((c["label"] for c in table.columns if c["key"] == sort_by), sort_by)
        order = f"{'largest' if descending else 'smallest'} {label} first"
        title = f"{title}; {order}" if title else order
    flex = tuple(c["label"] for c in columns if not c["numeric"])
    return frame_lines(table_frame(columns, rows), width, flex=flex, top=top, title=title, more=more)
