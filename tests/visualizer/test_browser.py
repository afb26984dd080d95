"""The exported report in headless Chromium (Debian `chromium`, driven by playwright with
executable_path=/usr/bin/chromium; playwright never downloads a browser here).

One browser per module. Screenshots of every view go to /tmp/etlab_screens. The 5,000-node
check logs its pan / zoom / select timings (no timed assertion).
"""

from __future__ import annotations

import inspect
import os
import shutil
import time
from pathlib import Path

import pytest

import etlab.models.zoo
from etlab.visualizer import GraphView, show
from etlab.visualizer._synthetic import synthetic_graph_model
from tests.visualizer.contrast import MIN_CONTRAST

CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")
SCREENS = Path("/tmp/etlab_screens")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]

if os.environ.get("CI"):  # CI installs both (Makefile); a missing one must fail there, not skip
    import playwright.sync_api  # noqa: F401

    assert shutil.which(CHROMIUM) or os.path.exists(CHROMIUM), f"{CHROMIUM} is not installed"
sync_api = pytest.importorskip("playwright.sync_api")
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.xdist_group("browser")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        # playwright gives every launch a fresh temporary profile (--user-data-dir)
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


class Page:
    """A page that records console errors and refuses every request that is not the file itself."""

    def __init__(self, browser, path: Path, width: int = 1400, height: int = 1000):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def route(r):
            if r.request.url.startswith(("file:", "blob:", "data:")):
                r.continue_()
            else:
                self.requests.append(r.request.url)
                r.abort()

        self.page.route("**/*", route)
        self.page.goto(path.resolve().as_uri())

    def wait_ready(self, timeout=60_000):
        self.page.wait_for_selector("[data-etlab-view=graph][data-state=ready]", state="attached", timeout=timeout)

    def shot(self, name: str):
        SCREENS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENS / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def report(mlp_run, mlp_inspector, tmp_path_factory):
    dash = show(mlp_inspector, mlp_run.manager)
    path = dash.save_html(tmp_path_factory.mktemp("report") / "report.html")
    return dash, path


def test_report_in_chromium(browser, report):
    dash, path = report
    page = Page(browser, path)
    p = page.page
    page.wait_ready()
    page.shot("report_summary")

    p.click("nav.etlab-tabs button[data-tab=graph]")
    graph = dash.views["graph"]
    for i, model in enumerate(graph.models):  # small graphs start fully expanded: every node drawn
        pane = p.locator(f".pane[data-pane='{i}']")
        assert pane.get_attribute("data-kind") == model.kind
        assert pane.locator("[data-node-id]").count() == len(model.nodes)
    assert p.locator("[data-group-id^='delegate:']").count() == 3 * 1  # partitions outlined in the edge pane
    # a click on a node shows its details, and the same op is highlighted in the other graphs
    p.locator(".pane[data-pane='1'] [data-node-name=relu]").click()
    assert p.locator("[data-role=details-name]").inner_text() == "relu"
    details = p.locator("[data-role=details]").inner_text()
    zoo = Path(inspect.getsourcefile(etlab.models.zoo)).read_text().splitlines()
    relu_line = 1 + next(i for i, line in enumerate(zoo) if "torch.relu(self.fc1(x))" in line)
    assert "aten.relu.default" in details and f"zoo.py:{relu_line}" in details and "p50" in details
    assert p.locator(".pane[data-pane='0'] .node.linked").count() == 1
    assert p.locator(".pane[data-pane='2'] .node.linked").count() == 1
    page.shot("report_graph")
    # two panes to start with; the runtime one is hidden (but kept in sync) until its checkbox is ticked
    assert p.locator(".pane[data-pane='1']").is_visible() and not p.locator(".pane[data-pane='2']").is_visible()
    p.click("input[data-role=show-pane][data-kind=runtime]")
    linked = p.locator(".pane[data-pane='2'] .node.linked")
    linked.wait_for(state="visible")
    box, pane_box = linked.bounding_box(), p.locator(".pane[data-pane='2']").bounding_box()
    assert pane_box["x"] <= box["x"] and box["x"] + box["width"] <= pane_box["x"] + pane_box["width"] + 1
    assert pane_box["y"] <= box["y"] and box["y"] + box["height"] <= pane_box["y"] + pane_box["height"] + 1
    page.shot("report_graph_three_panes")
    p.click("input[data-role=show-pane][data-kind=aten]")
    p.click("input[data-role=show-pane][data-kind=edge]")
    p.click("input[data-role=show-pane][data-kind=runtime]")  # the last one shown stays
    assert p.locator(".pane[data-pane='2']").is_visible()
    assert p.locator("input[data-role=show-pane][data-kind=runtime]").is_checked()
    p.click("input[data-role=show-pane][data-kind=aten]")
    p.click("input[data-role=show-pane][data-kind=edge]")

    # search
    p.fill("[data-role=search]", "addmm")
    assert p.locator(".pane[data-pane='1'] .node.match").count() == 3
    p.fill("[data-role=search]", "")

    p.click("nav.etlab-tabs button[data-tab=memory]")
    tensors = int(p.locator("[data-etlab-view=memory]").get_attribute("data-tensors"))
    assert tensors == len(dash.views["memory"].data) > 0
    assert p.locator("[data-etlab-view=memory] .trace.bars .point").count() == tensors
    page.shot("report_memory")

    p.click("nav.etlab-tabs button[data-tab=delegation]")
    page.shot("report_delegation")
    # click-through: a delegation row selects the op in the graph tab
    p.locator(".etlab-tab[data-tab=delegation] tr.row.focusable").filter(has_text="relu").first.click()
    p.wait_for_timeout(200)
    assert p.locator(".etlab-tab[data-tab=graph]").is_visible()
    assert p.locator("[data-role=details-name]").inner_text() == "relu"

    for tab in ("gap", "profile"):
        p.click(f"nav.etlab-tabs button[data-tab={tab}]")
        p.wait_for_timeout(200)
        page.shot(f"report_{tab}")
    assert p.locator(".etlab-tab[data-tab=profile] .js-plotly-plot").count() == 2
    assert page.errors == []
    assert page.requests == []  # offline: nothing fetched


