"""PlotView's plotly.js without etlab's server extension (issue 25 item 4): the chart asks its kernel,
waits however long the kernel takes (no 30 s deadline that left "the kernel did not send plotly"), and
draws when the answer comes; every chart of the page shares the one request. A stand-in widget model
plays the kernel in a file:// page (headless chromium)."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

from etlab.visualizer import PlotView
from etlab.visualizer._html import library_source, plot_module_source, theme_css
from tests.visualizer.test_browser import browser  # noqa: F401  (the module's chromium)

pytestmark = pytest.mark.xdist_group("browser")

PAGE = """<!doctype html><html><body><div id="a"></div><div id="b"></div><script type="module">
const sent = (window.sent = []);
const plotly = %(plotly)s;
function model(figure) {
  const handlers = {};
  return {
    get: (k) => (k === "figure" ? figure : null), set: () => {}, save_changes: () => {},
    on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
    off: (ev, f) => { handlers[ev] = (handlers[ev] || []).filter((g) => g !== f); },
    // a busy kernel: it answers the request only after a while
    send: (msg) => { sent.push(msg); setTimeout(() => (handlers["msg:custom"] || []).forEach((f) =>
      f({ type: "etlab:library", name: msg.name, source: plotly })), %(delay)d); },
  };
}
const url = URL.createObjectURL(new Blob([%(module)s], { type: "text/javascript" }));
const mod = (await import(url)).default;
const fig = %(figure)s;
mod.render({ model: model(fig), el: document.getElementById("a") });
mod.render({ model: model(fig), el: document.getElementById("b") });
</script></body></html>"""


def test_chart_waits_for_a_slow_kernel_and_draws(browser, tmp_path):  # noqa: F811
    view = PlotView(go.Figure(go.Bar(x=["a", "b"], y=[1, 2])))
    path = tmp_path / "plot.html"
    path.write_text(PAGE % {"plotly": json.dumps(library_source("plotly")), "delay": 17_000,
                            "module": json.dumps(plot_module_source()), "figure": json.dumps(view.figure)})
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_function("document.querySelectorAll('[data-etlab-view=plot]').length === 2")
    assert page.locator("[data-etlab-view=plot][data-state=loading]").count() == 2
    # past the first ask's retry interval (15 s) both charts say what they wait for, and ask again
    page.locator("[data-etlab-view=plot]", has_text="waiting for the kernel to send plotly").nth(1).wait_for(
        timeout=60_000)
    page.wait_for_function("document.querySelectorAll('[data-etlab-view=plot][data-state=ready]').length === 2",
                           timeout=60_000)
    assert page.locator(".main-svg").count() >= 2
    sent = page.evaluate("window.sent")  # asked by one chart for the page, again while it waited
    assert sent[:2] == [{"type": "etlab:need-library", "name": "plotly"}] * 2
    assert errors == []
    page.close()


PAPER = "() => [...document.querySelectorAll('.js-plotly-plot')].map((gd) => gd.layout.paper_bgcolor)"


def test_chart_follows_the_theme_live(browser, tmp_path):  # noqa: F811
    """A notebook chart draws in the theme (dark on a dark system, not its figure's white template) and redraws
    when the theme changes under it: here JupyterLab switching to its light theme on <body>."""
    view = PlotView(go.Figure(go.Bar(x=["a", "b"], y=[1, 2])))
    path = tmp_path / "plot.html"
    path.write_text(f"<style>{theme_css()}</style>" + PAGE % {
        "plotly": json.dumps(library_source("plotly")), "delay": 0, "module": json.dumps(plot_module_source()),
        "figure": json.dumps(view.figure)})
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.emulate_media(color_scheme="dark")
    page.goto(path.as_uri())
    page.wait_for_function("document.querySelectorAll('[data-etlab-view=plot][data-state=ready]').length === 2",
                           timeout=60_000)
    assert page.evaluate(PAPER) == ["#16181c"] * 2
    assert page.evaluate("getComputedStyle(document.querySelector('.main-svg')).backgroundColor") == "rgb(22, 24, 28)"
    page.evaluate("""() => { document.body.style.setProperty('--jp-layout-color0', '#ffffff');
                             document.body.dataset.jpThemeLight = 'true'; }""")
    page.wait_for_function(f"({PAPER})().every((c) => c === '#ffffff')")
    assert errors == []
    page.close()
