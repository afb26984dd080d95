"""The extension in a real JupyterLab, driven like a user: double-click each file type in the file
browser and check what is drawn; a corrupt file and a mismatched pair show their messages; the views
of a page are linked; the sidebar groups files and compares runs; a file changed on disk offers a
reload; no console errors; light and dark screenshots in test-artifacts/jupyter/."""

from __future__ import annotations

import os
import time

import pytest

pytestmark = pytest.mark.xdist_group("jupyter")


def test_pte_viewer(lab_page):
    v = lab_page.open("mlp.pte")
    lab_page.wait_graph(v)
    assert v.locator("[data-role=methods] tbody tr").count() == 1
    assert "DemoBackend #0" in v.locator("[data-role=methods]").inner_text()
    assert v.locator("svg.canvas").first.get_attribute("data-node-count") == "7"
    assert v.locator("[data-role=memory] rect.block").count() == 6
    # linked: a graph node lights up the planned tensors live at its step
    v.locator("g.node[data-node-name='2: DemoBackend #1']").click()
    assert v.locator("[data-role=memory] rect.block.jp-etlab-hit").count() >= 2
    lab_page.shot("pte-light")
    assert lab_page.take_errors() == []


def test_etdp_dashboard_and_linked_selection(lab_page, lab, lab_files):
    _, data = lab.get_json("etlab/api/view/etdp?path=run.etdp")
    v = lab_page.open("run.etdp")
    lab_page.wait_graph(v)
    assert "mlp.etrecord" == v.locator("[data-role=program-picker]").input_value()
    assert v.locator("[data-role=blocks] tbody tr").count() == len(data["blocks"])
    rows = v.locator("[data-etlab-view=table] tr.row")
    assert rows.count() == len(data["rows"]) > 0
    assert v.locator("[data-role=timeline] rect.span").count() == len(data["rows"]) * lab_files.runs
    assert v.locator("[data-etlab-view=graph] .pane").count() == 2  # ATen and Edge side by side
    # graph node -> profile rows of that node, its spans highlighted
    edge = v.locator(".pane[data-kind=edge]")
    node = edge.locator("g.node[data-node-name='relu']")
    node.click()
    assert v.locator("[data-role=filter-note]").is_visible()
    assert 0 < rows.count() < len(data["rows"])
    assert all("relu" in rows.nth(i).inner_text().lower() for i in range(rows.count()))
    hits = v.locator("[data-role=timeline] rect.span.jp-etlab-hit").count()
    assert hits == rows.count() * lab_files.runs
    # ... and the planned tensors live at its instruction (the memory plan of mlp.pte, same program)
    assert v.locator("[data-role=memory] rect.block").count() == len(data["memory"]) == 6
    live = [b for b in data["memory"] if b["first"] <= 1 <= b["last"]]  # relu is instruction 1
    assert v.locator("[data-role=memory] rect.block.jp-etlab-hit").count() == len(live) > 0
    v.locator("[data-role=show-all]").click()
    assert rows.count() == len(data["rows"])
    # profile row -> graph node selected, spans highlighted
    row = v.locator("[data-etlab-view=table] tr.row", has_text="DELEGATE_CALL").first
    row.click()
    v.locator("[data-role=details-name]").wait_for(timeout=10_000)
    assert v.locator("g.node.selected").count() >= 1
    assert v.locator("[data-role=timeline] rect.span.jp-etlab-hit").count() >= lab_files.runs
    lab_page.shot("etdp-dashboard-light")
    # the run's allocation events added up, on the plan's axis: the peak run's stacked bars, the owners;
    # a bar picks its instruction's profile rows
    seen = data["observed_memory"]
    assert seen is not None and seen["peak_bytes"] > seen["load_bytes"] > 0
    box = v.locator("[data-role=observed-memory]")
    peak = [t for t in seen["timeline"] if t["run"] == seen["peak_run"]]
    bars = sum((t["accumulated"] > 0) + (t["transient"] > 0) for t in peak)  # bytes above load
    assert box.locator("rect.observed").count() == bars > 0
    assert box.locator("[data-role=memory-owners] tbody tr").count() == len(seen["owners"])
    assert f"run {seen['peak_run']}, instruction {seen['peak_instruction']}" in box.locator("h3").inner_text()
    box.locator(f"rect.observed.transient[data-instruction='{seen['peak_instruction']}']").click()
    assert v.locator("[data-role=filter-note]").is_visible() and 0 < rows.count() < len(data["rows"])
    box.scroll_into_view_if_needed()
    lab_page.shot("etdp-memory-light")
    assert lab_page.take_errors() == []


def test_etrecord_viewer(lab_page, lab):
    _, data = lab.get_json("etlab/api/view/etrecord?path=mlp.etrecord")
    v = lab_page.open("mlp.etrecord")
    lab_page.wait_graph(v)
    panes = v.locator("[data-etlab-view=graph] .pane")
    assert panes.count() == 2
    counts = [panes.nth(i).locator("svg.canvas").get_attribute("data-node-count") for i in range(2)]
    assert counts == [str(len(g["nodes"])) for g in data["graphs"]]
    modules = v.locator("[data-role=modules] .jp-etlab-module")
    assert modules.count() == len(data["modules"]) > 0
    v.locator("[data-role=modules] .jp-etlab-module[data-module=fc1]").click()
    assert "match" in v.locator("[data-role=status]").inner_text()
    assert lab_page.take_errors() == []