def test_a_hidden_pane_shows_the_node_linked_while_it_was_hidden(browser, tmp_path):
    """Selecting deep in a tall graph, then showing the other pane: it opens on the linked node."""
    first, second = synthetic_graph_model(150, block_size=50), synthetic_graph_model(150, block_size=50)
    second.kind, second.title = "runtime", "same ops, other pane"
    path = GraphView.from_models([first, second], height=500, shown=["edge"]).save_html(tmp_path / "two.html")
    page = Page(browser, path)
    p = page.page
    page.wait_ready()
    assert not p.locator(".pane[data-pane='1']").is_visible()
    p.fill("[data-role=search]", "op_140")
    p.press("[data-role=search]", "Enter")
    p.wait_for_function("document.querySelector('[data-role=details-name]')?.textContent === 'op_140'")
    p.click("input[data-role=show-pane][data-kind=runtime]")
    linked = p.locator(".pane[data-pane='1'] [data-node-name=op_140]")
    linked.wait_for(state="visible")
    p.wait_for_timeout(100)  # the pane centers on its first resize
    box, pane_box = linked.bounding_box(), p.locator(".pane[data-pane='1']").bounding_box()
    assert "linked" in linked.get_attribute("class")
    assert pane_box["y"] <= box["y"] and box["y"] + box["height"] <= pane_box["y"] + pane_box["height"]
    assert page.errors == []


