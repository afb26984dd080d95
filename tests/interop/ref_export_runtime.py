"""Upstream-side exports for the runtime tests and benchmarks that et_ref.py cannot make.

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_export_runtime.py zoo ZOO.py NAME [NAME ...] --out DIR [--trace NAME ...]
      For each NAME (make_NAME in ZOO.py, or "sym_ops", a module below that makes upstream emit
      sym_size, executorch_prim arithmetic, et_view and dim-order copies) exports with what
      et_ref's export leaves out: DYNAMIC_SHAPES, METHOD_INPUTS (one method each), no grad
      (mutable buffers), no ETRecord (torch.cond). Then runs a list of input cases, in order, on
      one loaded method each (so mutable state carries over), with upstream's runtime and eagerly:
        DIR/NAME/model.pte
        DIR/NAME/cases.pt  {method: [[inputs...], ...]}
        DIR/NAME/upstream_outputs.pt, DIR/NAME/eager_outputs.pt  {method: [[outputs...], ...]}
      --trace NAME adds DIR/NAME/run.etdp and run.bin: upstream's trace of the first case of the
      first method, one run, intermediate outputs logged.
  $REF tests/interop/ref_export_runtime.py add-chain N --out DIR
      A module doing N dependent adds of a (4, 4) weight to its (4, 4) input: DIR/model.pte,
      DIR/inputs.pt, DIR/eager_outputs.pt.
  $REF tests/interop/ref_export_runtime.py inspect OUT.json ETDP[,DEBUG_BUFFER] ...
      Upstream's Inspector on each .etdp (one process): OUT.json holds, per file, its event blocks
      (name, bundled input index, events: name, instruction id, delegate identifier, delegated or
      not, number of timings, debug value shapes and dtypes).

Tensors cross the boundary as torch.save files of plain lists/dicts of tensors (weights_only).
"""

import argparse
import importlib.util
import json
import logging
import os
import sys
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

DEBUG_BUFFER_SIZE = 1 << 20


