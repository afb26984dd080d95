"""CompareView: built from Inspector.compare (portable vs DemoBackend-delegated MLP, and a planted
weight error), in Python and as an offline page in headless Chromium (light and dark)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.inspector import Inspector
from etlab.models import make_mlp
from etlab.runtime import Runtime
from etlab.visualizer import CompareView, GraphView
from tests.visualizer.test_browser import Page, browser  # noqa: F401  (browser: the module's Chromium fixture)


def _inspector(folder: Path, *, delegate: bool = False, plant: bool = False, intermediates: bool = True) -> Inspector:
    model, inputs = make_mlp()
    if plant:
        with torch.no_grad():
            model.fc2.weight[3, 5] += 0.5
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                       partitioner=[DemoPartitioner()] if delegate else None, generate_etrecord=True)
    manager = edge.to_executorch()
    folder.mkdir(parents=True, exist_ok=True)
    manager.write_to_file(folder / "model.pte")
    program = Runtime.get().load_program(folder / "model.pte", enable_etdump=True,
                                         debug_buffer_size=1 << 20 if intermediates else None)
    method = program.load_method("forward")
    for _ in range(3):
        method.execute(list(inputs))
    buffer = folder / "run.bin" if intermediates else None
    program.write_etdump_result_to_file(folder / "run.etdp", buffer)
    record = manager.get_etrecord()
    record.update_representative_inputs(list(inputs))
    return Inspector(etdump_path=folder / "run.etdp", debug_buffer_path=buffer, etrecord=record)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compare_view")


@pytest.fixture(scope="module")
def runs(root) -> dict[str, Inspector]:
    return {"portable": _inspector(root / "portable"), "delegated": _inspector(root / "delegated", delegate=True),
            "planted": _inspector(root / "planted", plant=True)}


def test_view_puts_ratio_and_delta_on_the_graph(runs):
    c = runs["portable"].compare(runs["planted"], name_a="float", name_b="planted")
    view = c.show(overlay="numeric")
    assert isinstance(view, CompareView) and isinstance(view.graph, GraphView)
    assert view.graph.overlay == "gap" and len(view.table.rows) == len(c.rows)
    model = view.models[0]
    assert model.time_unit == "× (B/A)" and model.gap_metric == "max |B−A|"
    by_key = {r.key: r for r in c.rows}
    drawn = [n for n in model.nodes if n.latency is not None]
    assert drawn and all(n.latency["p50"] == pytest.approx(by_key[n.latency["events"][0]].ratio) for n in drawn)
    fc2 = next(r for r in c.rows if r.max_abs and r.module == "fc2")
    node = next(n for n in model.nodes if set(n.handles) & set(fc2.handles) and n.op == "aten.addmm.default")
    assert fc2.max_abs > 0 and node.gap == pytest.approx(fc2.max_abs)
    fc1 = next(n for n in model.nodes if n.module == "fc1" and n.op == "aten.addmm.default")
    assert fc1.gap == 0.0
    # a table row focuses its node
    row = next(r for r in view.table.rows if r["key"] == fc2.key)
    assert set(row["focus"]["handles"]) == set(fc2.handles)
    html = c._repr_html_()
    assert "compare-repr" in html and "float" in html and fc2.key in html


def test_view_without_handles_has_no_graph(runs, root, tmp_path):
    a = runs["portable"]
    assert CompareView(a.compare(a, by="instruction")).graph is not None  # the ETRecord's handles still place rows
    plain = Inspector(etdump_path=root / "portable" / "run.etdp", debug_buffer_path=root / "portable" / "run.bin")
    c = plain.compare(plain)
    assert c.by == "event"
    view = CompareView(c)
    assert view.graph is None and "No graph overlay" in view.note.value
    assert view.numeric is not None and max(view.numeric.data[1].y) == 0.0  # two runs of one program: no difference
    no_data = Inspector(etdump_path=root / "portable" / "run.etdp")
    assert CompareView(no_data.compare(no_data)).numeric is None  # no debug buffer: no numeric chart
    page = Path(view.save_html(tmp_path / "c.html")).read_text()
    assert 'window["etlabGraphView"]' not in page and "data-etlab-view='compare'" in page
    with pytest.raises(ValueError, match="overlay"):
        CompareView(c, overlay="heat")


def test_warns_when_only_one_run_captured_intermediates(runs, root):
    """Logging every op's output slows that run: B/A between a logging and a plain run misleads, and says so."""
    from etlab.visualizer._compare_view import comparison_html

    plain = _inspector(root / "plain", intermediates=False)
    c = runs["portable"].compare(plain, name_a="logged", name_b="plain")
    view = CompareView(c, show_graph=False)
    assert view.warning.startswith("Run A captured intermediate outputs and run B did not")
    assert "data-role='capture-warning'" in view.note.value and "data-role='capture-warning'" in comparison_html(c)
    flipped = CompareView(plain.compare(runs["portable"]), show_graph=False)
    assert flipped.warning.startswith("Run B captured intermediate outputs and run A did not")
    same = runs["portable"].compare(runs["delegated"])
    assert CompareView(same, show_graph=False).warning == "" and "capture-warning" not in comparison_html(same)


