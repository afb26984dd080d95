"""One rule for a table cell (etlab.inspector.cell_text), on every surface a user reads a table: the terminal's
(`etlab inspect`, run as a user runs it), a view's text form and a TableView's plain HTML show the same digits."""

from __future__ import annotations

import html
import math
import os
import re
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from etlab.inspector import Inspector, cell_text
from etlab.inspector._terminal import short_ops
from etlab.schema.etdump import OPERATOR_CALL


@pytest.mark.parametrize("value, text", [
    (1.23456789, "1.235"),                 # a measurement: 4 significant digits
    (0.000123456, "0.0001235"),            # a short duration (ms) keeps its 4 digits
    (12345.6, "1.235e+04"),
    (np.float32(0.123456789), "0.1235"),   # numpy floats as Python's (not float32's own repr)
    (3.0, "3"),
    (123456.0, "123456"),                  # a whole number: all its digits, also as a float
    (123456, "123456"),
    (np.int64(7), "7"),
    (-0.0, "0"),
    (float("inf"), "inf"),
    (None, ""),                            # missing: empty
    (float("nan"), ""),
    (np.float64("nan"), ""),
    (pd.NA, ""),
    (pd.NaT, ""),
    (True, "True"),
    (np.bool_(False), "False"),
    ("a <b>", "a <b>"),                    # text as it is (the HTML table escapes it)
    ([1, 3, 224, 224], "1, 3, 224, 224"),  # a list: its items by the same rule
    ((0.5, 1.23456), "0.5, 1.235"),
    ([[1, 2], [3]], "[1, 2], [3]"),
    (np.array([1.5, 2.25]), "1.5, 2.25"),
    ([], ""),
])
def test_cell_text(value, text):
    assert cell_text(value) == text


def _columns(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """A tabulate "simple" table's heads and cells, cut at the dashes under each head (cells keep any spaces
    inside them)."""
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    cut = lambda line: [line[a:b].strip() if k < len(spans) - 1 else line[a:].strip()
                        for k, (a, b) in enumerate(spans)]
    return cut(lines[0]), [cut(line) for line in lines[2:]]


def _html_cells(markup: str) -> list[list[str]]:
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", markup) if "<td>" in row]


def test_a_table_view_writes_the_same_cells_in_html_and_as_text():
    """The plain HTML copy (static_html) and the text form (text_lines, through etlab.inspector.fit_frame) of one
    TableView: the same strings cell for cell, also in a numeric column with a missing cell (pandas makes it float
    for the text form: 123456 must not turn 1.235e+05 there)."""
    from etlab.visualizer import TableView

    rows = [{"name": "conv <1>", "p50": 1.23456789, "bytes": 123456, "shape": [1, 3, 224, 224]},
            {"name": "relu", "p50": float("nan"), "bytes": None, "shape": []},
            {"name": "mm", "p50": 0.000123456, "bytes": 2048, "shape": [4, 8]},
            {"name": "add", "p50": 3.0, "bytes": 7, "shape": (4,)},
            {"name": "cat", "p50": 12345.6, "bytes": 0, "shape": [2]}]
    view = TableView([("name", "event", False), ("p50", "p50 (ms)", True), ("bytes", "bytes", True),
                      ("shape", "shape", False)], rows)
    shown = _html_cells(view.static_html())
    assert shown == [["conv <1>", "1.235", "123456", "1, 3, 224, 224"], ["relu", "", "", ""],
                     ["mm", "0.0001235", "2048", "4, 8"], ["add", "3", "7", "4"], ["cat", "1.235e+04", "0", "2"]]
    assert "conv &lt;1&gt;" in view.static_html()
    heads, text = _columns(view.text_lines(200))
    assert heads == ["event", "p50 (ms)", "bytes", "shape"]
    assert text == shown


def _significant_digits(text: str) -> int:
    return len(Decimal(text).normalize().as_tuple().digits)


def test_etlab_inspect_and_the_profile_view_show_the_same_numbers(delegate_runs):
    """`etlab inspect` (a child process, as a user runs it) writes each event's p50 / avg / max to 4 significant
    digits of the frame's value (empty where there is none), and the notebook's profile table (ProfileView's plain
    HTML copy) writes the same strings for the same events."""
    from etlab.visualizer import ProfileView
    from tests._cli_batch import run_etlab

    d = delegate_runs["cnn"]
    [r] = run_etlab([["inspect", d / "run.etdp", "--etrecord", d / "model.etrecord", "--all"]],
                    env={**os.environ, "COLUMNS": "400"})
    assert r["status"] == 0, r["stderr"]
    heads, cells = _columns(r["stdout"].splitlines())
    assert heads[:5] == ["block", "event", "p50 (ms)", "avg (ms)", "max (ms)"]

    ins = Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord"))
    df = ins.to_dataframe()
    df = df[df["event_name"].astype(str) != OPERATOR_CALL].reset_index(drop=True)
    assert [c[1] for c in cells] == df["event_name"].astype(str).tolist()
    checked = 0
    for row, (_, frame) in zip(cells, df.iterrows(), strict=True):
        for cell, column in zip(row[2:5], ("p50 (ms)", "avg (ms)", "max (ms)"), strict=True):
            value = frame[column]
            if value is None or math.isnan(value):
                assert cell == ""
                continue
            assert float(cell) == pytest.approx(value, rel=5e-4, abs=0.0), (row, column)
            assert _significant_digits(cell) <= 4 or float(value).is_integer(), (row, column)
            checked += 1
    assert checked >= 3 * 5

    view = ProfileView(ins)  # its rows: the events with operators, in the order the terminal lists them
    labels = [c["label"] for c in view.table.columns]
    html_rows = _html_cells(view.table.static_html(max_rows=10_000))
    timed = [row for row in cells if row[heads.index("ops")]]  # not Method::execute and the like
    assert len(html_rows) == len(timed) >= 5
    for row, h in zip(timed, html_rows, strict=True):
        assert short_ops(h[labels.index("ops")].split(", ")) == row[heads.index("ops")]  # the same event
        assert [h[labels.index(k)] for k in ("p50 (ms)", "avg (ms)", "max (ms)")] == row[2:5], (row, h)