def test_bpte_viewer_verifies(lab_page):
    v = lab_page.open("mlp.bpte")
    assert v.locator("[data-role=cases] tbody tr").count() == 3
    v.locator("[data-role=verify]").click()
    verdict = v.locator("[data-role=verdict]")
    verdict.wait_for(timeout=120_000)
    assert verdict.inner_text() == "2 of 3 test case(s) passed at rtol 0.0001, atol 0.000001"
    assert v.locator("[data-role=verify-cases] tbody tr", has_text="FAILED").count() == 1
    lab_page.shot("bpte-light")
    assert lab_page.take_errors() == []


def test_corrupt_file_shows_the_format_error(lab_page, lab, lab_files):
    from etlab.errors import FormatError
    from etlab.schema import load_file

    with pytest.raises(FormatError) as e:
        load_file(lab_files.root / "corrupt.pte", what="corrupt.pte")
    v = lab_page.open("corrupt.pte", state="error")
    assert v.locator("[data-role=error]").inner_text() == str(e.value)
    assert lab.alive()
    lab_page.shot("corrupt-light")
    assert lab_page.take_errors(expected="422") == []


def test_mismatched_pair_message(lab_page):
    v = lab_page.open("other_run.etdp")
    assert "none of mlp.etrecord, corrupt.pte, mlp.pte is the program of this run" in \
        v.locator("[data-role=unpaired]").inner_text()
    v.locator("[data-role=program-picker]").select_option("mlp.etrecord")
    msg = lab_page.viewer().locator("[data-role=mismatch]")
    msg.wait_for(timeout=30_000)
    assert "other_run.etdp does not match mlp.etrecord" in msg.inner_text()
    assert "another program" in msg.inner_text()
    assert lab_page.take_errors() == []


def test_sidebar_groups_and_compares_runs(lab_page):
    lab_page.close_all()
    lab_page.command("etlab:show-artifacts")
    panel = lab_page.page.locator("#etlab-artifacts")
    group = panel.locator(".jp-etlab-group", has=lab_page.page.locator("[data-path='mlp.pte']"))
    group.wait_for(timeout=30_000)
    assert sorted(group.locator("a.jp-etlab-file").all_inner_texts()) == [
        "mlp.bpte", "mlp.etrecord", "mlp.pte", "run.etdp", "run2.etdp"]
    lab_page.shot("sidebar-light")
    group.locator("[data-role=compare-runs]").click()
    v = lab_page.viewer()
    lab_page.wait_graph(v)
    assert v.locator("[data-etlab-view=table] tr.row").count() > 0
    assert "p50 ratio" in v.inner_text()
    # run.etdp logged its intermediates (run.bin), run2.etdp did not: the ratios are flagged
    assert "captured intermediate outputs" in v.locator("[data-role=capture-warning]").inner_text()
    assert v.locator(".legend [data-role=diverging]").count() == 1
    lab_page.shot("compare-light")
    v.locator("[data-etlab-view=table] tr.row", has_text="DELEGATE_CALL").first.click()
    v.locator("g.node.selected").first.wait_for(timeout=10_000)
    lab_page.close_all()
    group.locator("[data-role=open-dashboard]").click()
    lab_page.wait_graph(lab_page.viewer())
    assert lab_page.take_errors() == []


def test_reload_offered_when_the_file_changes(lab_page, lab_files):
    v = lab_page.open("run2.etdp")
    bar = v.locator("xpath=..").locator("[data-role=reload-bar]")
    path = lab_files.root / "run2.etdp"
    now = time.time()  # later than the file's mtime: a new run written over it
    os.utime(path, (now, now))
    bar.wait_for(state="visible", timeout=15_000)
    bar.locator("[data-role=reload]").click()
    lab_page.viewer()
    assert not bar.is_visible()
    assert lab_page.take_errors() == []


def test_dark_theme(lab_page):
    lab_page.theme(dark=True)
    try:
        v = lab_page.open("run.etdp")
        lab_page.wait_graph(v)
        bg = v.evaluate("el => getComputedStyle(el).backgroundColor")
        assert bg != "rgb(255, 255, 255)"
        table_bg = v.locator(".etlab-tv th").first.evaluate("el => getComputedStyle(el).backgroundColor")
        assert table_bg != "rgb(244, 246, 249)"  # the view's light default is replaced by the theme's color
        lab_page.shot("etdp-dashboard-dark")
        v.locator("[data-role=observed-memory]").scroll_into_view_if_needed()
        lab_page.shot("etdp-memory-dark")
        v = lab_page.open("mlp.pte")
        lab_page.wait_graph(v)
        lab_page.shot("pte-dark")
        v = lab_page.open("mlp.etrecord")
        lab_page.wait_graph(v)
        lab_page.shot("etrecord-dark")
    finally:
        lab_page.theme(dark=False)
    assert lab_page.take_errors() == []


def test_context_menu_and_palette(lab_page):
    lab_page.close_all()
    lab_page.page.evaluate("window.jupyterapp.shell.activateById('filebrowser')")
    lab_page.page.locator(".jp-DirListing-item[title^='Name: run.etdp']").click(button="right")
    entry = lab_page.page.locator(".lm-Menu-item[data-command='etlab:open-in-viewer']")
    entry.wait_for(timeout=10_000)
    entry.click()
    v = lab_page.viewer()
    lab_page.wait_graph(v)
    assert v.get_attribute("data-etlab-kind") == "etdp"
    lab_page.page.keyboard.press("Control+Shift+C")
    palette = lab_page.page.locator(".lm-CommandPalette-item", has_text="etlab: compare runs…")
    palette.wait_for(timeout=10_000)
    assert lab_page.page.locator(".lm-CommandPalette-item", has_text="etlab: open dashboard for…").count() == 1
    lab_page.page.keyboard.press("Escape")
    assert lab_page.take_errors() == []
