"""The Phases view (prefill / decode of an LLM run) and the KV-cache band of the memory view, in the
dashboard, in its offline HTML page, and that page in headless Chromium (tests/visualizer/test_browser.py's
harness)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from etlab.compiler import to_edge
from etlab.devtools import profile, state_buffers
from etlab.models.corpus import CORPUS
from etlab.visualizer import MemoryTimeline, show
from etlab.visualizer._phase_view import PhaseView

PROMPT = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    module, methods = CORPUS["llama_static_kv"].build()
    token = methods["decode"][0]
    return profile(module, {"prefill": methods["prefill"], "decode": lambda i: (token, torch.tensor([PROMPT + i]))},
                   iterations=1, decode_steps=4, debug=False, progress=False,
                   workdir=tmp_path_factory.mktemp("llm"))


def test_phase_view_table_chart_and_kv_legend(run):
    view = PhaseView(run.inspector, run.program)
    assert list(view.data["method"]) == ["prefill", "decode"]
    assert list(view.data["kv_cache_bytes"]) == [8192, 8192]
    boxes = [t for t in view.figure.data if (t.meta or {}).get("etlab") == "phase"]
    assert [len(t.y) for t in boxes] == [1, 4]  # every run is a point of its phase
    kv = [t for t in view.figure.data if (t.meta or {}).get("etlab") == "kv_cache"]
    assert [t.meta["bytes"] for t in kv] == [8192, 8192] and all("KV cache" in t.name for t in kv)
    assert {r["method"] for r in view.table.rows} == {"prefill", "decode"}


def test_memory_view_draws_the_kv_cache_band(run):
    timeline = MemoryTimeline(run.program, "decode")
    assert sorted(timeline.data.attrs["kv_cache"]) == sorted(b.tensor for b in state_buffers(run.program, "decode"))
    band = [t for t in timeline.figure.data if (t.meta or {}).get("etlab") == "kv_cache"]
    assert len(band) == 1 and int(sum(band[0].y)) == 8192 and "8,192 bytes" in band[0].name
    plain = MemoryTimeline(to_edge(CORPUS["dynamic_conv1d"].export()).to_executorch(), "forward")
    assert not [t for t in plain.figure.data if (t.meta or {}).get("etlab") == "kv_cache"]  # no cache, no band


def test_dashboard_has_a_phases_tab_and_its_page_renders(run, tmp_path):
    dash = run.show(method="decode")
    assert "phases" in dash.views and "phases" not in dash.missing
    path = dash.save_html(tmp_path / "llm.html")
    text = path.read_text()
    assert 'data-tab="phases"' in text and 'data-etlab-view="phases"' in text and "KV cache" in text
    assert "phases" not in show(run.inspector).views  # no program: no phases tab, nothing to attribute


CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")


@pytest.mark.xdist_group("browser")
def test_phases_tab_in_chromium(run, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} not installed")
    from tests.visualizer.test_browser import FLAGS, Page

    path = run.show(method="decode").save_html(tmp_path / "llm.html")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = Page(browser, path)
            page.wait_ready()
            page.page.click("nav.etlab-tabs button[data-tab=phases]")
            phases = page.page.locator(".etlab-tab[data-tab=phases]")
            phases.wait_for(state="visible")
            page.page.wait_for_selector("[data-etlab-view=phases] .js-plotly-plot .boxlayer .trace", timeout=30_000)
            assert page.page.locator("[data-etlab-view=phases] .boxlayer .trace").count() == 2
            legend = page.page.locator("[data-etlab-view=phases] .legend").text_content()
            assert "decode KV cache: 8,192 bytes" in legend
            assert "decode" in phases.inner_text() and "prefill" in phases.inner_text()
            page.page.click("nav.etlab-tabs button[data-tab=memory]")
            page.page.wait_for_timeout(300)
            assert "KV cache (8,192 bytes)" in page.page.locator("[data-etlab-view=memory] .legend").text_content()
            page.shot("report_phases")
            assert page.errors == [] and page.requests == []
        finally:
            browser.close()


def test_runs_of_a_program_without_forward_pair_with_its_record(run):
    """prefill and decode runs are blocks named "Execute" (as upstream names them): the pairing check
    places each on a method that fits it instead of calling the run another program's."""
    from etlab.inspector import Inspector

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Inspector(etdump_path=run.workdir / "run.etdp", etrecord=str(run.workdir / "model.etrecord"), strict=True)
