"""Keyboard and screen-reader access of the exported views in headless Chromium (issue 25, items 5 and 9):
Tab reaches graph nodes and table rows, arrows move, Enter selects, Escape leaves; tooltips on focus; a
visible focus ring; node text >= 4.5:1 on every overlay color; axe-core (npm) finds no serious or critical
violation in light and dark; one wheel notch zooms a bounded step; search prefers ops and names to module
paths; big graphs get a minimap that pans. Screenshots go to /tmp/etlab_screens (a11y_*)."""

from __future__ import annotations

import re

import pytest

from etlab.visualizer import GraphView
from etlab.visualizer._graph_svg import graph_svg, overlay_fills
from etlab.visualizer._synthetic import synthetic_graph_model
from tests.visualizer.axe import SVG_NODE_CONTRAST, axe_violations
from tests.visualizer.test_browser import Page, browser, report  # noqa: F401  (fixtures)

pytestmark = pytest.mark.xdist_group("browser")

def _tab_until(p, predicate_js: str, limit: int = 60) -> bool:
    for _ in range(limit):
        p.keyboard.press("Tab")
        if p.evaluate(predicate_js):
            return True
    return False


def _scale(p, pane: int = 0) -> float:
    t = p.locator(f".pane[data-pane='{pane}'] svg.canvas > g.root").get_attribute("transform")
    return float(re.search(r"scale\(([\d.e-]+)\)", t).group(1))


def _latency_model(n: int = 120):
    """A synthetic graph whose nodes' p50 spans four decades: every overlay color of the ramp is drawn."""
    m = synthetic_graph_model(n, block_size=40)
    for i, node in enumerate(m.nodes):
        v = 10 ** (-2 + 4 * i / (n - 1))
        node.latency = {"p10": v, "p50": v, "p90": v, "avg": v, "min": v, "max": v, "runs": 3}
    return m