def test_five_thousand_nodes_stay_responsive(browser, tmp_path):
    model = synthetic_graph_model(5000)
    path = GraphView.from_models([model], height=700).save_html(tmp_path / "big.html")
    page = Page(browser, path)
    p = page.page
    t0 = time.perf_counter()
    page.wait_ready()
    first = time.perf_counter() - t0
    # collapsed by default: one box per top-level module
    assert p.locator("[data-node-id]").count() == 0
    assert p.locator(".group.collapsed").count() == 50
    page.shot("big_collapsed")
    t0 = time.perf_counter()
    p.click("button[data-role=expand-all]")
    p.wait_for_function("document.querySelector('svg.canvas')?.dataset.nodeCount === '5000'", timeout=120_000)
    p.wait_for_selector(".pane[data-state=ready]", state="attached")
    expand = time.perf_counter() - t0
    # only what is near the viewport is in the DOM (off-screen SVG made every zoom step cost ~200 ms)
    in_dom = p.locator("[data-node-id]").count()
    assert 0 < in_dom < 1000
    page.shot("big_expanded_before_zoom")
    frame = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
    p.mouse.move(500, 450)
    t0 = time.perf_counter()
    for _ in range(10):
        p.mouse.wheel(0, -120)
        p.evaluate(frame)
    zoom = (time.perf_counter() - t0) / 10
    page.shot("big_expanded_zoomed_in")
    t0 = time.perf_counter()
    for _ in range(25):  # out past the level where labels are dropped
        p.mouse.wheel(0, 120)
        p.evaluate(frame)
    zoom_out = (time.perf_counter() - t0) / 25
    page.shot("big_expanded_zoomed_out")
    for _ in range(15):
        p.mouse.wheel(0, -120)
        p.evaluate(frame)
    t0 = time.perf_counter()
    p.mouse.down()
    for i in range(10):
        p.mouse.move(500 + 15 * i, 450 + 10 * i)
        p.evaluate(frame)
    p.mouse.up()
    pan = (time.perf_counter() - t0) / 10
    # a node well inside the canvas (culling keeps a margin of nodes just outside it)
    name, x, y = p.evaluate("""() => {
      const r = document.querySelector('svg.canvas').getBoundingClientRect();
      for (const n of document.querySelectorAll('[data-node-id]')) {
        if (n.style.display === 'none') continue;
        const b = n.getBoundingClientRect();
        if (b.top > r.top + 60 && b.bottom < r.bottom - 20 && b.left > r.left && b.right < r.right)
          return [n.dataset.nodeName, b.left + b.width / 2, b.top + b.height / 2];
      }
      return [null, 0, 0]; }""")
    assert name is not None
    t0 = time.perf_counter()
    p.mouse.click(x, y)
    p.wait_for_function(f"document.querySelector('[data-role=details-name]')?.textContent === '{name}'")
    select = time.perf_counter() - t0
    page.shot("big_expanded")
    print(f"\n5,000-node graph: first render {first:.2f}s, expand all (layout + draw) {expand:.2f}s, "
          f"zoom in step {zoom * 1000:.0f} ms, zoom out step {zoom_out * 1000:.0f} ms, pan step {pan * 1000:.0f} ms, "
          f"select {select * 1000:.0f} ms, {in_dom} of 5000 nodes in the DOM")
    assert page.errors == []


# JupyterLab's dark theme as it sets itself on <body> (a subset of its variables), for pages outside Lab.
LAB_DARK = """() => {
  const b = document.body; b.dataset.jpThemeLight = 'false';
  const v = {'--jp-ui-font-color1': 'rgba(255,255,255,.87)', '--jp-ui-font-color2': 'rgba(255,255,255,.54)',
             '--jp-layout-color0': '#111111', '--jp-layout-color2': '#424242', '--jp-layout-color3': '#616161',
             '--jp-border-color1': '#616161', '--jp-border-color2': '#424242', '--jp-brand-color1': '#1976d2',
             '--jp-brand-color3': '#0d47a1'};
  for (const [k, x] of Object.entries(v)) b.style.setProperty(k, x);
  b.style.background = '#111111';  // Lab paints its layout color behind the output area
}"""

TEXT = [".etlab-tv td", ".etlab-tv th", ".etlab-repr td", ".etlab-repr th", ".etlab-repr p", ".etlab-tabs > button",
        "[data-role=details] td"]


@pytest.mark.parametrize("theme", ["light", "dark", "lab-dark"])
def test_tables_are_readable_in_light_and_dark_themes(browser, report, theme):
    """Every table's text keeps WCAG AA contrast (>= 4.5:1) on the system's light and dark schemes and
    on JupyterLab's dark theme (text used to stay #222 on dark backgrounds)."""
    _, path = report
    page = Page(browser, path)
    p = page.page
    p.emulate_media(color_scheme="light" if theme == "light" else "dark")
    if theme == "lab-dark":
        p.evaluate(LAB_DARK)
    page.wait_ready()
    p.click("nav.etlab-tabs button[data-tab=graph]")
    p.locator(".pane[data-pane='1'] [data-node-name=relu]").click()
    worst = {"ratio": 99}
    for tab in ("summary", "graph", "delegation", "gap", "profile"):
        p.click(f"nav.etlab-tabs button[data-tab={tab}]")
        p.wait_for_timeout(100)
        found = p.evaluate(MIN_CONTRAST, TEXT)
        worst = min(worst, found, key=lambda w: w["ratio"])
        page.shot(f"theme_{theme}_{tab}")
    assert worst["ratio"] >= 4.5, worst
    assert page.errors == []


