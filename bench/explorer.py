"""A large program in Model Explorer through etlab's adapter: how long until it is on screen, and where it goes.

Chains of Linear+ReLU blocks compiled by etlab (portable, so every op stays a node) into .etrecord files:
a large one (~5,000 Edge nodes, the issue's target) and a small one (~30 nodes: what Model Explorer's
page costs whatever the graph). Both opened as a user opens them: Model Explorer's server started once
(`model-explorer FILE --extensions=etlab.model_explorer`), its address opened in a fresh headless Chromium
page per round. Per round and graph, from `goto`: when the page asked the server for the graph (its
start-up), when the server's answer arrived (the adapter's convert and the server's encoding), and when
the graph was drawn (the graph selector names its node count and the canvas has drawn nodes).
In process, also timed (wall and CPU time; the machine is shared: wall time waits for CPU): the
adapter's `convert` (what the server calls per open) and the server's encoding of its answer, in the
server's order (`convert_adapter_response`: dataclasses.asdict of every graph with the answer held, the
answer dropped, then json.dumps).
Medians of N rounds. The note says how loaded the machine was (the target is judged on a quiet one).
Writes the `model explorer` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import write_section

CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]
SMALL_BLOCKS = 10


def build(folder: Path, blocks: int) -> tuple[Path, int]:
    import torch

    from etlab.compiler import to_edge

    model = torch.nn.Sequential(*[m for _ in range(blocks) for m in (torch.nn.Linear(8, 8), torch.nn.ReLU())])
    et = to_edge(torch.export.export(model, (torch.randn(1, 8),)), generate_etrecord=True).to_executorch()
    record = folder / f"chain{blocks}.etrecord"
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


@dataclass
class Opens:
    """Seconds from `goto`, per round: the page asked for the graph, the answer arrived, the graph was drawn."""

    asked: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    drawn: list[float] = field(default_factory=list)

    def median(self, what: str) -> float:
        return statistics.median(getattr(self, what))

    def server(self) -> list[float]:
        return [b - a for a, b in zip(self.asked, self.answered)]

    def page_after(self) -> list[float]:
        return [b - a for a, b in zip(self.answered, self.drawn)]


def open_once(browser, url: str, shown: int, out: Opens) -> None:
    """A fresh page opens `url` (Model Explorer with one graph of `shown` nodes) until drawn; times into `out`."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    marks: dict[str, float] = {}
    page.on("request", lambda r: "send_command" in r.url and marks.setdefault("asked", time.perf_counter()))
    page.on("requestfinished", lambda r: "send_command" in r.url and marks.setdefault("answered", time.perf_counter()))
    t0 = time.perf_counter()
    page.goto(url, timeout=300_000)
    page.get_by_text(re.compile(rf"^\s*({shown}|{shown:,}) nodes")).first.wait_for(timeout=600_000)
    while not drawn(page):
        time.sleep(0.05)
    out.drawn.append(time.perf_counter() - t0)
    out.asked.append(marks.get("asked", float("nan")) - t0)
    out.answered.append(marks.get("answered", float("nan")) - t0)
    page.close()


PAGE_THREADS = {"CrRendererMain": "main thread", "DedicatedWorker thread": "worker"}
TRACED = 3  # opens per graph recorded with Chromium's tracing (their CPU rows: medians)


def thread_cpu(trace: dict, start: float, end: float) -> dict[str, float]:
    """CPU seconds of the page's main thread and its worker between two trace timestamps (microseconds):
    the thread time of their top-level trace events (nested ones are inside them)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = dict.fromkeys(PAGE_THREADS.values(), 0.0)
    ends: dict[tuple, float] = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and "tdur" in e), key=lambda e: e["ts"]):
        key = (e["pid"], e["tid"])
        what = PAGE_THREADS.get(names.get(key, ""))
        if what is None or e["ts"] < ends.get(key, 0):
            continue
        ends[key] = e["ts"] + e.get("dur", 0)
        if start <= e["ts"] < end:
            out[what] += e["tdur"] / 1e6
    return out


def traced_open(browser, url: str, shown: int) -> dict[str, dict[str, float]]:
    """One more open with Chromium's trace recording: CPU seconds of the page's main thread and worker
    before the page asked for the graph and from the answer to drawn (wall time waits for CPU at load)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    browser.start_tracing(page=page, categories=["devtools.timeline", "disabled-by-default-devtools.timeline"])
    page.goto(url, timeout=300_000)
    page.get_by_text(re.compile(rf"^\s*({shown}|{shown:,}) nodes")).first.wait_for(timeout=600_000)
    while not drawn(page):
        time.sleep(0.05)
    trace = json.loads(browser.stop_tracing())
    page.close()
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    sent = [e for e in events if e.get("name") == "ResourceSendRequest"
            and "send_command" in e.get("args", {}).get("data", {}).get("url", "")]
    rid = sent[0]["args"]["data"]["requestId"]
    done = next(e["ts"] for e in events if e.get("name") == "ResourceFinish"
                and e.get("args", {}).get("data", {}).get("requestId") == rid)
    return {"before": thread_cpu(trace, 0, sent[0]["ts"]), "after": thread_cpu(trace, done, float("inf"))}


