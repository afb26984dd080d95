"""etlab's notebook views in a real JupyterLab (the tests/jupyter server, kernel "etlab", Debian chromium):
one notebook with every view (graph, delegation, numeric gap, memory, profile, dashboard) run in Lab,
light and dark screenshots with table-text contrast >= 4.5:1; saved and reopened (its kernel gone) it
shows each view's static copy, not "model not found" (charts drawn as SVG, graphs in their overlay
colors); `jupyter nbconvert --to html` of it, opened offline, shows the tables, the graph image and the
charts and loads no script from the network."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jupyter.conftest import ARTIFACTS
from tests.visualizer.contrast import MIN_CONTRAST

pytestmark = pytest.mark.xdist_group("jupyter")

NAME = "notebook/views.ipynb"  # in its own folder, removed afterwards: the other tests list the root's artifacts
SETUP = """\
import torch
from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.inspector import Inspector
from etlab.models import make_mlp
from etlab.runtime import Runtime
from etlab.visualizer import DelegationView, GraphView, MemoryTimeline, NumericGapView, ProfileView, show

model, inputs = make_mlp()
et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[DemoPartitioner()],
                                 generate_etrecord=True).to_executorch()
et.write_to_file("nb.pte")
program = Runtime.get().load_program("nb.pte", enable_etdump=True, debug_buffer_size=1 << 20)
method = program.load_method("forward")
for _ in range(3):
    method.execute(list(inputs))