def test_keyboard_reaches_graph_nodes_and_table_rows(browser, report):  # noqa: F811
    dash, path = report
    page = Page(browser, path)
    p = page.page
    page.wait_ready()
    p.click("nav.etlab-tabs button[data-tab=graph]")
    p.locator("[data-role=overlay]").first.focus()
    assert _tab_until(p, "() => !!document.activeElement?.closest('.etlab-gv .node')"), "Tab never reached a graph node"
    node = p.evaluate("() => document.activeElement.getAttribute('data-node-name')")
    label = p.evaluate("() => document.activeElement.getAttribute('aria-label')")
    assert p.evaluate("() => document.activeElement.getAttribute('role')") == "button"
    assert label.startswith(node) and "float32 [" in label, label  # its name, kind or op, and shape
    # only one node of a pane is a Tab stop (roving tabindex)
    assert p.locator(".pane[data-pane='0'] [data-item][tabindex='0']").count() == 1
    # the tooltip shows on focus, the focus ring is drawn
    tip = p.locator(".pane[data-pane='0'] [data-role=tooltip]")
    assert tip.is_visible() and node in tip.inner_text()
    assert p.evaluate("() => getComputedStyle(document.activeElement.querySelector('.ring')).display") != "none"
    page.shot("a11y_graph_focus")
    # arrows follow the edges: down goes to a successor, up comes back
    graph = dash.views["graph"].models[0]
    ids = {n.name: n.id for n in graph.nodes}
    start = ids[node]
    p.keyboard.press("ArrowDown")
    below = p.evaluate("() => document.activeElement.getAttribute('data-node-name')")
    assert below and (start, ids[below]) in {tuple(e) for e in graph.edges}, (node, below)
    p.keyboard.press("ArrowUp")
    assert p.evaluate("() => document.activeElement.getAttribute('data-node-name')") == node
    for _ in range(3):
        p.keyboard.press("ArrowDown")
    target = p.evaluate("() => document.activeElement.getAttribute('data-node-name')")
    p.keyboard.press("Enter")
    p.wait_for_function("(n) => document.querySelector('[data-role=details-name]')?.textContent === n", arg=target)
    assert p.locator(f".pane[data-pane='0'] .node.selected[data-node-name='{target}']").count() == 1
    # the selected node keeps keyboard focus; Escape leaves the graph for the search box
    assert p.evaluate("() => document.activeElement.getAttribute('data-node-name')") == target
    p.keyboard.press("Escape")
    assert p.evaluate("() => document.activeElement.getAttribute('data-role')") == "search"

    # table rows: one Tab stop, arrows move, Enter picks (a delegation row selects its op in the graph)
    p.click("nav.etlab-tabs button[data-tab=delegation]")
    p.locator(".etlab-tab[data-tab=delegation] [data-role=filter]").first.focus()
    assert _tab_until(p, "() => !!document.activeElement?.matches('.etlab-tab[data-tab=delegation] tr.row')")
    first = p.evaluate("() => document.activeElement.getAttribute('data-row')")
    p.keyboard.press("ArrowDown")
    assert p.evaluate("() => document.activeElement.getAttribute('data-row')") != first
    row = p.locator(".etlab-tab[data-tab=delegation] tr.row.focusable").filter(has_text="relu").first
    row.focus()
    page.shot("a11y_table_focus")
    p.keyboard.press("Enter")
    p.wait_for_function("() => document.querySelector('[data-role=details-name]')?.textContent === 'relu'")
    assert page.errors == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_serious_violation(browser, report, tmp_path, scheme):  # noqa: F811
    _, path = report
    page = Page(browser, path)
    p = page.page
    p.emulate_media(color_scheme=scheme)
    page.wait_ready()
    found = {}
    for tab in ("summary", "graph", "delegation", "gap", "profile"):
        p.click(f"nav.etlab-tabs button[data-tab={tab}]")
        p.wait_for_timeout(100)
        if tab == "graph":
            p.locator(".pane[data-pane='1'] [data-node-name=relu]").click()
        found[tab] = axe_violations(p)
    # a standalone GraphView with the latency overlay (colored nodes, collapsed groups, minimap)
    view = GraphView.from_models([_latency_model()], overlay="latency", collapse_threshold=60)
    gpath = view.save_html(tmp_path / "g.html")
    gpage = Page(browser, gpath)
    gpage.page.emulate_media(color_scheme=scheme)
    gpage.wait_ready()
    found["graph view"] = axe_violations(gpage.page)
    gpage.shot(f"a11y_axe_graph_{scheme}")
    assert all(not v for v in found.values()), found
    assert page.errors == [] and gpage.errors == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_node_text_contrast_on_every_overlay_color(browser, tmp_path, scheme):  # noqa: F811
    """White on the orange latency nodes was 4.27:1; black or white by the fill's luminance keeps >= 4.5:1."""
    view = GraphView.from_models([_latency_model()], overlay="latency", collapse_threshold=1000)
    path = view.save_html(tmp_path / "g.html")
    page = Page(browser, path, height=1400)
    p = page.page
    p.emulate_media(color_scheme=scheme)
    page.wait_ready()
    p.click("button[data-role=fit]")
    worst = p.evaluate(SVG_NODE_CONTRAST)
    page.shot(f"a11y_latency_{scheme}")
    assert worst["count"] >= 200 and worst["ratio"] >= 4.5, worst
    p.click("button[data-role=collapse-all]")
    worst = p.evaluate(SVG_NODE_CONTRAST)
    assert worst["count"] > 0 and worst["ratio"] >= 4.5, worst


