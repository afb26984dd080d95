"""Upstream ExecuTorch's background jobs for the corpus harness (bench/corpus.py). Runs ONLY under the
reference python (../shared/reference/setup.sh prints it); etlab never imports upstream.

  $REF bench/_ref_corpus.py JOBS.json

JOBS.json is a list of jobs; each is {"kind": "xnnpack", "dir": D, "programs_dir": P, "methods": [...],
"share_mutable_buffers": B}
or {"kind": "run", "pte": P, "inputs_dir": D, "methods": [...], "out": O}.

xnnpack: loads <method>.pt2 from "programs_dir" (default D; torch.export.save files written by etlab's
side, so both tools start from the same ExportedProgram), lowers them with XnnpackPartitioner and
writes D/xnnpack.pte; the result (ok or the error) goes to D/upstream.json. Nothing is run here: the
table's column is etlab reading and running upstream's XNNPACK program. Upstream's portable compile
is not a job: bench/corpus.py times it interleaved with etlab's through bench/_ref_corpus_timer.py,
which writes that .pte.
run: runs P's methods once with upstream's runtime on D/<method>.inputs.pt; outputs to
O/<method>.out.pt and a status to O/status.json.
A failing step is recorded with its error and the job goes on; the process exits 0 unless a job
file is unreadable.
"""

import argparse
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


def xnnpack_job(job):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    d, methods = job["dir"], job["methods"]
    result, programs = {}, {}
    config = None  # methods sharing mutable buffers (a KV cache) when the job says so
    if job.get("share_mutable_buffers"):
        config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))

    def compile_xnnpack():
        et = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()]).to_executorch(config)
        with open(os.path.join(d, "xnnpack.pte"), "wb") as f:
            f.write(et.buffer)

    torch.set_num_threads(1)
    _step(result, "load", lambda: programs.update(_load_programs(job.get("programs_dir", d), methods)))
    if result["load"]["ok"]:
        _step(result, "xnnpack", compile_xnnpack)
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
    a = p.parse_args()
    with open(a.jobs) as f:
        jobs = json.load(f)
    for job in jobs:
        t = time.perf_counter()
        if job["kind"] == "xnnpack":
            xnnpack_job(job)
        else:
            run_job(job)
        print(json.dumps({"job": job.get("dir") or job.get("pte"), "seconds": time.perf_counter() - t}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
