"""Time to first paint of the JupyterLab viewers (target: under 1.5 s each on 2 cores).

A real JupyterLab started the way `make lab` starts it (`make lab-server` on the venv as `make
setup` left it, no path overrides; 127.0.0.1, Debian chromium via playwright) over a folder with a
MobileNetV2 program (etlab.models.make_mobilenet_v2: mnv2.pte, mnv2.etrecord) and a 50-run ETDump of
it; the `.pte`, `.etdp` and `.etrecord` viewers are timed. First paint = double-click in the file
browser until the viewer's graph has laid out and drawn (`data-state=ready`). Before every open the
file's mtime is bumped, so the server reads and builds the view afresh (its cache is keyed by the
file's version): each sample is a cold read on a warm server. Side by side, in the same browser: the
same graph as etlab's offline HTML report (GraphView.save_html, file:// load until ready), i.e. the
same view modules without JupyterLab.
Writes the `lab` section of bench/RESULTS.md (medians).
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time
from pathlib import Path

from _common import median, write_section

CHROMIUM = os.environ.get("ETLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]
TARGET_S = 1.5


def make_artifacts(folder: Path, runs: int) -> None:
    """mnv2.pte + mnv2.etrecord (the program) and mnv2_run.etdp (`runs` executions)."""
    import torch

    from etlab.compiler import to_edge_transform_and_lower
    from etlab.models import make_mobilenet_v2
    from etlab.runtime import Runtime

    model, inputs = make_mobilenet_v2()
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.write_to_file(folder / "mnv2.pte")
    et.get_etrecord().save(folder / "mnv2.etrecord")
    program = Runtime.get().load_program(folder / "mnv2.pte", enable_etdump=True)
    method = program.load_method("forward")
    for _ in range(runs):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(folder / "mnv2_run.etdp")


def first_paint(page, name: str, root: Path) -> tuple[float, float]:
    """Seconds from the double-click to the viewer's content drawn (summary / table / timeline, the
    graph mounted), and to its graph laid out and drawn; the file is 'new' each time."""
    now = time.time()
    os.utime(root / name, (now, now))
    page.evaluate("window.jupyterapp.commands.execute('application:close-all')")
    page.wait_for_timeout(300)
    page.evaluate("window.jupyterapp.shell.activateById('filebrowser')")
    item = page.locator(f".jp-DirListing-item[title^='Name: {name}']")
    item.wait_for()
    start = time.perf_counter()
    item.dblclick()
    viewer = page.locator(".jp-MainAreaWidget:not(.lm-mod-hidden) .jp-etlab[data-state=ready]")
    viewer.wait_for(state="attached", timeout=120_000)
    painted = time.perf_counter() - start
    viewer.locator("[data-etlab-view=graph][data-state=ready]").first.wait_for(state="attached", timeout=120_000)
    return painted, time.perf_counter() - start


def report_paint(browser, html: Path) -> float:
    """Seconds to load the offline report of the same graph until it is drawn."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    start = time.perf_counter()
    page.goto(html.as_uri())
    page.wait_for_selector("[data-etlab-view=graph][data-state=ready]", state="attached", timeout=120_000)
    took = time.perf_counter() - start
    page.close()
    return took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=50, help="executions in the ETDump")
    ap.add_argument("--repeat", type=int, default=5, help="opens per viewer (median)")
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright

    from etlab.etrecord import parse_etrecord
    from etlab.jupyter._launch import MakeLab
    from etlab.visualizer import GraphView

    with tempfile.TemporaryDirectory(prefix="etlab-bench-lab-") as tmp:
        root, base = Path(tmp) / "root", Path(tmp) / "base"
        root.mkdir()
        base.mkdir()
        t0 = time.perf_counter()
        make_artifacts(root, args.runs)
        print(f"artifacts in {time.perf_counter() - t0:.1f} s", flush=True)
        offline = Path(tmp) / "offline_edge.html"
        GraphView(parse_etrecord(root / "mnv2.etrecord"), graph="edge").save_html(offline)
        load_start = os.getloadavg()[0]
        samples: dict[str, list[float]] = {k: [] for k in ("pte", "pte_graph", "etdp", "etdp_graph", "etrecord",
                                                            "etrecord_graph", "report")}
        with MakeLab(root=root, base=base, lifetime_s=1800) as lab, sync_playwright() as p:
            _, pte = lab.get_json("etlab/api/view/pte?path=mnv2.pte")
            _, run = lab.get_json("etlab/api/view/etdp?path=mnv2_run.etdp")
            _, run_graphs = lab.get_json("etlab/api/view/etdp?path=mnv2_run.etdp&part=graphs")
            _, record = lab.get_json("etlab/api/view/etrecord?path=mnv2.etrecord")
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(lab.url("lab"))
            page.wait_for_selector(".jp-DirListing-item", timeout=120_000)
            first_paint(page, "mnv2.pte", root)  # warm the browser's module cache once
            for _ in range(args.repeat):
                for kind, name in (("pte", "mnv2.pte"), ("etdp", "mnv2_run.etdp"), ("etrecord", "mnv2.etrecord")):
                    painted, drawn = first_paint(page, name, root)
                    samples[kind].append(painted)
                    samples[f"{kind}_graph"].append(drawn)
                samples["report"].append(report_paint(browser, offline))
            browser.close()
        sizes = {k: (root / n).stat().st_size for k, n in (("pte", "mnv2.pte"), ("etdp", "mnv2_run.etdp"),
                                                             ("etrecord", "mnv2.etrecord"))}
    load_end = os.getloadavg()[0]
    med = {k: median(v) for k, v in samples.items()}
    for k, v in samples.items():
        print(k, " ".join(f"{x:.3f}" for x in v), f"median {med[k]:.3f} s", flush=True)
    graphs = " + ".join(f"{g['title']} {len(g['nodes'])} nodes" for g in run_graphs["graphs"])
    panes = " + ".join(f"{g['title']} {len(g['nodes'])} nodes" for g in record["graphs"])
    rows = [
        f"| `.pte` viewer: summary, instruction graph ({len(pte['graph']['nodes'])} nodes), memory plan "
        f"({len(pte['memory'])} tensors); {sizes['pte'] / 1e6:.1f} MB | {med['pte']:.2f} s | "
        f"{med['pte'] / TARGET_S:.2f} | {med['pte_graph']:.2f} s | {med['pte_graph'] / med['report']:.2f} |",
        f"| `.etdp` dashboard: {run['runs']} runs, {len(run['rows'])} profile rows, {len(run['spans'])} timeline "
        f"spans; joined with its ETRecord ({graphs}) | {med['etdp']:.2f} s | {med['etdp'] / TARGET_S:.2f} | "
        f"{med['etdp_graph']:.2f} s | {med['etdp_graph'] / med['report']:.2f} |",
        f"| `.etrecord` viewer: {panes} "
        f"(compare panes), {len(record['modules'])} module groups; {sizes['etrecord'] / 1e6:.1f} MB | "
        f"{med['etrecord']:.2f} s | {med['etrecord'] / TARGET_S:.2f} | {med['etrecord_graph']:.2f} s | "
        f"{med['etrecord_graph'] / med['report']:.2f} |",
        f"| offline HTML report of the Edge graph (same view modules, file://) | – | – | {med['report']:.2f} s "
        "| 1.00 |",
    ]
    body = "\n".join([
        "## lab",
        "",
        f"`python bench/lab.py` ({datetime.date.today().isoformat()}, {os.cpu_count()} cores, median of "
        f"{args.repeat}): time to first paint in JupyterLab started as `make lab` starts it (`make lab-server`), "
        "from the double-click in the file browser to "
        "the viewer drawn; the file's mtime is bumped before each open, so every sample is a cold "
        "read on a warm server (imports done). Target: under 1.5 s each. Load average (1 min) "
        f"{load_start:.1f} at the start, {load_end:.1f} at the end: absolute times scale with it.",
        "",
        "First paint: the viewer's content drawn (summary, tables, timeline; the graph mounted). Graph drawn: "
        "its layout done and drawn (the ETRecord's graphs are rebuilt on the server after the table is sent).",
        "",
        "| view (MobileNetV2, etlab.models.make_mobilenet_v2) | first paint | / target | graph drawn "
        "| graph / offline report |",
        "|---|---|---|---|---|",
        *rows,
    ])
    write_section("lab", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