def test_static_svg_node_text_contrast():
    """The saved picture (_graph_svg) takes the same ink as the browser on every overlay color."""
    m = _latency_model()
    svg = graph_svg(m, collapse_threshold=1000, fills=overlay_fills([m], "latency")[0])

    def lum(c):
        r, g, b = (int(x) for x in re.findall(r"\d+", c)) if c.startswith("rgb") else \
            (int(c[i:i + 2], 16) for i in (1, 3, 5))
        lin = [v / 255 / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4 for v in (r, g, b)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    pairs = re.findall(r'fill="(rgb\([^"]+\))" [^>]*/><text [^>]*fill="(#[0-9a-f]{6})">[^<]*</text>'
                       r'<text [^>]*fill="(#[0-9a-f]{6})"', svg)
    assert len(pairs) == len(m.nodes)
    ratios = [(max(lum(bg), lum(fg)) + .05) / (min(lum(bg), lum(fg)) + .05) for bg, *inks in pairs for fg in inks]
    assert min(ratios) >= 4.5, min(ratios)


def test_wheel_zoom_is_bounded_and_smooth(browser, tmp_path):  # noqa: F811
    """One wheel notch zoomed to a single label; now at most 1.2x per event (any delta unit or size),
    animated over a few frames, and never past 300%."""
    path = GraphView.from_models([synthetic_graph_model(150, block_size=50)]).save_html(tmp_path / "g.html")
    page = Page(browser, path)
    p = page.page
    page.wait_ready()
    box = p.locator(".pane[data-pane='0'] svg.canvas").bounding_box()
    p.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    for delta in (-100, -5000):  # one notch; a huge delta (a page-sized scroll) is one notch too
        k0 = _scale(p)
        p.mouse.wheel(0, delta)
        p.wait_for_timeout(400)
        assert 1.05 < _scale(p) / k0 <= 1.2 + 1e-6, (delta, k0, _scale(p))
    for _ in range(30):
        p.mouse.wheel(0, -5000)
    p.wait_for_timeout(800)
    assert _scale(p) == pytest.approx(3.0)
    # keyboard zoom on a focused node
    p.locator(".pane[data-pane='0'] [data-item][tabindex='0']").focus()
    p.keyboard.press("-")
    p.wait_for_timeout(400)
    assert _scale(p) == pytest.approx(3.0 / 1.25)
    assert page.errors == []


def test_search_prefers_ops_and_names_to_module_paths(browser, tmp_path):  # noqa: F811
    """Every node sits in a module path holding "conv"; only the convolutions match "conv", the status says
    how many matched in which field and how many more only by module path."""
    m = synthetic_graph_model(60, block_size=20)
    for node in m.nodes:
        node.module = f"features.conv_block.{node.id // 20}"
    convs = [n for n in m.nodes if n.id % 10 == 3]
    for n in convs:
        n.op = "aten.convolution.default"
    m.nodes[5].name = "conv_input_scale"
    path = GraphView.from_models([m]).save_html(tmp_path / "g.html")
    page = Page(browser, path)
    p = page.page
    page.wait_ready()
    p.fill("[data-role=search]", "conv")
    assert p.locator(".node.match").count() == len(convs) + 1
    status = p.locator("[data-role=status]").inner_text()
    assert status.startswith(f"{len(convs) + 1} matches (op {len(convs)}, name 1)"), status
    assert f"{60 - len(convs) - 1} more in module paths only" in status, status
    fields = p.locator("[data-role=matches] button").evaluate_all("bs => bs.map(b => b.dataset.field)")
    assert fields[:len(convs)] == ["op"] * len(convs) and fields[-1] == "name"
    p.fill("[data-role=search]", "module:conv_block.1")
    assert p.locator(".node.match").count() == 20
    assert p.locator("[data-role=status]").inner_text().startswith("20 matches (module 20)")
    p.fill("[data-role=search]", "features")  # nothing by op or name: module paths are searched
    assert p.locator(".node.match").count() == 60
    page.shot("a11y_search")
    assert page.errors == []


def test_minimap_pans_a_big_graph(browser, tmp_path):  # noqa: F811
    path = GraphView.from_models([synthetic_graph_model(150, block_size=50)]).save_html(tmp_path / "g.html")
    page = Page(browser, path)
    p = page.page
    page.wait_ready()
    mini = p.locator(".pane[data-pane='0'] [data-role=minimap]")
    assert mini.is_visible()
    box = mini.bounding_box()
    p.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] - 3)  # the bottom of the graph
    t = p.locator(".pane[data-pane='0'] svg.canvas > g.root").get_attribute("transform")
    y_bottom = float(re.search(r"translate\([\d.e-]+,([-\d.e]+)\)", t).group(1))
    assert y_bottom < -1000, t  # the view moved down the tall graph
    # ... and the last node is now in view
    last = p.locator(".pane[data-pane='0'] [data-node-name=op_149]")
    pane = p.locator(".pane[data-pane='0']").bounding_box()
    lb = last.bounding_box()
    assert pane["y"] <= lb["y"] <= pane["y"] + pane["height"], (lb, pane)
    # drag to the top
    p.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] - 3)
    p.mouse.down()
    p.mouse.move(box["x"] + box["width"] / 2, box["y"] + 2, steps=5)
    p.mouse.up()
    assert p.locator(".pane[data-pane='0'] [data-node-name=op_0]").bounding_box()["y"] >= pane["y"]
    page.shot("a11y_minimap")
    # a small graph that fits has none
    small = GraphView.from_models([synthetic_graph_model(3, block_size=3)]).save_html(tmp_path / "s.html")
    spage = Page(browser, small)
    spage.wait_ready()
    assert not spage.page.locator("[data-role=minimap]").is_visible()
    assert page.errors == [] and spage.errors == []