def in_process(record: Path, rounds: int) -> dict[str, list[float]]:
    """The adapter's convert and the server's encoding of its answer, wall and CPU seconds per round."""
    from model_explorer.utils import convert_adapter_response

    from etlab.model_explorer.main import EtlabAdapter

    out: dict[str, list[float]] = {k: [] for k in ("convert", "convert_cpu", "encode", "encode_cpu")}
    adapter = EtlabAdapter()
    for _ in range(rounds):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        answer = adapter.convert(str(record), {})  # what Model Explorer's server calls per open
        t1, c1 = time.perf_counter(), time.process_time()
        encoded = convert_adapter_response(answer)  # the server's order: asdict, answer dropped, JSON
        del answer
        json.dumps(encoded)
        t2, c2 = time.perf_counter(), time.process_time()
        del encoded
        out["convert"].append(t1 - t0)
        out["convert_cpu"].append(c1 - c0)
        out["encode"].append(t2 - t1)
        out["encode_cpu"].append(c2 - c1)
    return out


def _row(step: str, xs: list[float]) -> str:
    return f"| {step} | {statistics.median(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |\n"


def _stage_row(step: str, large: list[float], small: list[float]) -> str:
    return f"| {step} | {statistics.median(large):.2f} | {statistics.median(small):.2f} |\n"


QUIET = 0.5  # load average per core under which the machine counts as quiet (wall times comparable)
PREVIOUS = ("Before this round of changes, interleaved with it in one process (7 rounds, load average 14.9, "
            "CPU medians; CPU time also stretches under load, so compare within a run): convert 0.62 -> 0.53 s, "
            "encoding 0.86 -> 0.60 s, the collector no longer running over the server's heap while Model Explorer "
            "copies the answer. That version on a lighter machine (d133cd5, load average 1.4 / 3.1): convert "
            "0.58 s, encoding 0.60 s, answer at 2.63 s, drawn at 4.56 s; at 6df67aa, on a quiet machine (load 0.8): "
            "convert 2.19 s, encoding 0.57 s, drawn 4.88 s.")


def load_note(load0: float, load1: float, cores: int, drawn_s: float) -> str:
    """The target's verdict and what the wall times mean at the load they were measured under."""
    quiet = max(load0, load1) <= QUIET * cores
    verdict = "met" if drawn_s < 3 else "not met"
    if quiet:
        return (f"Target (issue 32): drawn within 3 s: **{verdict}**, measured on a quiet machine (load average "
                f"{load0:.1f} / {load1:.1f} on {cores} cores).")
    return (f"Target (issue 32): drawn within 3 s: **{verdict} at this load** (load average {load0:.1f} / "
            f"{load1:.1f} on {cores} cores, other jobs sharing the machine): wall times here wait for CPU and are "
            "inflated; the CPU-time rows are the comparable ones, and the target is judged on a quiet machine "
            f"(load average at most {QUIET * cores:.0f}).")


def top_level(nodes: list[dict]) -> int:
    """How many items Model Explorer's first view lays out: the top-level layers (collapsed) and nodes."""
    return len({n["namespace"].split("/")[0] for n in nodes if n["namespace"]}) + sum(not n["namespace"] for n in nodes)


