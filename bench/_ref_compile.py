"""Compile zoo models with upstream ExecuTorch and time to_edge + to_executorch (export excluded).

Runs ONLY under the reference python (../shared/reference/setup.sh prints it); etlab never
imports upstream. Usage:

  $REF bench/_ref_compile.py ZOO_PY NAME [NAME ...] --out DIR [--repeat N]

For each NAME (a key of the zoo's ZOO dict) it exports once (honouring DYNAMIC_SHAPES and
METHOD_INPUTS like etlab's bench), then times `to_edge(ep).to_executorch()` --repeat times,
writes DIR/NAME.pte and prints one JSON line {"name", "seconds": [...], "pte_bytes"}.
"""

import argparse
import copy
import importlib.util
import json
import logging
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def _load_zoo(path):
    spec = importlib.util.spec_from_file_location("_etref_zoo", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_etref_zoo"] = mod
    spec.loader.exec_module(mod)
    return mod


def _export(zoo, name):
    import torch

    factory = zoo.ZOO[name]
    model, inputs = factory()
    key = factory.__name__
    with torch.no_grad():
        if key in zoo.METHOD_INPUTS:
            progs = {}
            for method, ins in zoo.METHOD_INPUTS[key].items():
                # export a method other than forward by wrapping it.
                progs[method] = torch.export.export(_MethodAsForward(model, method), ins, strict=False)
            return progs
        return torch.export.export(model, tuple(inputs), dynamic_shapes=zoo.DYNAMIC_SHAPES.get(key), strict=False)


class _MethodAsForward:
    def __new__(cls, model, method):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = model

            def forward(self, *args):
                return getattr(self.inner, method)(*args)

        return Wrapper()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("zoo")
    p.add_argument("names", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    import torch
    from executorch.exir import to_edge

    torch.set_num_threads(1)
    zoo = _load_zoo(a.zoo)
    os.makedirs(a.out, exist_ok=True)
    for name in a.names:
        programs = _export(zoo, name)
        times, buf = [], None
        for _ in range(a.repeat):
            progs = copy.deepcopy(programs)  # to_edge may mutate; copying is outside the timer
            t = time.perf_counter()
            et = to_edge(progs).to_executorch()
            buf = et.buffer
            times.append(time.perf_counter() - t)
        with open(os.path.join(a.out, f"{name}.pte"), "wb") as f:
            f.write(buf)
        print(json.dumps({"name": name, "seconds": times, "pte_bytes": len(buf)}), flush=True)


if __name__ == "__main__":
    main()
