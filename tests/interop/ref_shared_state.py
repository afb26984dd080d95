"""Upstream side of the shared-mutable-buffer interop tests (tests/interop/test_shared_state.py).

Run ONLY with the reference python (upstream ExecuTorch 1.5.1); etlab never imports this file.

  $REF tests/interop/ref_shared_state.py JOBS.json
      Runs each job of the JSON list in order, in one process:
      {"export": FILE, "factory": NAME, "state": STATE.pt, "examples": EXAMPLES.pt, "pte": OUT.pte}
          loads FILE by path (torch only), builds NAME(), loads STATE.pt (its state_dict), exports
          each method of EXAMPLES.pt ({method: [inputs]}, in that order) and compiles them into one
          program with MemoryPlanningPass(share_mutable_buffers=True) and
          emit_mutable_buffer_names=True; writes OUT.pte.
      {"run": PTE, "calls": CALLS.pt, "outputs": OUT.pt}
          CALLS.pt: [[method, [inputs]], ...]; runs them in order on methods of ONE loaded program
          (upstream's runtime); writes [[outputs], ...].

Tensors cross the boundary as torch.save files of plain lists/dicts of tensors (weights_only).
"""

import importlib.util
import json
import logging
import sys
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def _load(path):
    spec = importlib.util.spec_from_file_location("_ref_shared_state_models", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _method_module(model, method):
    import torch

    class MethodOf(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = model

        def forward(self, *args):
            return getattr(self.module, method)(*args)

    return MethodOf()


def _export(job):
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    model = getattr(_load(job["export"]), job["factory"])().eval()
    model.load_state_dict(torch.load(job["state"], weights_only=True))
    examples = torch.load(job["examples"], weights_only=True)
    with torch.no_grad():
        eps = {m: torch.export.export(_method_module(model, m), tuple(ins), strict=False)
               for m, ins in examples.items()}
    et = to_edge(eps).to_executorch(ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True), emit_mutable_buffer_names=True))
    with open(job["pte"], "wb") as f:
        f.write(et.buffer)


def _run(job):
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(job["run"])
    methods, outputs = {}, []
    for method, inputs in torch.load(job["calls"], weights_only=True):
        if method not in methods:
            methods[method] = program.load_method(method)
        outputs.append([o.clone() for o in methods[method].execute(list(inputs))])
    torch.save(outputs, job["outputs"])


def main():
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        _export(job) if "export" in job else _run(job)


if __name__ == "__main__":
    main()
