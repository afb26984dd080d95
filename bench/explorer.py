"""A large program in Model Explorer through etlab's adapter: how long until it is on screen.

A chain of Linear+ReLU blocks compiled by etlab (portable, so every op stays a node) into a .pte and
its .etrecord of ~5,000 Edge nodes. Timed, medians of N rounds:
- convert: the adapter's `convert` in process (read the record's program JSON, build the graphs,
  Model Explorer's graph classes; no program is rebuilt, torch is not used): what the adapter does per
  open; wall clock and the process's CPU time (the machine is shared: wall time waits for CPU);
- encode: what Model Explorer's server does with the adapter's answer before sending it
  (`convert_adapter_response`: dataclasses.asdict of every graph, then json.dumps);
- open: Model Explorer's server (started once, `model-explorer --extensions=etlab.model_explorer`)
  asked for the record by a fresh headless Chromium page, from `goto` until the graph selector names
  the graph's node count and the canvas has drawn nodes (the adapter's convert included).
Writes the `model explorer` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_section

CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]


def build(folder: Path, blocks: int) -> tuple[Path, int]:
    import torch

    from etlab.compiler import to_edge

    model = torch.nn.Sequential(*[m for _ in range(blocks) for m in (torch.nn.Linear(8, 8), torch.nn.ReLU())])
    et = to_edge(torch.export.export(model, (torch.randn(1, 8),)), generate_etrecord=True).to_executorch()
    record = folder / "deep.etrecord"
    et.get_etrecord().save(record)
    nodes = len(et.exported_program().graph.nodes)
    return record, nodes


def drawn(page) -> bool:
    """Some non-white pixels in the graph area (left of the side panel, below the toolbar)."""
    from io import BytesIO

    from PIL import Image

    im = Image.open(BytesIO(page.screenshot())).convert("L")
    w, h = im.size
    dark = sum(n for n, v in im.crop((0, 100, int(w * 0.7), h)).getcolors(256) if v < 200)
    return dark > 500


def _row(step: str, xs: list[float]) -> str:
    return f"| {step} | {statistics.median(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=1700, help="Linear+ReLU blocks (~3 Edge nodes each)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from model_explorer.utils import convert_adapter_response
    from playwright.sync_api import sync_playwright

    from etlab.etrecord import parse_etrecord
    from etlab.model_explorer import me_graphs, to_me_graph
    from etlab.model_explorer._export import recorded_graphs
    from etlab.model_explorer._show import start
    from etlab.model_explorer.main import to_graph_classes

    with tempfile.TemporaryDirectory() as tmp:
        record, nodes = build(Path(tmp), args.blocks)
        load0 = os.getloadavg()[0]
        graphs = me_graphs(record)
        shown = len(graphs["graphs"][0]["nodes"])
        convert, convert_cpu, encode, rebuilt = [], [], [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()  # before: the record's programs rebuilt with torch, drawn from torch.fx
            to_graph_classes({"graphs": [to_me_graph(m, x) for m, x in recorded_graphs(parse_etrecord(record))]})
            rebuilt.append(time.perf_counter() - t0)
            t0, c0 = time.perf_counter(), time.process_time()
            classes = to_graph_classes(me_graphs(record))  # what the adapter's convert does
            convert.append(time.perf_counter() - t0)
            convert_cpu.append(time.process_time() - c0)
            t0 = time.perf_counter()
            json.dumps(convert_adapter_response({"graphs": classes}))  # Model Explorer's server, per open
            encode.append(time.perf_counter() - t0)
        session = start([str(record)], timeout=300)
        opens = []
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                for _ in range(args.rounds):
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    t0 = time.perf_counter()
                    page.goto(session.url, timeout=300_000)
                    page.get_by_text(re.compile(rf"^\s*({shown}|{shown:,}) nodes")).first.wait_for(timeout=600_000)
                    while not drawn(page):
                        time.sleep(0.05)
                    opens.append(time.perf_counter() - t0)
                    page.close()
                browser.close()
        finally:
            session.stop()
    load = f"{load0:.1f} before, {os.getloadavg()[0]:.1f} after"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    body = (f"## model explorer\n\n`bench/explorer.py` ({datetime.date.today()}, etlab {commit}, load average "
            f"{load} on {os.cpu_count()} cores): a chain of {args.blocks} Linear+ReLU blocks compiled by etlab "
            f"({nodes} Edge graph nodes; the adapter's Edge graph has {shown} nodes) opened from its `.etrecord` "
            f"through `model-explorer --extensions=etlab.model_explorer`. Median of {args.rounds}.\n\n"
            "| step | median s | min s | max s |\n|---|---:|---:|---:|\n"
            + _row("before: convert with the programs rebuilt by torch (same rounds, alternating)", rebuilt)
            + _row("adapter convert (read the record's JSON, graphs, Model Explorer's classes)", convert)
            + _row("adapter convert, CPU time of the process", convert_cpu)
            + _row("Model Explorer's server encoding the answer (asdict + json.dumps)", encode)
            + _row("open in Chromium until drawn (convert and encoding included)", opens)
            + f"\nTarget (issue 32): drawn within 3 s: **{'met' if statistics.median(opens) < 3 else 'not met'}**. "
            "Layers past 100 children are split into sections by the adapter (without them Model Explorer's layout "
            "overflows its stack on this chain and the graph never opens). The adapter reads the graphs from the "
            "record's torch.export JSON (`etlab.etrecord.record_graphs`) instead of rebuilding the programs with "
            "torch (the 'before' row; it was 11.9 s of 19.7 s to drawn at load 4.2).\n\n"
            f"Where the {statistics.median(opens):.1f} s go at this load: the adapter's convert "
            f"{statistics.median(convert):.1f} s ({statistics.median(convert_cpu):.1f} s of CPU: decoding the record's "
            "JSON, reading both programs, building the Edge and ATen graphs and Model Explorer's classes), Model "
            f"Explorer's server encoding them {statistics.median(encode):.1f} s (its `dataclasses.asdict` walk of "
            "every node and attribute, then JSON), and the rest "
            f"({statistics.median(opens) - statistics.median(convert) - statistics.median(encode):.1f} s) the page: "
            "sending ~7 MB, Model Explorer's processing and layout of the 5,102-node graph, drawing. Wall times "
            "here are several times the CPU times (the load average is many times the 2 cores); the 3 s target "
            "is not met at this load and was not measured on a quiet machine.\n")
    write_section("model explorer", body)
    print(body)


if __name__ == "__main__":
    sys.exit(main())
