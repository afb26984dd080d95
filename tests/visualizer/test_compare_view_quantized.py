"""CompareView of a float build against its int8 static build (rows joined by module + op): the
table says how each row joined, the graph is the quantized build's and each row sits on its own
nodes there; as a static page and in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchao")

from etlab.visualizer import CompareView, GraphView
from tests.inspector._quant_builds import PLANTED, planted_pair
from tests.visualizer.test_browser import Page, browser  # noqa: F401  (browser: the module's Chromium fixture)


@pytest.fixture(scope="module")
def comparison():
    p = planted_pair("cnn")
    return p.float.compare(p.int8, name_a="float", name_b="int8")


def test_rows_say_how_they_joined_and_sit_on_the_quantized_graph(comparison, tmp_path):
    c = comparison
    view = c.show(overlay="numeric")
    assert isinstance(view, CompareView) and isinstance(view.graph, GraphView)
    assert view.models[0].title.endswith("drawn on B's graph")
    assert len(view.table.rows) == len(c.rows) and {r["join"] for r in view.table.rows} == {"module+op"}
    by_key = {r["key"]: r for r in view.table.rows}
    planted = next(r for r in c.rows if r.key == PLANTED["cnn"][1])
    assert by_key[planted.key]["focus"]["handles"] == list(planted.handles_b)
    assert by_key[planted.key]["added_error"] == pytest.approx(planted.added_error)
    # B's nodes of the planted row carry its delta; A's handles (another graph's numbering) place nothing
    nodes = {h: n for n in view.models[0].nodes for h in n.handles}
    assert all(nodes[h].gap == pytest.approx(planted.max_abs) for h in planted.handles_b if h in nodes)
    relu = next(n for n in view.models[0].nodes
                if n.op == "aten.hardtanh.default" and set(n.handles) & set(planted.handles_b))
    assert relu.gap == pytest.approx(planted.max_abs)
    elsewhere = [nodes[h] for h in set(planted.handles_a) - set(planted.handles_b) if h in nodes]
    assert elsewhere and all(planted.key not in (n.latency or {}).get("events", []) for n in elsewhere)
    # the row-by-row numeric chart: its tallest bar (error added) is the planted layer, a click selects B's node
    bars = view.numeric.data[0]
    assert list(bars.x) == [r.key for r in c.rows if r.relative is not None]
    assert bars.x[max(range(len(bars.y)), key=lambda i: bars.y[i])] == planted.key
    assert list(bars.customdata[list(bars.x).index(planted.key)][1]) == list(planted.handles_b)
    folded = next(r for r in c.rows if "folded in" in r.join_note)
    assert "folded in" in by_key[folded.key]["note"]
    page = Path(view.save_html(tmp_path / "q.html")).read_text()
    assert "module+op" in page and planted.key in page and "biggest numeric change" in page
    assert "numeric difference per row" in page
    assert "joined by module+op" in c._repr_html_()


@pytest.mark.xdist_group("browser")
def test_quantized_compare_report_in_chromium(browser, comparison, tmp_path):  # noqa: F811  (the imported fixture)
    c = comparison
    page = Page(browser, Path(c.save_html(tmp_path / "compare_q.html")))
    p = page.page
    page.wait_ready()
    assert p.locator("[data-etlab-view=compare]").get_attribute("data-rows") == str(len(c.rows))
    assert p.locator(".etlab-tv tr.row").count() == len(c.rows)
    # clicking the planted row selects its quantized-graph node, whose details carry the row
    i = next(i for i, r in enumerate(c.rows) if r.key == PLANTED["cnn"][1])
    p.locator(".etlab-tv tr.row").nth(i).click()
    p.wait_for_function("document.querySelector('[data-role=details-name]')?.textContent.length > 0")
    assert c.rows[i].key in p.locator("[data-role=details]").inner_text()
    page.shot("compare_quantized")
    assert page.errors == [] and page.requests == []
    p.close()