# The luminance (0 black .. 1 white) of what a chart and the graph's controls are drawn on.
SURFACES = """() => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lin = (x) => { x /= 255; return x <= .03928 ? x / 12.92 : ((x + .055) / 1.055) ** 2.4; };
  const lum = (c) => { const [r, g, b] = rgb(c); return .2126 * lin(r) + .7152 * lin(g) + .0722 * lin(b); };
  const out = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const tab = gd.closest('.etlab-tab')?.dataset.tab || '';
    const paper = gd.querySelector('svg.main-svg');
    out.push({what: `${tab} chart paper`, lum: lum(getComputedStyle(paper).backgroundColor)});
    const area = gd.querySelector('.cartesianlayer .bg');
    if (area) out.push({what: `${tab} chart plot area`, lum: lum(getComputedStyle(area).fill)});
    const tick = gd.querySelector('.xtick text, .ytick text');
    if (tick) out.push({what: `${tab} chart tick text`, lum: lum(getComputedStyle(tick).fill), text: true});
  }
  for (const slice of document.querySelectorAll('.js-plotly-plot g.slice')) {  // treemap labels on their tiles
    const label = slice.querySelector('.slicetext text'), tile = slice.querySelector('path.surface');
    if (!label || !tile || !label.textContent.trim()) continue;
    const [hi, lo] = [lum(getComputedStyle(label).fill), lum(getComputedStyle(tile).fill)].sort((a, b) => b - a);
    out.push({what: `treemap label ${label.textContent}`, contrast: (hi + .05) / (lo + .05)});
  }
  for (const sel of ['select[data-role=overlay]', 'input[data-role=search]', 'button[data-role=fit]']) {
    const el = document.querySelector(sel);
    out.push({what: sel, lum: lum(getComputedStyle(el).backgroundColor)});
    out.push({what: `${sel} text`, lum: lum(getComputedStyle(el).color), text: true});
  }
  return out;
}"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_charts_and_controls_follow_the_theme(browser, report, theme):
    """In the dark theme the plotly charts (Memory, Profile) and the graph tab's select, search field and buttons
    are dark with light text, in the light theme light with dark text (they used to stay white in the dark theme);
    a live switch of the system's scheme redraws the charts in the new theme."""
    _, path = report
    page = Page(browser, path)
    p = page.page
    p.emulate_media(color_scheme=theme)
    page.wait_ready()
    tabs = p.eval_on_selector_all("nav.etlab-tabs button", "bs => bs.map((b) => b.dataset.tab)")
    assert {"memory", "profile"} <= set(tabs), tabs
    for tab in tabs:
        p.click(f"nav.etlab-tabs button[data-tab={tab}]")
        p.wait_for_timeout(150)
        page.shot(f"surfaces_{theme}_{tab}")

    def check(dark: bool):
        found = p.evaluate(SURFACES)
        assert sum("chart paper" in s["what"] for s in found) >= 2, found  # the Memory and Profile charts at least
        labels = [s for s in found if "contrast" in s]
        assert labels and all(s["contrast"] >= 3 for s in labels), labels  # the root's used to be light on light
        wrong = [s for s in found if "lum" in s and (s["lum"] > .2 if dark != bool(s.get("text")) else s["lum"] < .5)]
        assert not wrong, wrong

    check(theme == "dark")
    other = "light" if theme == "dark" else "dark"
    p.emulate_media(color_scheme=other)  # the theme changes while the page is open
    p.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].every((gd) => "
                        "gd.layout.paper_bgcolor === getComputedStyle(gd).getPropertyValue('--etlab-bg').trim())")
    check(other == "dark")
    assert page.errors == []


def test_focus_before_the_first_layout_selects_the_node_once_drawn(browser, mlp_run, tmp_path):
    """focus() called while the graph is still being laid out used to throw 'this.nodeEls is not iterable'."""
    path = GraphView(mlp_run.manager, "edge").save_html(tmp_path / "g.html")
    page = Page(browser, path)
    p = page.page
    p.evaluate("() => window.etlabGraphView.model.set('focus_target', {name: 'relu', handles: [], kind: null})")
    page.wait_ready()
    p.wait_for_function("document.querySelector('[data-role=details-name]')?.textContent === 'relu'")
    assert p.locator(".node.selected").count() == 1
    assert page.errors == []


def test_collapsed_group_totals_carry_their_unit(browser, report):
    _, path = report
    page = Page(browser, path)
    p = page.page
    page.wait_ready()
    p.click("nav.etlab-tabs button[data-tab=graph]")
    p.click("button[data-role=collapse-all]")
    p.wait_for_selector(".pane[data-pane='1'] .group.collapsed .sub", state="attached")
    subs = p.locator(".pane[data-pane='1'] .group.collapsed .sub").all_text_contents()
    assert subs and all(s.endswith(" ms") for s in subs), subs  # "3 ops · 19.49 ms", not "3 ops · 19.49"
    assert page.errors == []