def report(args, nodes: int, shown: int, top: int, small_shown: int, size: int, proc: dict, large: Opens,
           small: Opens, cpu: list[dict], load0: float, load1: float) -> str:
    cores = os.cpu_count() or 1
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    med = {k: statistics.median(v) for k, v in proc.items()}
    fixed = small.median("drawn")
    variable = large.median("drawn") - fixed
    return (
        f"## model explorer\n\n`bench/explorer.py` ({datetime.date.today()}, etlab {commit}, load average "
        f"{load0:.1f} before, {load1:.1f} after on {cores} cores): a chain of {args.blocks} Linear+ReLU blocks "
        f"compiled by etlab ({nodes} Edge graph nodes; the adapter's Edge graph has {shown:,} nodes, its ATen graph "
        f"comes in the same answer) opened from its `.etrecord` through `model-explorer "
        f"--extensions=etlab.model_explorer` in headless Chromium (software WebGL), and a chain of {SMALL_BLOCKS} "
        f"blocks ({small_shown} nodes) opened the same way: what Model Explorer's page costs whatever the graph. "
        f"Median of {args.rounds} rounds.\n\n"
        "| in process (what the server does per open) | median s | min s | max s |\n|---|---:|---:|---:|\n"
        + _row("adapter convert (read the record's JSON, both graphs, Model Explorer's answer)", proc["convert"])
        + _row("adapter convert, CPU time", proc["convert_cpu"])
        + _row(f"server's encoding of the answer (asdict, then JSON: {size / 1e6:.1f} MB)", proc["encode"])
        + _row("server's encoding, CPU time", proc["encode_cpu"])
        + "\n| in the browser, seconds from `goto` (median) | "
        f"{shown:,} nodes | {small_shown} nodes |\n|---|---:|---:|\n"
        + _stage_row("the page asks for the graph (Model Explorer's page starting)", large.asked, small.asked)
        + _stage_row("server: request to answer arrived (convert, encoding, transfer)", large.server(), small.server())
        + _stage_row("page: answer to drawn (parse, Model Explorer's processing and layout, drawing)",
                     large.page_after(), small.page_after())
        + _stage_row("**drawn**", large.drawn, small.drawn)
        + "".join(f"| CPU s of the page's {what}, {phase} (median of {TRACED} traced opens) | "
                  f"{cpu[0][key][what]:.2f} | {cpu[1][key][what]:.2f} |\n"
                  for key, what, phase in (("before", "main thread", "until it asks"),
                                           ("after", "main thread", "answer to drawn"),
                                           ("after", "worker", "answer to drawn (Model Explorer's graph processing)")))
        + "\n" + load_note(load0, load1, cores, large.median("drawn"))
        + " The CPU rows of the page count its main thread and its worker only (not the compositor or the GPU "
        "process drawing with software WebGL)."
        + f" Of the {large.median('drawn'):.1f} s, {fixed:.1f} s are what the {small_shown}-node graph takes too "
        "(Model Explorer's page starting, its worker and renderer starting, drawing, and the measurement's "
        f"screenshots); the graph's size adds {variable:.1f} s: the server's convert ({med['convert']:.2f} s, "
        f"{med['convert_cpu']:.2f} s CPU) and encoding ({med['encode']:.2f} s, {med['encode_cpu']:.2f} s CPU), "
        "then the page parsing the answer, copying the graph to its worker and back and processing every node "
        f"and layer (node ids, namespaces, edges, layout connections, identical-layer hashes) before it lays out "
        f"the first view ({top} top-level items: the sections of the chain, collapsed; a cheap layout). "
        "The adapter keeps the garbage collector paused from its convert until Model Explorer's server has copied "
        "the answer (`collector_paused_until_freed`), splits layers past 100 children into sections (without "
        "them Model Explorer's layout overflows its stack on this chain) and reads the graphs from the record's "
        "torch.export JSON without rebuilding the programs. " + PREVIOUS + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=1700, help="Linear+ReLU blocks (~3 Edge nodes each)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true", help="print the section, do not write bench/RESULTS.md")
    args = ap.parse_args()
    from model_explorer.utils import convert_adapter_response
    from playwright.sync_api import sync_playwright

    from etlab.model_explorer._show import start
    from etlab.model_explorer.main import EtlabAdapter

    with tempfile.TemporaryDirectory() as tmp:
        record, nodes = build(Path(tmp), args.blocks)
        small_record, _ = build(Path(tmp), SMALL_BLOCKS)
        load0 = os.getloadavg()[0]
        answer = EtlabAdapter().convert(str(record), {})
        shown = len(answer["graphs"][0].nodes)
        top = top_level(answer["graphs"][0].nodes)
        size = len(json.dumps(convert_adapter_response(answer)))
        small_shown = len(EtlabAdapter().convert(str(small_record), {})["graphs"][0].nodes)
        del answer
        proc = in_process(record, args.rounds)
        sessions = [start([str(r)], timeout=300) for r in (record, small_record)]
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                large, small = Opens(), Opens()
                for _ in range(args.rounds):  # alternating: load drifts hit both alike
                    open_once(browser, sessions[0].url, shown, large)
                    open_once(browser, sessions[1].url, small_shown, small)
                traced = [[traced_open(browser, s.url, n) for s, n in zip(sessions, (shown, small_shown))]
                          for _ in range(TRACED)]
                cpu = [{k: {w: statistics.median(t[i][k][w] for t in traced) for w in PAGE_THREADS.values()}
                        for k in ("before", "after")} for i in range(2)]
                browser.close()
        finally:
            for s in sessions:
                s.stop()
    load1 = os.getloadavg()[0]
    body = report(args, nodes, shown, top, small_shown, size, proc, large, small, cpu, load0, load1)
    if not args.dry_run:
        write_section("model explorer", body)
    print(body)


if __name__ == "__main__":
    sys.exit(main())
