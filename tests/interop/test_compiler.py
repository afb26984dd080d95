"""etlab-compiled .pte files run on upstream ExecuTorch's runtime and match eager PyTorch within 1e-5.

All programs are compiled here, then one reference-python process runs every call (a method keeps
its state between the calls of one job, so the KV cache is checked across two decode steps).
Before running, the runner checks upstream's kernel registry: an operator we emit that upstream
lacks fails the test by name rather than as an opaque load error.
"""

from __future__ import annotations

import fcntl
import json
import os
import textwrap

import pytest
import torch

from etlab.compiler import ExecutorchBackendConfig, to_edge
from etlab.models import METHOD_INPUTS, ZOO, export_zoo
from etlab.schema import load_pte

from .conftest import run_ref

pytestmark = pytest.mark.interop

ATOL = 1e-5

_RUNNER = textwrap.dedent('''
    import json, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    from executorch.runtime import Runtime
    try:
        from executorch.extension.pybindings.portable_lib import _get_operator_names
    except ImportError:
        _get_operator_names = None

    jobs = json.load(open(sys.argv[1]))
    registered = set(_get_operator_names()) if _get_operator_names else None
    report = {}
    rt = Runtime.get()
    for job in jobs:
        if registered is not None:
            missing = sorted(set(job["operators"]) - registered)
            if missing:
                report[job["id"]] = {"missing_kernels": missing}
                continue
        kwargs = {"data_path": job["ptd"]} if job.get("ptd") else {}
        method = rt.load_program(job["pte"], **kwargs).load_method(job["method"])
        for inputs, outputs in job["calls"]:
            outs = method.execute(list(torch.load(inputs, weights_only=True)))
            torch.save([o for o in outs], outputs)
        report[job["id"]] = {"ok": True}
    print(json.dumps(report))
''')


def _calls(name):
    """[(method, [inputs per call])] for a zoo model; several calls check state and dynamic sizes."""
    factory = ZOO[name]
    module, inputs = factory()
    key = factory.__name__
    if key in METHOD_INPUTS:
        return module, {m: [ins] for m, ins in METHOD_INPUTS[key].items()}
    if name == "kv_cache_decoder":
        step2 = (torch.tensor([[3]]), torch.tensor([1]))
        return module, {"forward": [inputs, step2]}
    if name == "dynamic_batch":
        x = inputs[0]
        return module, {"forward": [inputs, (x[:1],), (torch.randn(16, *x.shape[1:]),)]}
    if name == "cond":
        return module, {"forward": [inputs, (-inputs[0],)]}  # both branches
    return module, {"forward": [inputs]}


def _operators(pte) -> list[str]:
    """The kernels a .pte asks for, as upstream's registry names them ('aten::add.out', 'aten::copy_')."""
    program = load_pte(pte).program
    return sorted({op.name + (f".{op.overload}" if op.overload else "")
                   for plan in program.execution_plan for op in plan.operators})


def _eager(module, method, calls):
    fn = getattr(module, method)
    with torch.no_grad():
        return [fn(*ins) for ins in calls]  # in order: stateful models advance like the runtime does


MODELS = ["mlp", "cnn", "transformer", "kv_cache_decoder", "dynamic_batch", "two_methods", "cond"]


@pytest.fixture(scope="session")
def upstream_results(ref_python, tmp_path_factory):
    """Compiles every zoo model (and an external-constants MLP), runs all calls upstream once.

    xdist workers share one build: the first takes a file lock and builds, the others wait and reuse.
    """
    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    root = shared / "compiler_interop"
    with open(shared / "compiler_interop.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "report.json").is_file():
            root.mkdir(exist_ok=True)
            _build_and_run(ref_python, root)
    return json.loads((root / "report.json").read_text()), json.loads((root / "expected.json").read_text())


def _build_and_run(ref_python, root) -> None:
    jobs, expected = [], {}
    for name in MODELS:
        module, calls = _calls(name)
        programs = export_zoo(name, module)
        pte = root / f"{name}.pte"
        to_edge(programs).to_executorch().write_to_file(pte)
        eager_module, _ = ZOO[name]()  # fresh state for the eager reference
        for method, method_calls in calls.items():
            job_id = f"{name}.{method}"
            files = []
            for i, ins in enumerate(method_calls):
                torch.save(list(ins), root / f"{job_id}.{i}.in.pt")
                files.append([str(root / f"{job_id}.{i}.in.pt"), str(root / f"{job_id}.{i}.out.pt")])
            jobs.append({"id": job_id, "pte": str(pte), "method": method, "calls": files,
                         "operators": _operators(pte)})
            for i, out in enumerate(_eager(eager_module, method, method_calls)):
                torch.save(list(out) if isinstance(out, (tuple, list)) else [out], root / f"{job_id}.{i}.eager.pt")
            expected[job_id] = [[f[1], str(root / f"{job_id}.{i}.eager.pt")] for i, f in enumerate(files)]
    # External constants: weights in a .ptd next to the .pte.
    module, calls = _calls("mlp")
    et = to_edge(export_zoo("mlp", module)).to_executorch(ExecutorchBackendConfig(external_constants=True))
    ext = root / "external"
    et.write_to_file(ext / "model.pte")
    (ptd,) = et.write_tensor_data_to_file(ext)
    torch.save(list(calls["forward"][0]), ext / "in.pt")
    jobs.append({"id": "mlp.external", "pte": str(ext / "model.pte"), "ptd": str(ptd), "method": "forward",
                 "calls": [[str(ext / "in.pt"), str(ext / "out.pt")]], "operators": _operators(ext / "model.pte")})
    torch.save(list(_eager(module, "forward", calls["forward"])), ext / "eager.pt")
    expected["mlp.external"] = [[str(ext / "out.pt"), str(ext / "eager.pt")]]

    (root / "jobs.json").write_text(json.dumps(jobs))
    (root / "runner.py").write_text(_RUNNER)
    proc = run_ref(ref_python, root / "runner.py", root / "jobs.json")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    (root / "expected.json").write_text(json.dumps(expected))
    (root / "report.json").write_text(json.dumps(report))  # written last: marks the build complete


@pytest.mark.parametrize("job", [f"{m}.forward" for m in MODELS if m != "two_methods"]
                         + ["two_methods.forward", "two_methods.encode", "mlp.external"])
def test_upstream_runtime_matches_eager(upstream_results, job):
    report, expected = upstream_results
    result = report[job]
    assert "missing_kernels" not in result, f"upstream's runtime lacks kernels we emit: {result.get('missing_kernels')}"
    for step, (out_path, eager_path) in enumerate(expected[job]):
        got = torch.load(out_path, weights_only=True)
        refs = torch.load(eager_path, weights_only=True)
        assert len(got) == len(refs), f"{job} call {step}: {len(got)} outputs, eager has {len(refs)}"
        for g, r in zip(got, refs):
            torch.testing.assert_close(g, r, rtol=0, atol=ATOL, msg=lambda m, s=step: f"{job} call {s}: {m}")