def _zoo(path):
    spec = importlib.util.spec_from_file_location("_ref_export_zoo", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_ref_export_zoo"] = mod
    spec.loader.exec_module(mod)
    return mod


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _sym_ops():
    """A module whose export needs symbolic sizes: sym_size, prim arithmetic, et_view, dim-order copy."""
    import torch

    class SymOps(torch.nn.Module):
        def forward(self, x, y):
            n = x.shape[0]
            a = x.view(n * 2, -1)
            b = a.sum(0) + y
            c = torch.arange(n // 2 + 1) * 1.0
            d = x[: n - 1].reshape(-1)
            e = torch.ones(n, 3) * y[0]
            return b, c, d.sum(), e, torch.full((n + 1,), 2.0)

    torch.manual_seed(0)
    inputs = (torch.randn(6, 4), torch.randn(2))
    dynamic = {"x": {0: torch.export.Dim("n", min=3, max=32)}, "y": None}
    return SymOps(), inputs, dynamic


def _cases(name, inputs):
    """Input cases per method: several sizes / steps / branches, chosen per model."""
    import torch

    gen = torch.Generator().manual_seed(11)
    if name == "dynamic_batch":
        return {"forward": [(torch.randn(b, 3, 8, 8, generator=gen),) for b in (4, 1, 16, 7)]}
    if name == "kv_cache_decoder":
        steps = [(3, 0), (9, 1), (1, 2), (42, 3)]
        return {"forward": [(torch.tensor([[t]]), torch.tensor([p])) for t, p in steps]}
    if name == "cond":
        x = inputs[0]
        return {"forward": [(x,), (-x,), (x * 0.5,)]}
    if name == "sym_ops":
        return {"forward": [(torch.randn(n, 4, generator=gen), torch.randn(2, generator=gen)) for n in (6, 3, 17, 32)]}
    return None


def _method_module(model, method):
    import torch

    class MethodOf(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, *args):
            return getattr(self.inner, method)(*args)

    return MethodOf()


def _make(zoo, name):
    """(fresh model, example inputs, {method: inputs}, dynamic shapes of forward)."""
    if name == "sym_ops":
        model, inputs, dynamic = _sym_ops()
        return model, inputs, {"forward": inputs}, dynamic
    factory = f"make_{name}"
    model, inputs = getattr(zoo, factory)()
    methods = getattr(zoo, "METHOD_INPUTS", {}).get(factory) or {"forward": tuple(inputs)}
    return model, inputs, methods, getattr(zoo, "DYNAMIC_SHAPES", {}).get(factory)


def _export_one(zoo, name, out, etdump):
    import torch
    from executorch.exir import to_edge
    from executorch.runtime import Runtime
    from torch.export import export

    model, inputs, methods, dynamic = _make(zoo, name)
    model.requires_grad_(False)
    os.makedirs(out, exist_ok=True)
    eps = {}
    with torch.no_grad():
        for method, ins in methods.items():
            module = model if method == "forward" else _method_module(model, method)
            eps[method] = export(module, tuple(ins), dynamic_shapes=dynamic if method == "forward" else None)
    et = to_edge(eps).to_executorch()
    with open(os.path.join(out, "model.pte"), "wb") as f:
        f.write(et.buffer)

    cases = _cases(name, inputs) or {m: [tuple(ins)] for m, ins in methods.items()}
    # Eager on a fresh model: stateful models must see the same call order from a clean state.
    eager_model = _make(zoo, name)[0]
    eager = {}
    with torch.no_grad():
        for method, calls in cases.items():
            fn = getattr(eager_model, method)
            eager[method] = [[o.clone() for o in _as_list(fn(*[t.clone() for t in c]))] for c in calls]
    program = Runtime.get().load_program(et.buffer)
    upstream = {}
    for method, calls in cases.items():
        loaded = program.load_method(method)
        upstream[method] = [[o.clone() for o in loaded.execute([t.clone() for t in c])] for c in calls]
    torch.save({m: [list(c) for c in calls] for m, calls in cases.items()}, os.path.join(out, "cases.pt"))
    torch.save(eager, os.path.join(out, "eager_outputs.pt"))
    torch.save(upstream, os.path.join(out, "upstream_outputs.pt"))
    if etdump:
        traced = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size=DEBUG_BUFFER_SIZE)
        method = next(iter(cases))
        traced.load_method(method).execute([t.clone() for t in cases[method][0]])
        traced.write_etdump_result_to_file(os.path.join(out, "run.etdp"), os.path.join(out, "run.bin"))
    return {"name": name, "methods": list(cases), "pte_bytes": len(et.buffer)}


def cmd_zoo(a):
    zoo = _zoo(a.zoo)
    for name in a.names:
        print(json.dumps(_export_one(zoo, name, os.path.join(a.out, name), name in a.trace)), flush=True)


def cmd_add_chain(a):
    import torch
    from executorch.exir import to_edge
    from torch.export import export

    class AddChain(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n = n
            self.w = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)

        def forward(self, x):
            for _ in range(self.n):
                x = x + self.w
            return x

    torch.manual_seed(0)
    model = AddChain(a.n)
    inputs = (torch.randn(4, 4),)
    os.makedirs(a.out, exist_ok=True)
    et = to_edge(export(model, inputs)).to_executorch()
    with open(os.path.join(a.out, "model.pte"), "wb") as f:
        f.write(et.buffer)
    torch.save(list(inputs), os.path.join(a.out, "inputs.pt"))
    with torch.no_grad():
        torch.save([model(*inputs)], os.path.join(a.out, "eager_outputs.pt"))
    print(json.dumps({"out": a.out, "adds": a.n}))


def _shape_of(v):
    import torch

    if isinstance(v, torch.Tensor):
        return {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
    if isinstance(v, (list, tuple)):
        return [_shape_of(x) for x in v]
    return repr(v)


def cmd_inspect(a):
    from executorch.devtools import Inspector

    result = {}
    for spec in a.files:
        etdp, _, buf = spec.partition(",")
        ins = Inspector(etdump_path=etdp, debug_buffer_path=buf or None)
        blocks = []
        for b in ins.event_blocks:
            blocks.append({"name": b.name, "bundled_input_index": b.bundled_input_index, "events": [{
                "name": e.name, "instruction_id": e._instruction_id,
                "delegate_debug_identifier": e.delegate_debug_identifier, "is_delegated_op": e.is_delegated_op,
                "timings": 0 if e.perf_data is None else len(e.perf_data.raw),
                "debug_data": _shape_of(e.debug_data) if e.debug_data else None,
            } for e in b.events]})
        result[spec] = blocks
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1, default=repr)
    print(json.dumps({"files": len(result)}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    z = sub.add_parser("zoo")
    z.add_argument("zoo")
    z.add_argument("names", nargs="+")
    z.add_argument("--out", required=True)
    z.add_argument("--trace", action="append", default=[])
    c = sub.add_parser("add-chain")
    c.add_argument("n", type=int)
    c.add_argument("--out", required=True)
    i = sub.add_parser("inspect")
    i.add_argument("json")
    i.add_argument("files", nargs="+")
    a = p.parse_args()
    {"zoo": cmd_zoo, "add-chain": cmd_add_chain, "inspect": cmd_inspect}[a.cmd](a)


if __name__ == "__main__":
    main()
