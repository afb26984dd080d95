"""Compile-time and memory benchmark: etlab's to_edge + to_executorch next to upstream ExecuTorch's.

    .venv/bin/python bench/compile.py [--repeat 5] [--models mlp cnn ...] [--no-upstream]

For each zoo model: torch.export once (not timed), then the median over --repeat runs of
to_edge(...).to_executorch().buffer (the first, cold run is reported too). Upstream is timed the same
way in a subprocess with the reference python (bench/_ref_compile.py). Memory: our arena bytes, the
lower bound (max over instruction steps of the live, 16-byte-aligned bytes) and upstream's arena
(non_const_buffer_sizes of the .pte upstream wrote). Replaces the `## compile` section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from _common import HERE, REPO, RESULTS, ref_env, reference_python, write_section

from etlab.compiler import to_edge
from etlab.models import export_zoo
from etlab.schema import load_pte

MODELS = ["mlp", "cnn", "mobilenet_v2", "transformer", "kv_cache_decoder", "dynamic_batch", "two_methods", "cond"]


def time_ours(name: str, repeat: int) -> dict:
    programs = export_zoo(name)
    times, et = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        et = to_edge(programs).to_executorch()
        _ = et.buffer  # serialization is part of the timed work
        times.append(time.perf_counter() - t)
    arena = lower = 0
    for plan in et.memory_plans.values():
        arena += sum(plan.buffer_sizes)
        lower += sum(plan.lower_bounds)
    return {"cold": times[0], "median": statistics.median(times[1:] or times), "arena": arena, "lower_bound": lower}


def time_upstream(ref: str, names: list[str], repeat: int, outdir: Path) -> dict:
    env = ref_env()
    p = subprocess.run([ref, str(HERE / "_ref_compile.py"), str(REPO / "etlab" / "models" / "zoo.py"), *names,
                        "--out", str(outdir), "--repeat", str(repeat)], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"upstream compile failed:\n{p.stderr[-3000:]}")
    results = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            arena = sum(sum(plan.non_const_buffer_sizes or [0])
                        for plan in load_pte(outdir / f"{r['name']}.pte").program.execution_plan)
            s = r["seconds"]
            results[r["name"]] = {"cold": s[0], "median": statistics.median(s[1:] or s), "arena": arena}
    return results


def render(ours: dict, upstream: dict, repeat: int) -> str:
    lines = [
        "## compile", "",
        f"to_edge + to_executorch + serialize, torch.export excluded; median of {max(repeat - 1, 1)} warm runs "
        f"(cold = first run in the process). Arena = planned bytes (16-byte aligned); lower bound = max over "
        "instruction steps of live bytes.", "",
        "| model | etlab ms | upstream ms | speedup | etlab cold ms | upstream cold ms | arena B | lower bound B "
        "| vs bound | upstream arena B |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, o in ours.items():
        u = upstream.get(name)
        speed = f"{u['median'] / o['median']:.0f}x" if u else "n/a"
        bound = f"{(o['arena'] / o['lower_bound'] - 1) * 100:+.1f}%" if o["lower_bound"] else "n/a"
        lines.append(
            f"| {name} | {o['median'] * 1e3:.1f} | {u['median'] * 1e3:.0f} | {speed} | {o['cold'] * 1e3:.1f} | "
            f"{u['cold'] * 1e3:.0f} | {o['arena']} | {o['lower_bound']} | {bound} | {u['arena']} |" if u else
            f"| {name} | {o['median'] * 1e3:.1f} | n/a | n/a | {o['cold'] * 1e3:.1f} | n/a | {o['arena']} | "
            f"{o['lower_bound']} | {bound} | n/a |")
    lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args()
    torch.set_num_threads(1)  # upstream is timed single-threaded too
    ours = {}
    for name in a.models:
        ours[name] = time_ours(name, a.repeat)
        print(f"etlab {name}: {ours[name]['median'] * 1e3:.1f} ms, arena {ours[name]['arena']} "
              f"(bound {ours[name]['lower_bound']})", flush=True)
    upstream = {}
    ref = None if a.no_upstream else reference_python()
    if ref:
        with tempfile.TemporaryDirectory() as tmp:
            upstream = time_upstream(ref, a.models, a.repeat, Path(tmp))
        for name, u in upstream.items():
            print(f"upstream {name}: {u['median'] * 1e3:.0f} ms, arena {u['arena']}", flush=True)
    body = render(ours, upstream, a.repeat)
    write_section("compile", body, a.results)
    print(body)


if __name__ == "__main__":
    main()
