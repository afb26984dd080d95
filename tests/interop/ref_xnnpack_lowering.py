"""Upstream's side of the XNNPACK lowering tests (tests/interop/test_xnnpack_lowering.py).

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_xnnpack_lowering.py run DIR NAME [NAME ...] [--etdump] [--count ZOO.py NAME ...]
      For each NAME, loads DIR/NAME.pte (written by etlab's XnnpackPartitioner) with upstream's
      runtime, which runs its XNNPACK delegates with real XNNPACK, executes "forward" on the
      tensors in DIR/NAME_inputs.pt and saves the outputs to DIR/NAME_upstream.pt (torch.save of
      a list). With --etdump, also writes upstream's ETDump of that run to DIR/NAME.etdp (one
      profiling event per XNNPACK operator, keyed by the node's debug handle). One process for
      all models: importing upstream takes most of a run's time. When DIR/NAME.ptd exists, it is
      given as the program's data file (weights etlab stored outside the .pte). --count (the same
      process) also does `count`; --keys NAME ... lowers DIR/NAME.pt2 (torch.export.save'd by
      etlab) with upstream's XnnpackPartitioner and prints one JSON line {"keys": NAME, "named":
      sorted keys of the .pte's named data}.

  $REF tests/interop/ref_xnnpack_lowering.py quantize ET_REF.py ZOO.py DIR NAME [NAME ...] [--dynamic NAME ...]
      For each NAME: make_NAME() of ZOO.py quantized with upstream's XNNPACKQuantizer (et_ref's
      recipe: per-channel int8 weights, per-tensor int8 activations, calibrated on the example
      inputs and jittered copies; with --dynamic the same quantizer's dynamic mode), then
        DIR/static_NAME.pt2 (or dynamic_NAME.pt2)  the converted model, torch.export.save'd, for
                                                    etlab to compile the very same q/dq graph
        DIR/static_NAME_inputs.pt                   the example inputs
        DIR/static_NAME_reference.pt                upstream's XNNPACK program's outputs (lowered
                                                    by upstream's XnnpackPartitioner) on them
      and one JSON line {"upstream": "static_NAME", "partitions": k, "nodes": n}.

  $REF tests/interop/ref_xnnpack_lowering.py count ZOO.py NAME [NAME ...]
      Lowers make_NAME() of ZOO.py with upstream's XnnpackPartitioner and prints one JSON line per
      model: {"upstream": NAME, "partitions": k, "nodes": n}, n the Edge nodes its partitions took
      (the call_function nodes of every lowered module's original program).
"""

import argparse
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")


def cmd_run(a):
    import torch
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    for name in a.names:
        base = os.path.join(a.dir, name)
        with open(base + ".pte", "rb") as f:
            data = f.read()
        inputs = torch.load(base + "_inputs.pt", weights_only=True)
        kwargs = {"enable_etdump": True, "debug_buffer_size": 0} if a.etdump else {}
        if os.path.exists(base + ".ptd"):
            kwargs["data_path"] = base + ".ptd"
        try:
            program = runtime.load_program(data, **kwargs)
            outputs = program.load_method("forward").execute(list(inputs))
        except RuntimeError as err:  # reported per model; the caller decides what a failure means
            print(json.dumps({"model": name, "error": str(err)}), flush=True)
            continue
        torch.save([o for o in outputs], base + "_upstream.pt")
        if a.etdump:
            program.write_etdump_result_to_file(base + ".etdp", os.devnull)
        print(json.dumps({"model": name, "outputs": len(outputs)}), flush=True)
    for name in a.keys or ():
        print(json.dumps({"keys": name, "named": _named_keys(os.path.join(a.dir, name + ".pt2"))}), flush=True)
    if a.count:
        a.zoo, a.names = a.count[0], a.count[1:]
        cmd_count(a)


def _named_keys(path):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._serialize import _deserialize_pte_binary

    edge = to_edge_transform_and_lower(torch.export.load(path), partitioner=[XnnpackPartitioner()])
    named = _deserialize_pte_binary(edge.to_executorch().buffer).named_data
    return sorted(named.pte_data) if named is not None else []


def cmd_count(a):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    zoo = _load(a.zoo, "_ref_lowering_zoo")
    for name in a.names:
        model, inputs = getattr(zoo, f"make_{name}")()
        edge = to_edge_transform_and_lower(torch.export.export(model, tuple(inputs)),
                                           partitioner=[XnnpackPartitioner()])
        partitions, nodes = _lowered_counts(edge)
        print(json.dumps({"upstream": name, "partitions": partitions, "nodes": nodes}), flush=True)


def _load(path, name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _dynamic(model, inputs):
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    with torch.no_grad():
        prepared = prepare_pt2e(torch.export.export(model, tuple(inputs)).module(),
                                XNNPACKQuantizer().set_global(config))
        prepared(*inputs)
        return convert_pt2e(prepared)


def _lowered_counts(edge):
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    lowered = get_lowered_submodules(edge.exported_program().graph_module)
    nodes = sum(1 for _, module, _ in lowered for n in module.original_module.graph.nodes if n.op == "call_function")
    return len(lowered), nodes


def cmd_quantize(a):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    et_ref = _load(a.et_ref, "_ref_lowering_et_ref")
    zoo = _load(a.zoo, "_ref_lowering_zoo")
    jobs = [("static", n) for n in a.names] + [("dynamic", n) for n in a.dynamic]
    for variant, name in jobs:
        model, inputs = getattr(zoo, f"make_{name}")()
        converted = et_ref._quantize(model, inputs) if variant == "static" else _dynamic(model, inputs)
        ep = torch.export.export(converted, tuple(inputs))
        base = os.path.join(a.dir, f"{variant}_{name}")
        torch.export.save(ep, base + ".pt2")
        torch.save(list(inputs), base + "_inputs.pt")
        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
        program = Runtime.get().load_program(edge.to_executorch().buffer)
        torch.save(list(program.load_method("forward").execute(list(inputs))), base + "_reference.pt")
        partitions, nodes = _lowered_counts(edge)
        print(json.dumps({"upstream": f"{variant}_{name}", "partitions": partitions, "nodes": nodes}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("names", nargs="+")
    r.add_argument("--etdump", action="store_true")
    r.add_argument("--count", nargs="+", metavar="ZOO_OR_NAME")
    r.add_argument("--keys", nargs="+", metavar="NAME")
    q = sub.add_parser("quantize")
    q.add_argument("et_ref")
    q.add_argument("zoo")
    q.add_argument("dir")
    q.add_argument("names", nargs="*")
    q.add_argument("--dynamic", nargs="*", default=[])
    c = sub.add_parser("count")
    c.add_argument("zoo")
    c.add_argument("names", nargs="+")
    a = p.parse_args()
    {"run": cmd_run, "count": cmd_count, "quantize": cmd_quantize}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
