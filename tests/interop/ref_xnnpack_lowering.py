"""Upstream's side of the XNNPACK lowering tests (tests/interop/test_xnnpack_lowering.py).

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_xnnpack_lowering.py run DIR NAME [NAME ...] [--etdump]
      For each NAME, loads DIR/NAME.pte (written by etlab's XnnpackPartitioner) with upstream's
      runtime, which runs its XNNPACK delegates with real XNNPACK, executes "forward" on the
      tensors in DIR/NAME_inputs.pt and saves the outputs to DIR/NAME_upstream.pt (torch.save of
      a list). With --etdump, also writes upstream's ETDump of that run to DIR/NAME.etdp (one
      profiling event per XNNPACK operator, keyed by the node's debug handle). One process for
      all models: importing upstream takes most of a run's time.
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("names", nargs="+")
    r.add_argument("--etdump", action="store_true")
    a = p.parse_args()
    {"run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