program.write_etdump_result_to_file("nb.etdp", "nb.bin")
record = et.get_etrecord()
record.update_representative_inputs(list(inputs))
inspector = Inspector(etdump_path="nb.etdp", debug_buffer_path="nb.bin", etrecord=record)"""
VIEWS = ['GraphView(et, ["aten", "edge"], inspector=inspector, overlay="latency")',
         "DelegationView(et)", "NumericGapView(inspector)", "MemoryTimeline(et)", "ProfileView(inspector, et)",
         "show(inspector, et)"]
TEXT = [".etlab-tv td", ".etlab-tv th", "[data-etlab-view=delegation] .etlab-note", ".widget-tab .lm-TabBar-tabLabel",
        "[data-role=details] td"]


def _notebook() -> dict:
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": src}
             for src in [SETUP, *VIEWS]]
    return {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
            "metadata": {"kernelspec": {"name": "etlab", "display_name": "etlab (Python 3)", "language": "python"}}}


@pytest.fixture(scope="module")
def ran(lab_page, lab, lab_files):
    """The notebook run in Lab with every view drawn, then saved; returns its path."""
    path = lab_files.root / NAME
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(_notebook()))
    lab_page.close_all()
    lab_page.command("docmanager:open", {"path": NAME})
    p = lab_page.page
    p.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook", timeout=60_000)
    p.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator[data-status=idle]",
                        state="attached", timeout=120_000)
    lab_page.command("notebook:run-all-cells")
    cells = p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell")
    last = cells.nth(len(VIEWS))
    last.locator("[data-etlab-view=graph][data-state=ready]").first.wait_for(state="attached", timeout=180_000)
    # every graph of the notebook drawn (the graph view, delegation, numeric gap, dashboard) and every chart
    p.wait_for_function("document.querySelectorAll('[data-etlab-view=graph][data-state=ready]').length >= 4",
                        timeout=60_000)
    p.wait_for_function("document.querySelectorAll('[data-etlab-view=plot][data-state=ready]').length >= 3",
                        timeout=60_000)
    lab_page.command("docmanager:save")
    p.wait_for_timeout(500)
    yield path
    lab_page.close_all()
    lab_page.page.evaluate("() => window.jupyterapp.serviceManager.sessions.shutdownAll()")
    shutil.rmtree(path.parent, ignore_errors=True)


def test_every_view_in_lab_light_and_dark(lab_page, ran):
    p = lab_page.page
    cells = p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell")
    expect = {1: "[data-etlab-view=graph]", 2: "[data-etlab-view=delegation]", 3: "[data-etlab-view=plot]",
              4: "[data-etlab-view=plot] .main-svg", 5: ".etlab-tv", 6: ".widget-tab .lm-TabBar-tab"}
    for i, selector in expect.items():
        assert cells.nth(i).locator(selector).count() >= 1, (VIEWS[i - 1], selector)
    assert "model not found" not in p.locator(".jp-Notebook").inner_text()
    assert p.locator(".jp-OutputArea-output [data-role=widget-fallback]:visible").count() == 0  # live views
    worst = {}
    for dark in (False, True):
        lab_page.theme(dark)
        for i in expect:
            cells.nth(i).scroll_into_view_if_needed()
            found = p.evaluate(MIN_CONTRAST, TEXT)
            key = "dark" if dark else "light"
            worst[key] = min(worst.get(key, found), found, key=lambda w: w["ratio"])
            lab_page.shot(f"notebook-views-{key}-{i}")
    lab_page.theme(False)
    assert all(w["ratio"] >= 4.5 for w in worst.values()), worst
    assert lab_page.take_errors() == []


def test_saved_notebook_reopened_shows_the_static_copies(lab_page, ran):
    size = ran.stat().st_size
    assert size < 2_000_000, f"executed notebook {size / 1e6:.1f} MB"
    lab_page.page.evaluate("() => window.jupyterapp.serviceManager.sessions.shutdownAll()")
    lab_page.close_all()
    p = lab_page.page
    lab_page.command("docmanager:open", {"path": NAME})
    p.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook", timeout=60_000)
    copies = p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) [data-role=widget-fallback]")
    copies.first.wait_for(timeout=60_000)
    p.wait_for_timeout(2500)  # the widget manager gives up on a model after 2 s
    assert copies.count() == len(VIEWS)
    # each view's widget output (waiting for a model that is gone, or its error) is hidden behind its copy
    outputs = p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-etlab-widget-output")
    assert outputs.count() == len(VIEWS)
    assert outputs.locator(":scope > .lm-mod-hidden").count() == len(VIEWS)
    text = p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").text_content()
    assert p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) svg[data-role=graph-image]").count() >= 2
    # the charts are pictures, not captions; the latency graph keeps its overlay colors
    assert p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) svg[data-role=chart-image]").count() >= 3
    first = p.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(1)
    assert first.locator("svg[data-role=graph-image] rect[fill^='rgb(']").count() > 0
    assert "native_call_relu.out" in text  # the profile table's rows
    for dark in (False, True):
        lab_page.theme(dark)
        lab_page.shot(f"notebook-reopened-{'dark' if dark else 'light'}")
    lab_page.theme(False)
    lab_page.close_all()
    assert lab_page.take_errors() == []


def test_nbconvert_html_offline_shows_tables_and_graph(ran, browser, tmp_path):
    out = tmp_path / "views.html"
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(ran), "--output", str(out)],
                   check=True, capture_output=True, timeout=120)
    html = out.read_text()
    # nbconvert's own template links require.js and MathJax from a CDN in every notebook it converts
    # (its defaults, aborted offline below); nothing else may load a script from the network
    from nbconvert import HTMLExporter

    exporter = HTMLExporter()
    template_own = {exporter.require_js_url, exporter.mathjax_url}
    remote = [m.group(1) for m in re.finditer(r"""<script[^>]+src=["']?(https?:[^"' >]+)""", html, re.I)]
    assert [u for u in remote if u not in template_own and not u.startswith(exporter.mathjax_url)] == []
    assert html.count('data-role="graph-image"') >= 2 and "native_call_relu.out" in html
    assert html.count('data-role="chart-image"') >= 3
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    fetched = []

    def route(r):
        if r.request.url.startswith(("file:", "data:", "blob:")):
            r.continue_()
        else:
            fetched.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(Path(out).resolve().as_uri())
    image = page.locator("svg[data-role=graph-image]").first
    image.scroll_into_view_if_needed()
    assert image.is_visible() and image.bounding_box()["height"] > 100
    assert page.locator("td", has_text="native_call_relu.out").first.is_visible()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "notebook-nbconvert.png"), full_page=False)
    page.close()
    # offline: only nbconvert's own template scripts were asked for (and refused), nothing of the views
    assert [u for u in fetched if u not in template_own and not u.startswith(exporter.mathjax_url)] == []