def test_ratio_overlay_is_centered_at_one(runs):
    c = runs["portable"].compare(runs["delegated"])
    model = CompareView(c).models[0]
    assert model.latency_center == 1.0 and model.to_json()["latency_center"] == 1.0


# --- in the browser (the report tests' Chromium and page harness) ----------------------------------------


@pytest.mark.xdist_group("browser")
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_compare_report_in_chromium(browser, runs, tmp_path, scheme):  # noqa: F811  (the imported fixture)
    c = runs["portable"].compare(runs["delegated"], name_a="portable", name_b="delegated")
    page = Page(browser, Path(c.save_html(tmp_path / "compare.html")))
    p = page.page
    p.emulate_media(color_scheme=scheme)
    page.wait_ready()
    assert p.locator("[data-etlab-view=compare]").get_attribute("data-rows") == str(len(c.rows))
    assert p.locator(".etlab-tv tr.row").count() == len(c.rows)
    # the graph's color scale is split at B = A (two colors, log scale symmetric about 1) and spans the
    # rows' ratios; B's delegated partitions are outlined
    ratios = [r.ratio for r in c.rows if r.ratio]
    legend = p.locator(".etlab-gv .legend")
    assert legend.locator("[data-role=diverging]").count() == 1 and "split at 1" in legend.inner_text()
    low, high = (float(x) for x in re.findall(r"[0-9.]+(?:e[-+]?[0-9]+)?", legend.inner_text())[:2])
    assert math.isclose(low * high, 1.0, rel_tol=0.02)
    assert low <= min(ratios) * 1.01 and high >= max(ratios) * 0.99
    fills = p.evaluate("""() => [...document.querySelectorAll('.etlab-gv g.node')].map((g) => {
        const m = (g.querySelector('rect').getAttribute('style') || '').match(/fill:rgb\\((\\d+),(\\d+),(\\d+)\\)/);
        const t = g.querySelector('text.sub').textContent;
        return m ? [parseFloat(t), +m[1], +m[3]] : null; }).filter(Boolean)""")
    away = [(ratio, red, blue) for ratio, red, blue in fills if not 0.95 <= ratio <= 1.05]
    assert away, fills
    for ratio, red, blue in away:  # slower in red, faster in blue
        assert (red > blue) == (ratio > 1), (ratio, red, blue)
    assert p.locator("[data-group-id^='delegate:']").count() == 3
    # a row click selects its node in the graph, whose details carry the row's ratio
    i, row = next((i, r) for i, r in enumerate(c.rows) if r.backend_b)
    p.locator(".etlab-tv tr.row").nth(i).click()
    p.wait_for_function("document.querySelector('[data-role=details-name]')?.textContent.length > 0")
    details = p.locator("[data-role=details]").inner_text()
    assert "B/A" in details and row.key in details
    page.shot(f"compare_{scheme}")
    assert page.errors == [] and page.requests == []
    p.close()
