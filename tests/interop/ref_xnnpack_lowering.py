"""Upstream's side of the XNNPACK lowering tests (tests/interop/test_xnnpack_lowering.py).

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_xnnpack_lowering.py run DIR NAME [NAME ...] [--etdump] [--count ZOO.py NAME ...]
      For each NAME, loads DIR/NAME.pte (written by etlab's XnnpackPartitioner) with upstream's
      runtime, which runs its XNNPACK delegates with real XNNPACK, executes "forward" on the
      tensors in DIR/NAME_inputs.pt and saves the outputs to DIR/NAME_upstream.pt (torch.save of
      a list). With --etdump, also writes upstream's ETDump of that run to DIR/NAME.etdp (one
      profiling event per XNNPACK operator, keyed by the node's debug handle). One process for
      all models: importing upstream takes most of a run's time. --count (the same process) also
      does `count`.

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
        program = runtime.load_program(data, **kwargs)
        outputs = program.load_method("forward").execute(list(inputs))
        torch.save([o for o in outputs], base + "_upstream.pt")
        if a.etdump:
            program.write_etdump_result_to_file(base + ".etdp", os.devnull)
        print(json.dumps({"model": name, "outputs": len(outputs)}), flush=True)
    if a.count:
        a.zoo, a.names = a.count[0], a.count[1:]
        cmd_count(a)


def cmd_count(a):
    import importlib.util

    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    spec = importlib.util.spec_from_file_location("_ref_lowering_zoo", a.zoo)
    zoo = importlib.util.module_from_spec(spec)
    sys.modules["_ref_lowering_zoo"] = zoo
    spec.loader.exec_module(zoo)
    for name in a.names:
        model, inputs = getattr(zoo, f"make_{name}")()
        edge = to_edge_transform_and_lower(torch.export.export(model, tuple(inputs)),
                                           partitioner=[XnnpackPartitioner()])
        lowered = get_lowered_submodules(edge.exported_program().graph_module)
        nodes = sum(1 for _, module, _ in lowered for n in module.original_module.graph.nodes
                    if n.op == "call_function")
        print(json.dumps({"upstream": name, "partitions": len(lowered), "nodes": nodes}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("names", nargs="+")
    r.add_argument("--etdump", action="store_true")
    r.add_argument("--count", nargs="+", metavar="ZOO_OR_NAME")
    c = sub.add_parser("count")
    c.add_argument("zoo")
    c.add_argument("names", nargs="+")
    a = p.parse_args()
    {"run": cmd_run, "count": cmd_count}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
