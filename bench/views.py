"""Time to interactive of the graph views in headless Chromium (Debian's, driven by playwright).

For each graph: the offline page is opened and timed until every pane says it is laid out and drawn
(`data-state=ready`); "expand all" on the 5,000-node graph is timed until all nodes are placed.
Median of N page loads each. Writes the `views` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import write_section

CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def _graphs(folder: Path) -> dict[str, tuple[Path, int]]:
    import torch

    from etlab.compiler import to_edge
    from etlab.models import make_cnn, make_mobilenet_v2
    from etlab.visualizer import GraphView
    from etlab.visualizer._synthetic import synthetic_graph_model

    out = {}
    for name, make in (("cnn", make_cnn), ("mobilenet_v2", make_mobilenet_v2)):
        model, inputs = make()
        et = to_edge(torch.export.export(model, inputs)).to_executorch()
        view = GraphView(et, "edge")
        out[f"{name} (edge graph)"] = (view.save_html(folder / f"{name}.html"), len(view.model.nodes))
        three = GraphView(et, ["edge", "runtime"])
        out[f"{name} (edge + runtime panes)"] = (three.save_html(folder / f"{name}_2.html"),
                                                 sum(len(m.nodes) for m in three.models))
    big = GraphView.from_models([synthetic_graph_model(5000)], height=700)
    out["synthetic 5,000 nodes (collapsed)"] = (big.save_html(folder / "big.html"), 5000)
    return out


def _time_to_ready(browser, path: Path, expand: bool = False) -> float:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        start = time.perf_counter()
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("[data-etlab-view=graph][data-state=ready]", state="attached", timeout=180_000)
        if not expand:
            return time.perf_counter() - start
        start = time.perf_counter()
        page.click("button[data-role=expand-all]")
        page.wait_for_function("document.querySelector('svg.canvas')?.dataset.nodeCount === '5000'", timeout=180_000)
        page.wait_for_selector(".pane[data-state=ready]", state="attached", timeout=180_000)
        return time.perf_counter() - start
    finally:
        page.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    rows = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        graphs = _graphs(Path(tmp))
        cases = [(name, path, nodes, False) for name, (path, nodes) in graphs.items()]
        big_path = graphs["synthetic 5,000 nodes (collapsed)"][0]
        cases.append(("synthetic 5,000 nodes: expand all", big_path, 5000, True))
        for name, path, nodes, expand in cases:
            times = [_time_to_ready(browser, path, expand) for _ in range(args.rounds)]
            rows.append(f"| {name} | {nodes} | {statistics.median(times):.2f} | {min(times):.2f} |")
            print(rows[-1], flush=True)
        browser.close()
    body = "\n".join([
        "## views",
        "",
        f"`bench/views.py`, {datetime.date.today()}, 2 cores, load average {os.getloadavg()[0]:.1f}: offline "
        f"page opened in headless Chromium until every graph pane is laid out (ELK in a web worker) and drawn; "
        f"median and best of {args.rounds}. Targets (issue 14): MobileNetV2-class < 1 s, 5,000 nodes < 3 s.",
        "",
        "| graph | nodes | time to interactive (s) | best (s) |",
        "|---|---:|---:|---:|",
        *rows,
    ])
    write_section("views", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
