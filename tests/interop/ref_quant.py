"""Upstream-side half of the quantization interop tests and benchmark (tests/interop/test_quant.py, bench/quant.py).

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_quant.py export ZOO.py NAME [NAME ...] --out DIR
      For each NAME (make_NAME in ZOO.py): PT2E int8 with upstream's XNNPACKQuantizer (per-channel
      weights, calibrated on the example inputs), lowered WITHOUT delegation (portable kernels plus
      the quantized_decomposed kernels), written as
        DIR/NAME/model.pte, inputs.pt, eager_outputs.pt (the converted model in torch eager),
        upstream_outputs.pt (upstream's runtime), info.json {"out_scales": [...]} (the scale of
        the dequantize producing each output, or null: one quantization step of that output).
  $REF tests/interop/ref_quant.py run DIR [--iters N]
      Runs every DIR/*/model.pte on DIR/*/inputs.pt with upstream's runtime (quantized kernels
      linked) in one process; writes DIR/*/upstream_outputs.pt and DIR/*/upstream_ms.json
      (median milliseconds of N runs after one warm-up).

Tensors cross the boundary as torch.save files of plain lists of tensors (weights_only).
"""

import argparse
import json
import logging
import os
import time
import warnings

from ref_export_runtime import _as_list, _zoo  # same directory: on sys.path when run as a script

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def _load_quantized_kernels():
    import executorch.kernels.quantized  # noqa: F401  registers the quantized_decomposed kernels and out variants


def _out_scales(gm):
    """Per graph output: the scale of the per-tensor dequantize producing it, or None."""
    import torch

    dq = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    out = next(n for n in gm.graph.nodes if n.op == "output")
    scales = []
    for arg in _as_list(out.args[0]):
        scales.append(float(arg.args[1]) if getattr(arg, "target", None) is dq else None)
    return scales


def cmd_export(a):
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    _load_quantized_kernels()
    from executorch.runtime import Runtime

    zoo = _zoo(a.zoo)
    for name in a.names:
        model, inputs = getattr(zoo, f"make_{name}")()
        inputs = tuple(inputs)
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        with torch.no_grad():
            prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
            prepared(*inputs)
            converted = convert_pt2e(prepared)
            eager = _as_list(converted(*inputs))
        et = to_edge(torch.export.export(converted, inputs)).to_executorch()
        with open(os.path.join(d, "model.pte"), "wb") as f:
            f.write(et.buffer)
        program = Runtime.get().load_program(et.buffer)  # kept alive while its method runs
        outputs = program.load_method("forward").execute(list(inputs))
        torch.save(list(inputs), os.path.join(d, "inputs.pt"))
        torch.save(eager, os.path.join(d, "eager_outputs.pt"))
        torch.save(list(outputs), os.path.join(d, "upstream_outputs.pt"))
        with open(os.path.join(d, "info.json"), "w") as f:
            json.dump({"out_scales": _out_scales(converted), "pte_bytes": len(et.buffer)}, f)
    print(json.dumps({"exported": a.names}))


def cmd_run(a):
    import torch

    _load_quantized_kernels()
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    done = []
    for name in sorted(os.listdir(a.dir)):
        d = os.path.join(a.dir, name)
        pte = os.path.join(d, "model.pte")
        if not os.path.isfile(pte):
            continue
        with open(pte, "rb") as f:
            program = runtime.load_program(f.read())  # kept alive: a method does not own its program
        method = program.load_method("forward")
        inputs = torch.load(os.path.join(d, "inputs.pt"), weights_only=True)
        outputs = method.execute(list(inputs))
        times = []
        for _ in range(a.iters):
            t = time.perf_counter()
            method.execute(list(inputs))
            times.append(time.perf_counter() - t)
        torch.save(list(outputs), os.path.join(d, "upstream_outputs.pt"))
        with open(os.path.join(d, "upstream_ms.json"), "w") as f:
            json.dump({"median_ms": sorted(times)[len(times) // 2] * 1e3 if times else None}, f)
        done.append(name)
    print(json.dumps({"ran": done}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("zoo")
    e.add_argument("names", nargs="+")
    e.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--iters", type=int, default=0)
    a = p.parse_args()
    {"export": cmd_export, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    main()
