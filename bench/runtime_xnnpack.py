"""Upstream's XNNPACK programs on etlab's host backend and on upstream's runtime: the `## runtime-xnnpack`
section of bench/RESULTS.md, written by `bench/runtime.py` (which exports the programs with the reference
environment and runs these timings next to its own; `--xnnpack-only` runs only this section).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from _runtime_timing import Upstream, clock_words, interleaved, load_method, met

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
        f"`bench/runtime.py`, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average {loads[0]:.1f} "
        f"before / {loads[1]:.1f} after. Upstream's XNNPACK-lowered programs (`et_ref.py export --xnnpack`, int8: "
        "`--quantize`, upstream's XNNPACKQuantizer) run on etlab's host `XnnpackBackend` (no XNNPACK linked: "
        "float convolutions and fully connected layers on etlab's native kernels with weights packed at load "
        "(`_native/conv.cpp`; oneDNN for what they do not take), int8 ones on integers (native int8 kernels, else "
        "torch's x86 int8 kernels), other nodes with torch kernels) and on upstream's runtime with XNNPACK, in the "
        "same alternating rounds, "
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
