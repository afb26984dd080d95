"""Compare benchmark: what re-joining a float build with its quantized build (module + op, q/dq
attached through the ETRecord's graph) costs next to the debug-handle join of two builds of one
graph, on the same machine in one run; medians.

    .venv/bin/python bench/compare.py [--repeats N]

Models: the zoo's tiny CNN and transformer, float and int8 static (EtlabQuantizer), compiled by
etlab and run 3 times with intermediate outputs. Per model:
- "by handle": `Inspector.compare` of two runs of the float build (the join before this change);
- "module + op": `Inspector.compare` of the float build against the int8 build;
- "cold" includes creating both Inspectors from their files (ETDump, debug buffer, ETRecord) and,
  for module + op, rebuilding the two recorded Edge graphs the q/dq attachment reads; "warm" is
  `compare` again on the same Inspectors (graphs cached by the ETRecord).
Writes the `## compare` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from datetime import date
from pathlib import Path

from _common import interleaved, write_section

from etlab.compiler import EtlabQuantizer
from etlab.inspector import Inspector
from etlab.models import ZOO
from tests.compiler._quant import quantize
from tests.test_end_to_end import compile_run_inspect

MODELS = ("cnn", "transformer")


def inspector(folder: Path) -> Inspector:
    return Inspector(etdump_path=folder / "run.etdp", debug_buffer_path=folder / "run.bin",
                     etrecord=folder / "model.etrecord")


def bench_model(name: str, root: Path, repeats: int) -> dict:
    model, inputs = ZOO[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = quantize(model, inputs, EtlabQuantizer())
    for side, m in (("float", model), ("float2", model), ("int8", gm)):
        (root / side).mkdir(parents=True, exist_ok=True)
        compile_run_inspect(root / side, m, inputs)
    f, f2, q = (root / s for s in ("float", "float2", "int8"))
    warm = {"handle": (inspector(f), inspector(f2)), "module": (inspector(f), inspector(q))}
    c = warm["module"][0].compare(warm["module"][1])
    out = {"rows": len(c.rows), "by": c.by, "matched": c.summary.matched_pct}
    # side by side, in alternating rounds (so that load drift hits both joins alike)
    cold = interleaved({"handle": lambda: inspector(f).compare(inspector(f2)),
                        "module": lambda: inspector(f).compare(inspector(q))}, rounds=repeats, per_round=1, warmup=1)
    hot = interleaved({"handle": lambda: warm["handle"][0].compare(warm["handle"][1]),
                       "module": lambda: warm["module"][0].compare(warm["module"][1])},
                      rounds=repeats, per_round=3, warmup=1)
    out.update(handle_cold=cold["handle"], module_cold=cold["module"], handle_warm=hot["handle"],
               module_warm=hot["module"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="rounds (medians of these)")
    a = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="etlab-bench-compare-") as tmp:
        for name in MODELS:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            results[name] = bench_model(name, Path(tmp) / name, a.repeats)
    ms = lambda s: f"{s * 1e3:.1f}"
    lines = [f"`bench/compare.py`, {date.today()}, 2 cores, load average {os.getloadavg()[0]:.1f} when it ran "
             f"(shared machine: absolute times are noisy, ratios less so); medians of {a.repeats} alternating "
             "rounds. No speed target: "
             "what re-joining a float build with its int8 build (module + op, q/dq attached through the ETRecord's "
             "graph) costs next to the debug-handle join of two builds of one graph.", "",
             "| model | rows (float vs int8) | joined by | matched | by handle, cold (ms) | module + op, cold (ms) "
             "| ratio | by handle, warm (ms) | module + op, warm (ms) | ratio |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['rows']} | {r['by']} | {r['matched']:.0f}% | {ms(r['handle_cold'])} | "
                     f"{ms(r['module_cold'])} | {r['module_cold'] / r['handle_cold']:.1f}x | {ms(r['handle_warm'])} | "
                     f"{ms(r['module_warm'])} | {r['module_warm'] / r['handle_warm']:.1f}x |")
    lines += ["", "Cold includes creating both Inspectors (ETDump, debug buffer, ETRecord); the module + op join "
              "also rebuilds the two Edge graphs it reads, which is most of its extra cost; warm, the graphs are "
              "cached by the ETRecord."]
    write_section("compare", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
