"""Quantization-debugging benchmark: the time to compute the full per-layer report
(`etlab.devtools.quantization_report`: total and local error of every layer) next to torch eager
forward of the float model and torchao's own numeric debugger (loggers on both models, total error
per node only, no local re-run), in one run; medians.

    .venv/bin/python bench/quant_debug.py [--repeats N] [--threads T]
    .venv/bin/python bench/quant_debug.py --dataset 1000 --threads 2   # issue 30: the report over a dataset

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


DATASET_TARGET_S = 60.0  # issue 30: 1,000 inputs through MobileNetV2's int8 program, reported on 2 cores


def bench_dataset(n: int, backend: str, seed: int = 0) -> dict:
    """`quantization_report(..., dataset=)` over n random inputs of the zoo's MobileNetV2 (int8, EtlabQuantizer
    calibrated on 16 of them), the program compiled for `backend` and run on etlab's runtime for every input.
    Wall time and this process's CPU time (all threads) of the report call, which includes compiling the
    program; the load average before and after (the machine is shared)."""
    from etlab.devtools import quantization_report

    model, inputs = make_mobilenet_v2()
    gen = torch.Generator().manual_seed(seed)
    data = [(torch.randn(inputs[0].shape, generator=gen),) for _ in range(n)]
    t = time.perf_counter()
    float_gm = float_graph_of(model, inputs)
    quantized = quantize_pt2e(float_gm, EtlabQuantizer(), data[:16])
    quantize_s = time.perf_counter() - t
    load_before = os.getloadavg()[0]
    t, cpu = time.perf_counter(), time.process_time()
    report = quantization_report(float_gm, quantized, dataset=data, backend=backend, progress=False)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    # the breakdown, measured apart after the report: compiling the shipped program, running it on one input
    from etlab.devtools._quant_debug_runtime import shipped_method

    c = time.process_time()
    method, _ = shipped_method(quantized, inputs, backend, None)
    compile_cpu = time.process_time() - c
    method.execute(list(data[0]))
    c = time.process_time()
    for x in data[:20]:
        method.execute(list(x))
    program_cpu = (time.process_time() - c) / len(data[:20])
    return {"inputs": n, "backend": backend, "quantize_s": quantize_s, "wall_s": wall, "cpu_s": cpu,
            "compile_cpu_s": compile_cpu, "program_cpu_ms": 1e3 * program_cpu,
            "load_before": load_before, "load_after": os.getloadavg()[0], "batch": report.batch_size,
            "layers": len(report.layers), "summary": report.summary(), "threads": torch.get_num_threads(),
            "top1": report.output.get("top1_agreement", float("nan"))}


def dataset_section(r: dict) -> str:
    per_input = r["wall_s"] / r["inputs"]
    cpu_ms = 1e3 * r["cpu_s"] / r["inputs"]
    idle = cpu_ms / 2  # 1,000 inputs' CPU time spread over 2 idle cores: an estimate (see below)
    quiet = max(r["load_before"], r["load_after"]) < 2.5  # the wall time says what an idle machine does
    if r["inputs"] >= 1000 and (quiet or r["wall_s"] <= DATASET_TARGET_S):
        verdict = "met" if r["wall_s"] <= DATASET_TARGET_S else "NOT met"
        verdict += f" ({r['wall_s']:.0f} s wall for {r['inputs']} inputs at load {r['load_before']:.1f})"
    elif idle > DATASET_TARGET_S:
        verdict = f"NOT met (1,000 inputs at this CPU cost: {cpu_ms:.0f} CPU-s, {idle:.0f} s on 2 idle cores at best)"
    else:
        verdict = (f"not shown at this load (1,000 inputs at this CPU cost: {cpu_ms:.0f} CPU-s, {idle:.0f} s if both "
                   f"idle cores were busy throughout, which the one-thread compile and first input are not; this "
                   f"run's wall time at load {r['load_before']:.1f}: {per_input * 1000:.0f} s for 1,000; the wall "
                   f"time of a run on an idle machine decides it)")
    torch_ms = cpu_ms - r["program_cpu_ms"] - 1e3 * r["compile_cpu_s"] / r["inputs"]
    return "\n".join([
        "## quant_debug_dataset", "",
        f"`bench/quant_debug.py --dataset {r['inputs']}`, {date.today().isoformat()}, 2 cores (load average "
        f"{r['load_before']:.1f} before, {r['load_after']:.1f} after: other jobs share the machine, wall times are "
        f"inflated by the load; the CPU time is this process's, all threads). `quantization_report(float_graph, "
        f"quantized, dataset=...)` on the zoo's MobileNetV2 (int8, EtlabQuantizer calibrated on 16 inputs), the "
        f"{r['backend']} program compiled and run on etlab's runtime for every input, per-layer total / local / "
        f"inherited error of {r['layers']} layers: both graphs stepped side by side through batches of "
        f"{r['batch']} inputs split across {r['threads']} single-threaded workers (torch threads "
        f"{r['threads']}), each value freed once the last measurement that reads it is done; both graphs' "
        f"convolutions on oneDNN on a batch (the converted graph's: against torch's own choice, the layers' mean "
        f"SQNR moves by at most 0.007 dB, p95 0.07 dB, max-abs 1.6% over 72 inputs, less than batching itself "
        f"moves them); the workers' heaps kept between batches (no page faults in steady state).",
        "",
        "| inputs | backend | report wall (s) | report CPU (s) | wall per input (ms) | CPU per input (ms) | "
        "quantize (s) |",
        "|---:|---|---:|---:|---:|---:|---:|",
        f"| {r['inputs']} | {r['backend']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {1e3 * per_input:.0f} | "
        f"{cpu_ms:.0f} | {r['quantize_s']:.1f} |",
        "",
        f"Target: 1,000 inputs reported in <= {DATASET_TARGET_S:.0f} s on 2 cores: **{verdict}**.", "",
        f"Where the CPU goes (measured apart after the report, same load): compiling the {r['backend']} program "
        f"{r['compile_cpu_s']:.1f} CPU-s once ({1e3 * r['compile_cpu_s'] / r['inputs']:.1f} ms per input here), "
        f"the program on the runtime {r['program_cpu_ms']:.1f} ms per input, the torch passes and the statistics "
        f"the rest, ~{torch_ms:.0f} ms per input. The 2-idle-core figure assumes both cores busy throughout; the "
        f"load inflates CPU time as well (other processes evict the caches the passes rely on).", "",
        f"Report: {r['summary']}",
    ]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default 1: steadier on a shared box; with --dataset 2: the report's "
                        "workers, issue 30's target is on 2 cores)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dataset", type=int, default=0, metavar="N",
                   help="instead: the report over N inputs of MobileNetV2 (issue 30's target: 1000 in <= 60 s)")
    p.add_argument("--backend", default="xnnpack", choices=("xnnpack", "portable"))
    p.add_argument("--no-write", action="store_true", help="print the section, leave bench/RESULTS.md as it is")
    a = p.parse_args()
    a.threads = a.threads or (2 if a.dataset else 1)
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    if a.dataset:
        r = bench_dataset(a.dataset, a.backend)
        print(r, flush=True)
        text = dataset_section(r)
        print(text)
        if not a.no_write:
            write_section("quant_debug_dataset", text)
        return
    rows = []
    for name in a.models.split(","):
        print(f"[bench] {name} ...", flush=True)
        rows.append(bench_model(name, a.repeats))
        print(rows[-1], flush=True)
    text = section(rows, a.repeats, a.threads)
    print(text)
    if not a.no_write:
        write_section("quant_debug", text)


if __name__ == "__main__":
    main()
