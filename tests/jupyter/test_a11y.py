"""Keyboard and screen-reader access of the etlab file viewers in JupyterLab started as `make lab` starts it
(the lab fixture, tests/jupyter/conftest.py): Tab reaches graph nodes and the profile table's rows, arrows
move, Enter selects (and the linked views follow); axe-core (npm, labextension's devDependency) finds no
serious or critical violation inside each viewer in JupyterLab's light and dark themes. Screenshots in
test-artifacts/jupyter/ (a11y-*)."""

from __future__ import annotations

import pytest

from tests.visualizer.axe import SVG_NODE_CONTRAST, axe_violations

pytestmark = pytest.mark.xdist_group("jupyter")

VIEWER = ".jp-MainAreaWidget:not(.lm-mod-hidden) .jp-etlab"
FILES = ("mlp.pte", "run.etdp", "mlp.etrecord", "mlp.bpte")


def _active(page, attr: str):
    return page.evaluate(f"() => document.activeElement && document.activeElement.getAttribute('{attr}')")


def _tab_until(page, predicate_js: str, limit: int = 80) -> bool:
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(predicate_js):
            return True
    return False


def test_keyboard_in_the_run_viewer(lab_page, lab):
    _, data = lab.get_json("etlab/api/view/etdp?path=run.etdp")
    v = lab_page.open("run.etdp")
    lab_page.wait_graph(v)
    p = lab_page.page
    v.locator("[data-etlab-view=graph] [data-role=overlay]").first.focus()
    assert _tab_until(p, f"() => !!document.activeElement?.closest('{VIEWER} .etlab-gv .node')")
    name = _active(p, "data-node-name")
    assert _active(p, "aria-label").startswith(name)
    tip = v.locator("[data-role=tooltip]:visible")
    assert tip.count() == 1 and name in tip.inner_text()
    p.keyboard.press("ArrowDown")
    below = _active(p, "data-node-name")
    assert below and below != name
    p.keyboard.press("Enter")
    p.wait_for_function("(n) => document.querySelector('" + VIEWER + " [data-role=details-name]')?.textContent === n",
                        arg=below)
    lab_page.shot("a11y-etdp-graph-focus")
    # the profile table: one Tab stop, arrows move, Enter picks the row (and the graph selects its node)
    rows = v.locator("[data-etlab-view=table] tr.row")
    v.locator("[data-role=show-all]").click() if v.locator("[data-role=show-all]").is_visible() else None
    assert rows.count() == len(data["rows"])
    v.locator("[data-etlab-view=table] [data-role=filter]").first.focus()
    assert _tab_until(p, f"() => !!document.activeElement?.matches('{VIEWER} [data-etlab-view=table] tr.row')")
    first = _active(p, "data-row")
    p.keyboard.press("ArrowDown")
    second = _active(p, "data-row")
    assert second is not None and second != first
    p.keyboard.press("Enter")
    assert v.locator(f"[data-etlab-view=table] tr.row.selected[data-row='{second}']").count() == 1
    v.locator("[data-role=details-name]").wait_for(timeout=10_000)
    lab_page.shot("a11y-etdp-table-focus")
    assert lab_page.take_errors() == []


@pytest.mark.parametrize("theme", ["JupyterLab Light", "JupyterLab Dark"])
def test_axe_in_each_viewer(lab_page, theme):
    light = theme == "JupyterLab Light"
    lab_page.theme(dark=not light)
    found, contrast = {}, {}
    try:
        for name in FILES:
            v = lab_page.open(name)
            if v.locator("[data-etlab-view=graph]").count():
                lab_page.wait_graph(v)
            found[name] = axe_violations(lab_page.page, VIEWER)
            contrast[name] = lab_page.page.evaluate(SVG_NODE_CONTRAST)
            lab_page.shot(f"a11y-{name.replace('.', '-')}-{'light' if light else 'dark'}")
    finally:
        if not light:
            lab_page.theme(dark=False)
    assert all(not v for v in found.values()), found
    assert all(c["ratio"] >= 4.5 for c in contrast.values()), contrast
    assert lab_page.take_errors() == []
