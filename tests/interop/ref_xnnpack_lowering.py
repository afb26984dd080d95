"""Upstream's side of the XNNPACK lowering tests (tests/interop/test_xnnpack_lowering.py).

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_xnnpack_lowering.py run PTE INPUTS OUTPUTS [--etdump PATH] [--ptd PTD]
      Loads PTE (written by etlab's XnnpackPartitioner) with upstream's runtime, which runs its
      XNNPACK delegates with real XNNPACK, executes "forward" on the tensors in INPUTS and saves
      the outputs to OUTPUTS (torch.save of a list). With --etdump, also writes upstream's ETDump
      of that run (one profiling event per XNNPACK operator, keyed by the node's debug handle).
      Prints one JSON line: {"delegates": [...backend ids...], "outputs": n}.
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

    with open(a.pte, "rb") as f:
        data = f.read()
    inputs = torch.load(a.inputs, weights_only=True)
    runtime = Runtime.get()
    kwargs = {"enable_etdump": True, "debug_buffer_size": 0} if a.etdump else {}
    if a.ptd:
        with open(a.ptd, "rb") as f:
            kwargs["data_files"] = f.read()
    program = runtime.load_program(data, **kwargs)
    method = program.load_method("forward")
    outputs = method.execute(list(inputs))
    torch.save([o for o in outputs], a.outputs)
    if a.etdump:
        program.write_etdump_result_to_file(a.etdump, os.devnull)
    print(json.dumps({"outputs": len(outputs)}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("pte")
    r.add_argument("inputs")
    r.add_argument("outputs")
    r.add_argument("--etdump")
    r.add_argument("--ptd")
    a = p.parse_args()
    {"run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
