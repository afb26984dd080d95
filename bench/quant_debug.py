"""Quantization-debugging benchmark: the time to compute the full per-layer report
(`etlab.devtools.quantization_report`: total and local error of every layer) next to torch eager
forward of the float model and torchao's own numeric debugger (loggers on both models, total error
per node only, no local re-run), in one run; medians.

    .venv/bin/python bench/quant_debug.py [--repeats N] [--threads T]

Models: the zoo's MobileNetV2 (full width, 224x224: the "MobileNetV2-class" target, report under
2 s), the tiny CNN and the transformer, quantized with EtlabQuantizer. "report" is given the float
model's exported graph (what a notebook holds after quantizing); "report + export" starts from the
nn.Module; "report, etlab runtime" compiles the quantized program and reads its intermediates from
the runtime (one run, so one sample). Writes the `## quant_debug` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from datetime import date

import torch
from _common import write_section

from etlab.compiler import EtlabQuantizer
from etlab.devtools import quantization_report
from etlab.devtools._quant_debug import float_graph_of
from etlab.devtools._quant_debug_fix import quantize_pt2e
from etlab.models.zoo import make_cnn, make_mobilenet_v2, make_transformer

MODELS = {"mobilenet_v2": make_mobilenet_v2, "cnn": make_cnn, "transformer": make_transformer}
TARGET_S = 2.0


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls (after one warm-up call)."""
    fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def torchao_debugger(float_gm, quantized, inputs) -> None:
    """torchao's numeric debugger on the same pair: loggers on both graphs, one run each, compare."""
    from torchao.quantization.pt2e._numeric_debugger import (
        compare_results,
        extract_results_from_loggers,
        prepare_for_propagation_comparison,
    )

    ref = prepare_for_propagation_comparison(float_gm)
    act = prepare_for_propagation_comparison(quantized)
    with torch.no_grad():
        ref(*inputs)
        act(*inputs)
    compare_results(extract_results_from_loggers(ref), extract_results_from_loggers(act))


def bench_model(name: str, repeats: int) -> dict:
    model, inputs = MODELS[name]()
    float_gm = float_graph_of(model, inputs)
    quantized = quantize_pt2e(float_gm, EtlabQuantizer(), [inputs])
    row = {"model": name, "params": sum(p.numel() for p in model.parameters())}
    with torch.no_grad():
        row["eager"] = timed(lambda: model(*inputs), max(repeats, 5))
    row["report"] = timed(lambda: quantization_report(float_gm, quantized, inputs), repeats)
    row["report_export"] = timed(lambda: quantization_report(model, quantized, inputs), max(1, repeats // 2))
    try:
        row["torchao"] = timed(lambda: torchao_debugger(float_gm, quantized, inputs), repeats)
    except Exception as e:  # a private torchao API: report why it could not be timed
        row["torchao"], row["torchao_error"] = None, f"{type(e).__name__}: {str(e)[:80]}"
    t = time.perf_counter()
    report = quantization_report(float_gm, quantized, inputs, runtime=True)
    row["report_runtime"] = time.perf_counter() - t
    row["layers"] = len(report.layers)
    return row


def section(rows: list[dict], repeats: int, threads: int) -> str:
    load = os.getloadavg()[0]
    lines = [
        "## quant_debug", "",
        f"`bench/quant_debug.py`, {date.today().isoformat()}, 2 cores, torch threads {threads}, load average "
        f"{load:.1f} when it ran (other jobs share the machine: absolute times are noisy, ratios less so). "
        f"Per-layer report = `quantization_report(float_graph, quantized, inputs)`: both models run with every "
        f"node's value kept, every layer's float op re-run on the quantized inputs, SQNR/MSE/cosine/max-abs and "
        f"statistics per layer. torchao = its numeric debugger on the same pair (total error per node only). "
        f"Medians of {repeats}.", "",
        "| model | params | layers | eager forward (s) | report (s) | report / eager | report + export (s) | "
        "torchao debugger (s) | report, etlab runtime (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ao = f"{r['torchao']:.3f}" if r["torchao"] is not None else "n/a"
        lines.append(f"| {r['model']} | {r['params']:,} | {r['layers']} | {r['eager']:.4f} | {r['report']:.3f} | "
                     f"{r['report'] / r['eager']:.0f}x | {r['report_export']:.3f} | {ao} | "
                     f"{r['report_runtime']:.2f} |")
    mnv2 = next((r for r in rows if r["model"] == "mobilenet_v2"), None)
    if mnv2 is not None:
        verdict = "met" if mnv2["report"] < TARGET_S else "NOT met"
        lines += ["", f"MobileNetV2 full per-layer report: **{mnv2['report']:.2f} s** (target < {TARGET_S:.0f} s: "
                      f"{verdict} at this load)."]
    for r in rows:
        if r.get("torchao_error"):
            lines.append(f"torchao debugger on {r['model']} not timed: {r['torchao_error']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared box)")
    p.add_argument("--models", default=",".join(MODELS))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    rows = []
    for name in a.models.split(","):
        print(f"[bench] {name} ...", flush=True)
        rows.append(bench_model(name, a.repeats))
        print(rows[-1], flush=True)
    text = section(rows, a.repeats, a.threads)
    print(text)
    write_section("quant_debug", text)


if __name__ == "__main__":
    main()
