"""TableView: a sortable, filterable table widget (anywidget + static/table_view.js)."""

from __future__ import annotations

import html
import math

import anywidget
import traitlets

from etlab.inspector import cell_text
from etlab.visualizer import _html
from etlab.visualizer._text import TextForm, table_lines


def _clean(v):
    """JSON-safe cell values (NaN/inf -> None, numpy scalars -> Python)."""
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict)):
        try:
            v = v.item()
        except (ValueError, AttributeError):
            v = str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


class TableView(TextForm, anywidget.AnyWidget):
    """Rows with sortable columns and a filter box; a click sets `clicked` (and, in a page,
    sends the row's `focus` to the graph)."""

    _esm = traitlets.Unicode(_html.table_module_source()).tag(sync=True)
    _css = traitlets.Unicode(_html.theme_css()).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    columns = traitlets.List(traitlets.Dict()).tag(sync=True)
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    height = traitlets.Int(360).tag(sync=True)
    clicked = traitlets.Dict(default_value={}).tag(sync=True)

    def __init__(self, columns: list[tuple[str, str, bool]], rows: list[dict], *, title: str = "",
                 height: int = 360, **kwargs):
        """columns: (key, label, numeric) triples; rows: dicts (a `focus` key makes a row clickable)."""
        cols = [{"key": k, "label": label, "numeric": bool(num)} for k, label, num in columns]
        super().__init__(columns=cols, rows=[_clean(r) for r in rows], title=title, height=height, **kwargs)

    def state(self) -> dict:
        """The widget's synced state (columns, rows, title, height, no click yet), which the saved page inlines too."""
        return {"columns": self.columns, "rows": self.rows, "title": self.title, "height": self.height,
                "clicked": {}}

    def static_html(self, max_rows: int = 100) -> str:
        """The rows as a plain HTML table (the first `max_rows`), each cell as the terminal's tables write it
        (etlab.inspector.cell_text: the same digits as the text form)."""
        head = "".join(f"<th>{html.escape(c['label'])}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell_text(r.get(c['key'])))}</td>" for c in self.columns)
                       + "</tr>" for r in self.rows[:max_rows])
        more = f"<p>… {len(self.rows) - max_rows} more rows</p>" if len(self.rows) > max_rows else ""
        title = f"<p><b>{html.escape(self.title)}</b></p>" if self.title else ""
        return f"{title}<table class='etlab-table'><tr>{head}</tr>{body}</table>{more}"

    def text_lines(self, width: int) -> list[str]:
        """The title and the first rows (TextForm: a plain REPL's repr)."""
        return table_lines(self, width, more="all: .rows")

    def html_fragment(self) -> _html.Fragment:
        """The table as a page piece: the same view module as the widget with the rows inlined, so sorting and filtering
        work offline."""
        return _html.anywidget_fragment(_html.table_module_source(), self.state(), what="TableView")