def test_shared_libraries_are_sent_once_per_page(browser, mlp_run, tmp_path):
    """In a notebook, plotly.js comes from the kernel once per page (a custom widget message), not
    inside every widget's state: two charts here ask for it once; the graphs need no library (their
    layout rides in their JSON)."""
    import plotly.graph_objects as go

    from etlab.visualizer import PlotView, _html

    views = [(GraphView(mlp_run.manager, "edge"), _html.graph_module_source()),
             (GraphView(mlp_run.manager, "aten"), _html.graph_module_source()),
             (PlotView(go.Figure(go.Bar(x=[1, 2, 3], y=[3, 1, 2]))), _html.plot_module_source()),
             (PlotView(go.Figure(go.Scatter(x=[1, 2], y=[2, 1]))), _html.plot_module_source())]
    libs = {name: _html.library_source(name) for name in ("plotly",)}
    # a stand-in kernel: answers each etlab:need-library message like serve_libraries does
    kernel = ("<script>window.kernelLibs = " + _html.json_for_script(libs) + "; window.asked = [];"
              "window.connect = (model) => { model.send = (c) => { window.asked.push(c.name);"
              "setTimeout(() => model.emit('msg:custom', {type: 'etlab:library', name: c.name,"
              "source: window.kernelLibs[c.name]}), 50); }; return model; };</script>")
    body, scripts = [], []
    for i, (view, module) in enumerate(views):
        state = view.state() if hasattr(view, "state") else {"figure": view.figure, "clicked": {}}
        body.append(f'<div id="v{i}"></div>')
        scripts.append(f"<script type='module'>{module}\n{_html.MODEL_SHIM}\n"
                       f"const model = window.connect(etlabModel({_html.json_for_script(state)}));\n"
                       f"render({{ model, el: document.getElementById('v{i}') }});</script>")
    path = tmp_path / "kernel.html"
    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{_html.theme_css()}</style>{kernel}"
                    "</head><body>"
                    f"{''.join(body)}{''.join(scripts)}</body></html>")
    page = Page(browser, path)
    p = page.page
    p.wait_for_function("document.querySelectorAll('[data-etlab-view=graph][data-state=ready]').length === 2",
                        timeout=60_000)
    p.wait_for_function("document.querySelectorAll('[data-etlab-view=plot][data-state=ready]').length === 2",
                        timeout=60_000)
    assert sorted(p.evaluate("window.asked")) == ["plotly"]
    assert p.locator("[data-etlab-view=plot] .main-svg").count() >= 2
    page.shot("kernel_served_libraries")
    assert page.errors == []


def test_views_answer_library_requests_and_keep_libraries_out_of_their_state(mlp_run):
    import plotly.graph_objects as go

    from etlab.visualizer import PlotView

    view = PlotView(go.Figure(go.Bar(x=[1], y=[1])))
    sent = []
    view.send = lambda content, buffers=None: sent.append(content)
    view._handle_custom_msg({"type": "etlab:need-library", "name": "plotly"}, [])
    assert sent and sent[0]["type"] == "etlab:library" and "plotly" in sent[0]["source"][:5000].lower()
    assert len(view._esm) < 200_000  # plotly.js (4.7 MB) does not ride in the state
    assert len(GraphView(mlp_run.manager, "edge")._esm) < 200_000  # and the graph has no library at all


def test_the_browser_places_exactly_what_python_composes(browser, tmp_path):
    """graph_layout.js and _layout.compose are one function in two languages: same boxes, same edges."""
    from etlab.visualizer._layout import compose, layout_kit

    model = synthetic_graph_model(400, block_size=40)
    path = GraphView.from_models([model], height=500).save_html(tmp_path / "g.html")
    page = Page(browser, path)
    page.wait_ready()
    groups = sorted(g.id for g in model.groups)
    for expanded in (set(), set(groups), set(groups[::3]), {g for g in groups if g.count(".") == 1}):
        js = page.page.evaluate("""(exp) => {
          const pane = window.etlabGraphView.el.__etlabGraphView.panes[0];
          return pane.compose(new Set(exp)); }""",
                                sorted(expanded))
        py = compose(layout_kit(model), model, expanded)
        assert set(js["boxes"]) == set(py["boxes"])
        for k, box in py["boxes"].items():
            assert js["boxes"][k] == pytest.approx(box, abs=0.2), k
        assert [e[:2] for e in js["edges"]] == [e[:2] for e in py["edges"]]
        for (_, _, a), (_, _, b) in zip(js["edges"], py["edges"]):
            assert len(a) == len(b) and all(p == pytest.approx(q, abs=0.2) for p, q in zip(a, b))
    assert page.errors == []
