"""Quantization benchmark, side by side in one run; writes the `## Quantization` section of bench/RESULTS.md.

Per zoo model (MLP, CNN, MobileNetV2, transformer): the float program and its int8 version
(EtlabQuantizer: int8 per-channel weights, int8 per-tensor activations, calibrated on the example
inputs, convert_pt2e, etlab's compiler), both compiled by etlab; then
- `.pte` size, float vs int8;
- latency of torch eager (float model, torchao's converted int8 model), etlab's native core
  (float .pte, int8 .pte; and the int8 .pte with its quantize/dequantize kernels called back in
  Python as before they ran natively, `_native._plan.native_quant_kernels = False`), all in-process
  in alternating rounds (medians), and upstream ExecuTorch 1.5.1's portable + quantized kernels
  running the same two `.pte` files (medians, its own process);
- accuracy of the int8 program: SQNR of etlab's int8 output against the float model's, and the
  largest difference from the converted model in eager, in quantization steps of the output.

etlab's portable-style path runs each quantized op as dequantize -> float kernel -> quantize (as
upstream's portable kernels do without a delegate), so int8 buys size, not speed, on this path.

    .venv/bin/python bench/quant.py [--models mlp cnn] [--rounds 30] [--threads 1] [--no-upstream]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, interleaved, reference_python, run_ref, write_section

from etlab.compiler import EtlabQuantizer, to_edge
from etlab.models import ZOO
from etlab.runtime import Runtime
from etlab.runtime._native import _plan as native_plan

REF_QUANT = REPO / "tests" / "interop" / "ref_quant.py"
MODELS = ["mlp", "cnn", "mobilenet_v2", "transformer"]
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def _quantize(model, inputs):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(torch.export.export(model, inputs).module(), EtlabQuantizer())
        with torch.no_grad():
            prepared(*inputs)
        return convert_pt2e(prepared)


def _first(x) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


def _out_step(gm) -> float | None:
    dq = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    out = gm.graph.output_node().args[0]
    node = _first(out)
    return float(node.args[1]) if getattr(node, "target", None) is dq else None


def _sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    noise = (ref - out).pow(2).mean()
    return float("inf") if noise == 0 else float(10 * torch.log10(ref.pow(2).mean() / noise))


def measure(name: str, workdir: Path, rounds: int, clock) -> dict:
    """Compiles the float and int8 programs of one model and times the in-process contenders."""
    model, inputs = ZOO[name]()
    t0 = time.perf_counter()
    converted = _quantize(model, inputs)
    quantize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    int8_pte = to_edge(torch.export.export(converted, inputs)).to_executorch().buffer
    compile_int8_s = time.perf_counter() - t0
    float_pte = to_edge(torch.export.export(model, inputs)).to_executorch().buffer
    for kind, pte in (("float", float_pte), ("int8", int8_pte)):
        d = workdir / f"{name}-{kind}"
        d.mkdir()
        (d / "model.pte").write_bytes(pte)
        torch.save(list(inputs), d / "inputs.pt")
    runtime = Runtime.get(core="native")
    programs = {k: runtime.load_program(p) for k, p in (("float", float_pte), ("int8", int8_pte))}
    methods = {k: p.load_method("forward") for k, p in programs.items()}
    native_plan.native_quant_kernels = False  # the "before": q/dq as Python steps the native core calls back
    try:
        methods["int8_pyqdq"] = runtime.load_program(int8_pte).load_method("forward")
    finally:
        native_plan.native_quant_kernels = True
    qdq_python_steps = sum(n for op, n in methods["int8_pyqdq"]._core.python_steps.items()
                           if "quantize" in op)
    assert not any("quantize" in op for op in methods["int8"]._core.python_steps), "q/dq not native"
    args = list(inputs)
    with torch.no_grad():
        ref = _first(model(*inputs))
        eager_int8 = _first(converted(*inputs))
        times = interleaved({
            "eager_float": lambda: model(*inputs),
            "eager_int8": lambda: converted(*inputs),
            "etlab_float": lambda: methods["float"].execute(args),
            "etlab_int8": lambda: methods["int8"].execute(args),
            "etlab_int8_pyqdq": lambda: methods["int8_pyqdq"].execute(args),
        }, rounds=rounds, clock=clock)
    ours = methods["int8"].execute(args)[0]
    assert torch.equal(ours, methods["int8_pyqdq"].execute(args)[0]), "native q/dq differs from the Python kernels"
    step = _out_step(converted)
    diff = float((ours - eager_int8).abs().max())
    return {
        "float_bytes": len(float_pte), "int8_bytes": len(int8_pte), "quantize_s": quantize_s,
        "compile_int8_s": compile_int8_s, "qdq_calls": qdq_python_steps, "sqnr_db": _sqnr(ref, ours),
        "steps_from_eager": diff / step if step else None, **{k: v * 1e3 for k, v in times.items()},
    }


def upstream_times(ref: str, workdir: Path, iters: int, threads: int) -> dict[str, float]:
    """Upstream portable (+ quantized kernels) median ms for every program in workdir, one process.

    OpenMP gets the same thread count as torch here: once `executorch.kernels.quantized` is loaded,
    upstream's portable kernels measured 0.42 ms single-threaded but 60 ms with 2 OpenMP threads on
    this loaded 2-core machine (its float transformer), which would say nothing about either runtime."""
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by the reference process (ref_env copies os.environ)
    run_ref(ref, REF_QUANT, "run", workdir, "--iters", iters, timeout=3600)
    return {d.name: json.loads((d / "upstream_ms.json").read_text())["median_ms"] for d in workdir.iterdir()
            if (d / "upstream_ms.json").is_file()}


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def render(results: dict, upstream: dict, threads: int, clock: str) -> str:
    lines = [
        "## Quantization", "",
        f"Load average {os.getloadavg()[0]:.1f} on 2 cores"
        f"{' (measured under load: other jobs shared the machine)' if os.getloadavg()[0] > 2 else ''}; "
        f"medians of alternating rounds; in-process contenders "
        f"timed in {'thread CPU time' if clock == 'cpu' else 'wall time'} (`--clock {clock}`), torch threads = "
        f"{threads}; upstream = ExecuTorch 1.5.1 pybindings with its portable and quantized kernels "
        "(`tests/interop/ref_quant.py run`, per `execute` call, wall time, OMP_NUM_THREADS = torch threads) on the "
        "same two `.pte` files etlab runs. int8 = EtlabQuantizer (per-channel int8 weights, per-tensor int8 "
        "activations, calibrated on the example inputs) -> convert_pt2e -> etlab's compiler; both runtimes run "
        "each quantized op as dequantize -> float kernel -> quantize (no delegate). etlab int8 = quantize/"
        "dequantize native (`etlab/runtime/_native/quant.cpp`); before = the same `.pte` with them as Python "
        "steps the native core calls back (`_native._plan.native_quant_kernels = False`), timed in the same "
        "rounds; both give the same bits (checked).", "",
        "| model | float .pte KB | int8 .pte KB | size int8/float | eager float ms | eager int8 ms | etlab float ms "
        "| etlab int8 ms | etlab int8/float | q/dq calls | before: int8 ms | before: int8/float "
        "| upstream float ms | upstream int8 ms | upstream int8 / etlab int8 "
        "| SQNR vs float dB | max diff vs eager int8 (steps) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        up_f, up_q = upstream.get(f"{name}-float"), upstream.get(f"{name}-int8")
        vs_up = f"{up_q / r['etlab_int8']:.2f}x" if up_q else "n/a"
        steps = "n/a" if r["steps_from_eager"] is None else f"{r['steps_from_eager']:.2f}"
        lines.append(
            f"| {name} | {r['float_bytes'] / 1024:.1f} | {r['int8_bytes'] / 1024:.1f} | "
            f"{r['int8_bytes'] / r['float_bytes']:.2f} | {r['eager_float']:.3f} | {r['eager_int8']:.3f} | "
            f"{r['etlab_float']:.3f} | {r['etlab_int8']:.3f} | {r['etlab_int8'] / r['etlab_float']:.2f}x | "
            f"{r['qdq_calls']} | {r['etlab_int8_pyqdq']:.3f} | {r['etlab_int8_pyqdq'] / r['etlab_float']:.2f}x | "
            f"{_ms(up_f)} | {_ms(up_q)} | {vs_up} | {r['sqnr_db']:.1f} | {steps} |")
    lines += ["", "Quantize/dequantize run in the native core as C++ loops (AVX2 where the CPU has it, "
              "bit-identical to the Python kernels of `etlab/runtime/_quant_kernels.py`, which stay the Python "
              "core's); as Python steps (before) each cost ~10 us with its GIL round trip, which dominated the int8 "
              "latency of the small models. What int8 still adds on this path is the arithmetic itself: every "
              "run dequantizes the weights (per channel) and requantizes every activation, in exchange for the "
              "float program's batch norms, which quantization folds away. (Dynamic programs' choose_qparams runs "
              "natively too; they are not timed here.) Upstream's portable kernels are timed with "
              "OMP_NUM_THREADS = torch threads: with "
              "`executorch.kernels.quantized` loaded and 2 OpenMP threads on this loaded machine, its transformer "
              "took 60 ms per call instead of 0.4 ms."]
    timings = ", ".join(f"{n} {r['quantize_s']:.1f} + {r['compile_int8_s']:.1f}" for n, r in results.items())
    lines += ["", f"Quantize (export + prepare + calibrate + convert) + compile the int8 program, seconds: {timings}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--upstream-iters", type=int, default=20)
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    ap.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix="etlab-bench-quant-") as tmp:
        workdir = Path(tmp)
        results = {}
        for name in a.models:
            results[name] = measure(name, workdir, a.rounds if name != "mobilenet_v2" else max(3, a.rounds // 5),
                                    CLOCKS[a.clock])
            print(name, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in results[name].items()}),
                  flush=True)
        upstream: dict = {}
        ref = None if a.no_upstream else reference_python()
        if ref is not None:
            upstream = upstream_times(ref, workdir, a.upstream_iters, a.threads)
            print("upstream", json.dumps(upstream), flush=True)
    body = render(results, upstream, a.threads, a.clock)
    if a.no_write:
        print(body)
    else:
        write_section("Quantization", body)
        print(body)


if __name__ == "__main__":
    main()
