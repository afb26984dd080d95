"""Charts in a notebook do not depend on a racing kernel message (issue 25 item 4): plotly.js comes
from the Jupyter server (etlab's server extension, GET etlab/modules/plotly.js) once per page, so a
chart draws while Run All keeps the kernel busy (before, it asked the kernel and gave up after 30 s
with "the kernel did not send plotly"). Reopened without its kernel, the saved copy says the kernel
is gone, not "install anywidget/ipywidgets" (they are installed: the widget manager is right there)."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.xdist_group("jupyter")

NAME = "plotly_nb/busy.ipynb"  # its own folder, removed afterwards (other tests list the root's files)
CELLS = ["import plotly.graph_objects as go\nfrom etlab.visualizer import PlotView\n"
         "PlotView(go.Figure(go.Bar(x=['a', 'b'], y=[3, 4])))",
         "import time\ntime.sleep(150)  # a long cell: the kernel is busy while the chart above loads"]
NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def _notebook() -> dict:
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": src}
             for src in CELLS]
    return {"nbformat": 4, "nbformat_minor": 5, "cells": cells,
            "metadata": {"kernelspec": {"name": "etlab", "display_name": "etlab (Python 3)", "language": "python"}}}


def test_chart_draws_while_the_kernel_is_busy_and_its_copy_says_why(lab_page, lab_files):
    path = lab_files.root / NAME
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(_notebook()))
    p = lab_page.page
    asked = []
    p.on("request", lambda r: "etlab/modules/plotly.js" in r.url and asked.append(r.url))
    try:
        lab_page.close_all()
        lab_page.command("docmanager:open", {"path": NAME})
        p.wait_for_selector(f"{NB} .jp-Notebook-ExecutionIndicator[data-status=idle]", state="attached",
                            timeout=120_000)
        # not awaited: the command's promise settles when the last cell has run
        p.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        # the chart of the first cell is drawn, with plotly.js from the server, while the second cell
        # keeps the kernel busy for minutes (the kernel could not have answered)
        chart = p.locator(f"{NB} [data-etlab-view=plot]")
        p.locator(f"{NB} [data-etlab-view=plot][data-state=ready]").wait_for(state="attached", timeout=120_000)
        prompts = p.locator(f"{NB} .jp-Cell .jp-InputPrompt").all_inner_texts()
        assert "*" in prompts[1], prompts  # the second cell still running
        assert chart.locator(".main-svg").count() >= 1 and "kernel did not send" not in chart.inner_text()
        assert len(asked) == 1
        lab_page.shot("issue25-plotly-busy-kernel-light")
        lab_page.command("kernelmenu:interrupt")
        p.wait_for_selector(f"{NB} .jp-Notebook-ExecutionIndicator[data-status=idle]", state="attached",
                            timeout=60_000)
        lab_page.command("docmanager:save")
        p.wait_for_timeout(500)
        # reopened with its kernel gone: the saved copy, which says so
        p.evaluate("() => window.jupyterapp.serviceManager.sessions.shutdownAll()")
        lab_page.close_all()
        lab_page.command("docmanager:open", {"path": NAME})
        note = p.locator(f"{NB} [data-role=widget-fallback][data-reason=kernel-gone]")
        note.first.wait_for(timeout=60_000)
        assert "kernel is gone" in note.first.inner_text() and "pip install" not in note.first.inner_text()
        assert p.locator(f"{NB} svg[data-role=chart-image]").count() == 1
        lab_page.shot("issue25-plotly-reopened-light")
    finally:
        lab_page.close_all()
        p.evaluate("() => window.jupyterapp.serviceManager.sessions.shutdownAll()")
        shutil.rmtree(path.parent, ignore_errors=True)
    errors = [e for e in lab_page.take_errors() if "kernel" not in e.lower()]  # the interrupt's own log line
    assert errors == []
