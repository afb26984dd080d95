"""Issue 25 items 6, 8, 9 in a real JupyterLab (started as `make lab` starts it): the .etdp dashboard
opens with its summary and the graph in view at 1280x800 (the file's run blocks last, folded), the
profile table has p50 second, the timeline a legend and a ms axis; the .bpte verdict names its
tolerance and the user can change it; sidebar groups are named by their program files and
"open dashboard" names its run. Screenshots (light and dark) in test-artifacts/jupyter/."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("jupyter")


@pytest.fixture
def small_screen(lab_page):
    lab_page.page.set_viewport_size({"width": 1280, "height": 800})
    yield lab_page
    lab_page.page.set_viewport_size({"width": 1500, "height": 1000})


@pytest.mark.parametrize("theme", ["JupyterLab Light", "JupyterLab Dark"])
def test_dashboard_opens_on_summary_and_graph(small_screen, lab, lab_files, theme):
    lab_page = small_screen
    light = theme == "JupyterLab Light"
    lab_page.theme(dark=not light)
    try:
        _, data = lab.get_json("etlab/api/view/etdp?path=run.etdp")
        v = lab_page.open("run.etdp")
        lab_page.wait_graph(v)
        summary = v.locator("[data-role=run-summary]")
        assert f"{lab_files.runs} run(s) · run length p50" in summary.inner_text()
        assert data["summary"]["unit"] == "ms" and data["summary"]["runs"] == lab_files.runs
        assert 0 < data["summary"]["min"] <= data["summary"]["p50"] <= data["summary"]["max"]
        # the graph is in view without scrolling; the run blocks (ticks) are last and folded
        graph = v.locator("[data-etlab-view=graph]").first.bounding_box()
        assert graph["y"] + 200 < 800, graph
        blocks = v.locator("[data-role=run-blocks]")
        assert blocks.get_attribute("open") is None
        assert not v.locator("[data-role=blocks]").is_visible()
        order = v.evaluate("el => [...el.querySelectorAll('[data-role=run-summary], [data-etlab-view=graph], "
                           "[data-role=run-blocks]')].map(e => e.dataset.role || e.dataset.etlabView)")
        assert order[0] == "run-summary" and order[-1] == "run-blocks"
        # the profile table: the event, then p50, then its share of the run
        heads = v.locator("[data-etlab-view=table] th").all_inner_texts()
        assert heads[0].startswith("event") and heads[1].startswith("p50 (ms)") and heads[2].startswith("share"), heads
        shares = [r["share"] for r in data["rows"] if r["name"] == "DELEGATE_CALL"]
        assert shares and all(0 < s <= 100 for s in shares)
        # the timeline: a legend of what the colors mean and a time axis in ms
        legend = v.locator("[data-role=timeline-legend] [data-kind]").all_inner_texts()
        assert any("delegated" in k or "call" in k for k in legend) and len(legend) >= 2, legend
        ticks = v.locator("[data-role=time-axis] text.tick").all_text_contents()
        assert len(ticks) >= 3 and all(t.endswith(" ms") for t in ticks), ticks
        lab_page.shot(f"issue25-dashboard-1280-{'light' if light else 'dark'}")
        v.locator("[data-role=timeline]").scroll_into_view_if_needed()
        lab_page.shot(f"issue25-timeline-{'light' if light else 'dark'}")
    finally:
        if not light:
            lab_page.theme(dark=False)
    assert lab_page.take_errors() == []


def test_bpte_verdict_names_and_takes_its_tolerance(lab_page, lab):
    v = lab_page.open("mlp.bpte")
    assert v.locator("[data-role=rtol]").input_value() == "0.0001"
    assert v.locator("[data-role=atol]").input_value() == "0.000001"
    v.locator("[data-role=verify]").click()
    verdict = v.locator("[data-role=verdict]")
    verdict.wait_for(timeout=120_000)
    assert verdict.inner_text() == "2 of 3 test case(s) passed at rtol 0.0001, atol 0.000001"
    # case 2 is off by exactly 1.0: an absolute tolerance of 2 lets it pass
    v.locator("[data-role=atol]").fill("2")
    v.locator("[data-role=verify]").click()
    v.locator("[data-role=verdict]", has_text="atol 2").wait_for(timeout=120_000)
    assert v.locator("[data-role=verdict]").inner_text() == "3 of 3 test case(s) passed at rtol 0.0001, atol 2"
    lab_page.shot("issue25-bpte-tolerance-light")
    v.locator("[data-role=rtol]").fill("-1")
    v.locator("[data-role=verify]").click()
    err = v.locator("[data-role=verify-result] .jp-etlab-error")
    err.wait_for(timeout=60_000)
    assert "rtol must be a finite number >= 0, got -1.0" in err.inner_text()
    assert lab_page.take_errors(expected="400") == []
    status, body = lab.get_json("etlab/api/verify?path=mlp.bpte&atol=abc", method="POST")
    assert status == 400 and body["error"] == "atol: not a number: 'abc'"


def test_sidebar_names_programs_and_the_dashboard_run(lab_page, lab_files):
    lab_page.close_all()
    lab_page.command("etlab:show-artifacts")
    panel = lab_page.page.locator("#etlab-artifacts")
    group = panel.locator(".jp-etlab-group", has=lab_page.page.locator("[data-path='mlp.pte']"))
    group.wait_for(timeout=30_000)
    title = group.locator("[data-role=group-title]")
    assert title.locator("b").inner_text() == "mlp"
    assert title.get_attribute("title").startswith("program hash ")
    newest = max(("run.etdp", "run2.etdp"), key=lambda n: (lab_files.root / n).stat().st_mtime)
    button = group.locator("[data-role=open-dashboard]")
    assert button.inner_text() == f"open dashboard: {newest}"
    # ticking one run opens that one
    other = "run.etdp" if newest == "run2.etdp" else "run2.etdp"
    group.locator(".jp-etlab-row", has=lab_page.page.locator(f"[data-path='{other}']")).locator(
        "[data-role=pick-run]").check()
    assert button.inner_text() == f"open dashboard: {other}"
    lab_page.shot("issue25-sidebar-light")
    button.click()
    v = lab_page.viewer()
    assert v.locator(".jp-etlab-head b").first.inner_text() == other
    group.locator(".jp-etlab-row", has=lab_page.page.locator(f"[data-path='{other}']")).locator(
        "[data-role=pick-run]").uncheck()
    assert lab_page.take_errors() == []
