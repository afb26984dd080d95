"""Upstream's XNNPACK programs on etlab's host backend and on upstream's runtime: the `## runtime-xnnpack`
section of bench/RESULTS.md, written by `bench/runtime.py` (which exports the programs with the reference
environment and runs these timings next to its own; `--xnnpack-only` runs only this section), or by this
script alone:

    .venv/bin/python bench/runtime_xnnpack.py [--rounds 30] [--programs DIR] [--keep DIR]

`--programs DIR` times programs exported before (DIR/xnnpack/<model>, DIR/xnnpack-int8/<model>, as `--keep DIR`
leaves them, or as bench/runtime.py's export writes them) instead of exporting them again (an export takes
minutes on a loaded machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import reference_python, write_section
from _runtime_timing import CLOCKS, Upstream, clock_words, configure, interleaved, load_method, met, timings

from etlab.models import ZOO

XNNPACK_MODELS = ["cnn", "mobilenet_v2"]
TARGET_XNNPACK = {"xnnpack": 1.5, "xnnpack-int8": 2.0}  # etlab / upstream on upstream's XNNPACK .pte


def time_xnnpack(name: str, dirs: dict[str, Path], rounds: int, upstream: Upstream) -> dict[str, float]:
    """Upstream's XNNPACK programs of `name` (float and int8) on etlab's host backend and on upstream's
    runtime, with torch eager, in the same rounds; outputs checked against upstream's first."""
    model, _ = ZOO[name]()
    eager_inputs = torch.load(dirs[f"xnnpack:{name}"] / "inputs.pt", weights_only=True)

    def eager():
        with torch.no_grad():
            return model(*eager_inputs)
    contenders = {"eager": eager}
    for kind in ("xnnpack", "xnnpack-int8"):
        d = dirs.get(f"{kind}:{name}")
        if d is None:
            continue
        inputs = torch.load(d / "inputs.pt", weights_only=True)
        method = load_method(d, "native")
        expected = torch.load(d / "eager_outputs.pt", weights_only=True)[0]
        got = method.execute(inputs)[0]
        tol = 1e-4 if kind == "xnnpack" else 0.1 * float(expected.abs().max())  # int8: the quantization error
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=tol)
        contenders[f"etlab {kind}"] = lambda method=method, inputs=inputs: method.execute(inputs)
        contenders[f"upstream {kind}"] = upstream.contender(f"{kind}:{name}:x", d)
    return interleaved(contenders, rounds=rounds, per_round=1 if name == "mobilenet_v2" else 5)


def xnnpack_section(results: dict[str, dict], clock: str, threads: int, loads: tuple[float, float]) -> str:
    """`## runtime-xnnpack`: upstream's XNNPACK-lowered programs on etlab's host backend and on upstream."""
    lines = [
        "## runtime-xnnpack", "",
        "`bench/runtime_xnnpack.py` (also `bench/runtime.py --xnnpack-only`), "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average {loads[0]:.1f} "
        f"before / {loads[1]:.1f} after. Upstream's XNNPACK-lowered programs (`et_ref.py export --xnnpack`, int8: "
        "`--quantize`, upstream's XNNPACKQuantizer) run on etlab's host `XnnpackBackend` (no XNNPACK linked: "
        "float convolutions and fully connected layers on etlab's native kernels with weights packed at load "
        "(`_native/conv.cpp`; oneDNN for what they do not take), int8 ones on integers (native int8 kernels, else "
        "torch's x86 int8 kernels), other nodes with torch kernels; each partition one native loop over its nodes, "
        "`_native/xnn_plan.cpp`) and on upstream's runtime with XNNPACK, in the same alternating rounds, "
        f"{clock_words(clock)} on both sides, {threads} thread(s) on both sides "
        "(torch, etlab and upstream's XNNPACK threadpool). Medians; in brackets the interquartile range of the "
        "rounds relative to the median.", "",
        "| model | program | torch eager ms | etlab ms | upstream ms | etlab / upstream | target |",
        "|---|---|---:|---:|---:|---:|---|"]
    verdicts = []
    for name, r in results.items():
        for kind in ("xnnpack", "xnnpack-int8"):
            if f"etlab {kind}" not in r:
                continue
            e, u = r[f"etlab {kind}"], r[f"upstream {kind}"]
            ratio, target = e / u, TARGET_XNNPACK[kind]
            lines.append(f"| {name} | {kind} | {r['eager'] * 1e3:.3f} | {e * 1e3:.3f} [{r[f'etlab {kind}~']:.0%}] | "
                         f"{u * 1e3:.3f} [{r[f'upstream {kind}~']:.0%}] | {ratio:.2f}x | <= {target}: "
                         f"{met(ratio <= target)} |")
        if "etlab xnnpack-int8" in r and "etlab xnnpack" in r:
            faster = r["etlab xnnpack-int8"] < r["etlab xnnpack"]
            verdicts.append(f"{name}: int8 faster than float on etlab: {met(faster)} "
                            f"({r['etlab xnnpack-int8'] / r['etlab xnnpack']:.2f}x its time)")
    if verdicts:
        lines += ["", "Targets: " + "; ".join(verdicts) + "."]
    return "\n".join([*lines, ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=XNNPACK_MODELS, choices=XNNPACK_MODELS)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    ap.add_argument("--programs", type=Path, help="time the programs exported before into this directory")
    ap.add_argument("--keep", type=Path, help="export into this directory (kept) instead of a temporary one")
    a = ap.parse_args()
    ref = reference_python()
    if ref is None:
        sys.exit("bench/runtime_xnnpack.py needs the reference environment (upstream's runtime is one side)")
    configure(a.clock, a.threads)
    load_before = os.getloadavg()[0]
    upstream = Upstream(ref, a.threads)
    try:
        results = _run(a, ref, upstream)
    finally:
        upstream.close()
    write_section("runtime-xnnpack", xnnpack_section(results, a.clock, a.threads, (load_before, os.getloadavg()[0])))


def _run(a: argparse.Namespace, ref: str, upstream: Upstream) -> dict[str, dict]:
    from runtime import export_upstream  # bench/runtime.py: the reference environment's exports

    with tempfile.TemporaryDirectory() as tmp:
        if a.programs is not None:
            dirs = {f"{kind}:{m}": a.programs / kind / m for m in a.models for kind in ("xnnpack", "xnnpack-int8")
                    if (a.programs / kind / m / "model.pte").is_file()}
            if not any(k.startswith("xnnpack:") for k in dirs):
                sys.exit(f"--programs {a.programs}: no xnnpack/<model>/model.pte for {a.models}")
        else:
            dirs = export_upstream(ref, a.keep or Path(tmp), a.models, xnnpack=True, portable=False)
        results = {}
        for m in a.models:
            if f"xnnpack:{m}" in dirs:
                results[m] = time_xnnpack(m, dirs, a.rounds, upstream)
                print(f"xnnpack {m}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in timings(results[m]).items()),
                      flush=True)
    return results


if __name__ == "__main__":
    main()
