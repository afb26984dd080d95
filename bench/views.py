"""Time to interactive of the graph views, before (ELK in the browser) and after (layout in Python),
side by side in one run, in headless Chromium (Debian's, driven by playwright).

"before" is the code of another checkout that still lays out with ELK (default: git's `--before`
ref, checked out to a temporary worktree; its pages are built by its own code in a subprocess),
"after" this checkout. Per graph and code:
- widget: the view built in Python from a compiled program (`GraphView(...)`, layout included) plus
  the page drawing it until every pane says `data-state=ready` (the widget front end's module with
  the view's state, as in a notebook, where the graph library came from the kernel in the before code);
- HTML report: the offline page (`save_html`) opened until ready;
- for 5,000 synthetic nodes also "expand all" until all 5,000 nodes are placed and drawn.
Median of N rounds, rounds interleaved (before, after, before, ...). Writes the `views` section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, write_section

CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
PYTHON = sys.executable

# Run in a subprocess with PYTHONPATH set to the checkout under test: compiles the models (untimed),
# times building each view, writes its HTML page, prints {case: [build seconds, path, nodes]}.
BUILD = r"""
import json, sys, time
from pathlib import Path
import torch
from etlab.compiler import to_edge
from etlab.models import make_cnn, make_mobilenet_v2
from etlab.visualizer import GraphView
from etlab.visualizer._synthetic import synthetic_graph_model
out, folder, tag = {}, Path(sys.argv[1]), sys.argv[2]
def case(name, make_view):
    t0 = time.perf_counter()
    view = make_view()
    built = time.perf_counter() - t0
    path = view.save_html(folder / f"{tag}-{len(out)}.html")
    out[name] = [built, str(path), sum(len(m.nodes) for m in view.models)]
for name, make in (("CNN", make_cnn), ("MobileNetV2", make_mobilenet_v2)):
    model, inputs = make()
    et = to_edge(torch.export.export(model, inputs)).to_executorch()
    case(f"{name} edge graph", lambda: GraphView(et, "edge"))
    case(f"{name} edge + runtime panes", lambda: GraphView(et, ["edge", "runtime"]))
big = synthetic_graph_model(5000)
case("synthetic 5,000 nodes", lambda: GraphView.from_models([big], height=700))
print(json.dumps(out))
"""


def build(checkout: Path, folder: Path, tag: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run([PYTHON, "-c", BUILD, str(folder), tag], env=env, cwd=checkout, capture_output=True,
                          text=True, check=True, timeout=1800)
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_to_ready(browser, path: str, expand: bool = False) -> float:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        start = time.perf_counter()
        page.goto(Path(path).resolve().as_uri())
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


def before_checkout(ref: str, tmp: Path) -> Path:
    """A temporary worktree of `ref` (the code that lays out with ELK)."""
    where = tmp / "before"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)
    return where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", default="75b7681~1", help="a git ref whose views lay out with ELK")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    results: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        before = before_checkout(args.before, tmp)
        try:
            pages = {"before": build(before, tmp, "before"), "after": build(REPO, tmp, "after")}
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                for _ in range(args.rounds):
                    for code in ("before", "after"):
                        for name, (built, path, _) in pages[code].items():
                            ready = time_to_ready(browser, path)
                            results.setdefault((name, "widget", code), []).append(built + ready)
                            results.setdefault((name, "HTML report", code), []).append(ready)
                        big = pages[code]["synthetic 5,000 nodes"][1]
                        results.setdefault(("synthetic 5,000 nodes", "expand all", code), []).append(
                            time_to_ready(browser, big, expand=True))
                browser.close()
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)
    nodes = {name: n for name, (_, _, n) in pages["after"].items()}
    rows = []
    for name, where, _ in [k for k in results if k[2] == "before"]:
        b = statistics.median(results[(name, where, "before")])
        a = statistics.median(results[(name, where, "after")])
        rows.append(f"| {name} | {nodes[name]} | {where} | {b:.2f} | {a:.2f} | {b / a:.1f}x |")
        print(rows[-1], flush=True)
    body = "\n".join([
        "## views",
        "",
        f"`bench/views.py`, {datetime.date.today()}, 2 cores shared with other jobs (load average "
        f"{os.getloadavg()[0]:.1f} at the end): time to interactive in headless Chromium, before (ELK "
        f"laying out in a web worker, git {args.before}) and after (layered layout computed in Python, "
        "cached by structure, carried in the page; the browser only places and draws), interleaved in one "
        f"run, median of {args.rounds}. Widget: the view's first build in a fresh Python process (its layout "
        "computed, nothing cached; one sample per case) + the page drawing its state until every pane is ready; "
        "HTML report: the saved page opened until ready. Absolute times scale with the machine's load (other "
        "engineers' jobs on the same 2 cores); the before/after ratios are from the same run. Targets "
        "(issue 14): MobileNetV2-class < 1 s, 5,000 nodes < 3 s.",
        "",
        "| graph | nodes | where | before (s) | after (s) | before / after |",
        "|---|---:|---|---:|---:|---:|",
        *rows,
    ])
    write_section("views", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
