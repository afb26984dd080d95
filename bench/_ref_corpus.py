"""Upstream ExecuTorch's side of the corpus harness (bench/corpus.py). Runs ONLY under the reference
python (../shared/reference/setup.sh prints it); etlab never imports upstream.

  $REF bench/_ref_corpus.py JOBS.json

JOBS.json is a list of jobs; each is {"kind": "compile", "dir": D, "methods": [...], "share_mutable_buffers": B} or
{"kind": "run", "pte": P, "inputs_dir": D, "methods": [...], "out": O}.

compile: loads D/<method>.pt2 (torch.export.save files written by etlab's side, so both compilers
start from the same ExportedProgram), times to_edge(...).to_executorch() (--repeat runs, first is
cold), writes D/upstream.pte; lowers with XnnpackPartitioner to D/xnnpack.pte; runs both with
upstream's runtime on D/<method>.inputs.pt. Results (times, errors per step) go to D/upstream.json
and outputs to D/upstream.<method>.out.pt and D/xnnpack.<method>.out.pt.
run: runs P's methods with upstream's runtime on D/<method>.inputs.pt; outputs to
O/<method>.out.pt and a status to O/status.json.
A failing step is recorded with its error and the job goes on; the process exits 0 unless a job
file is unreadable.
"""

import argparse
import copy
import json
import logging
import os
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def _error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:400] if text else type(e).__name__


def _load_programs(d, methods):
    import torch

    return {m: torch.export.load(os.path.join(d, f"{m}.pt2")) for m in methods}


def _run_pte(path, inputs_dir, methods, out_prefix):
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(open(path, "rb").read())
    for m in methods:
        inputs = torch.load(os.path.join(inputs_dir, f"{m}.inputs.pt"), weights_only=True)
        outs = program.load_method(m).execute(list(inputs))
        torch.save([o for o in outs], f"{out_prefix}.{m}.out.pt")


def _step(result, name, fn):
    t = time.perf_counter()
    try:
        value = fn()
        result[name] = {"ok": True, "seconds": time.perf_counter() - t}
        if value is not None:
            result[name].update(value)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        result[name] = {"ok": False, "error": _error(e), "trace": traceback.format_exc()[-2000:]}


def compile_job(job, repeat):
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    d, methods = job["dir"], job["methods"]
    result = {}
    programs = {}

    def config():  # methods sharing mutable buffers (a KV cache) when the job says so
        if not job.get("share_mutable_buffers"):
            return None
        return ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))

    def load():
        programs.update(_load_programs(d, methods))

    def compile_portable():
        times, buf = [], None
        for _ in range(repeat):
            progs = copy.deepcopy(programs)  # to_edge may mutate; copying is outside the timer
            t = time.perf_counter()
            et = to_edge(progs).to_executorch(config())
            buf = et.buffer
            times.append(time.perf_counter() - t)
        with open(os.path.join(d, "upstream.pte"), "wb") as f:
            f.write(buf)
        return {"times": times}

    def compile_xnnpack():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        et = to_edge_transform_and_lower(copy.deepcopy(programs), partitioner=[XnnpackPartitioner()]).to_executorch(
            config())
        with open(os.path.join(d, "xnnpack.pte"), "wb") as f:
            f.write(et.buffer)

    torch.set_num_threads(1)
    _step(result, "load", load)
    if result["load"]["ok"]:
        _step(result, "compile", compile_portable)
        if result["compile"]["ok"]:
            _step(result, "run_upstream_pte", lambda: _run_pte(os.path.join(d, "upstream.pte"), d, methods,
                                                               os.path.join(d, "upstream")))
        _step(result, "xnnpack", compile_xnnpack)
        if result["xnnpack"]["ok"]:
            _step(result, "run_xnnpack_pte", lambda: _run_pte(os.path.join(d, "xnnpack.pte"), d, methods,
                                                              os.path.join(d, "xnnpack")))
    with open(os.path.join(d, "upstream.json.tmp"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(d, "upstream.json.tmp"), os.path.join(d, "upstream.json"))


def run_job(job):
    os.makedirs(job["out"], exist_ok=True)
    result = {}
    _step(result, "run", lambda: _run_pte(job["pte"], job["inputs_dir"], job["methods"],
                                          os.path.join(job["out"], "upstream")))
    with open(os.path.join(job["out"], "status.json.tmp"), "w") as f:
        json.dump(result["run"], f)
    os.replace(os.path.join(job["out"], "status.json.tmp"), os.path.join(job["out"], "status.json"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("jobs")
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args()
    with open(a.jobs) as f:
        jobs = json.load(f)
    for job in jobs:
        t = time.perf_counter()
        if job["kind"] == "compile":
            compile_job(job, a.repeat)
        else:
            run_job(job)
        print(json.dumps({"job": job.get("dir") or job.get("pte"), "seconds": time.perf_counter() - t}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
