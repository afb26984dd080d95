"""Upstream ExecuTorch's side of `bench/inspector.py --corpus`. Runs ONLY under the reference python
(../shared/reference/setup.sh prints it); etlab never imports upstream.

  $REF bench/_ref_inspector_corpus.py JOBS.json [--repeats N] [--time-only]
  $REF bench/_ref_inspector_corpus.py --serve PREFIX

JOBS.json is a list of {"dir": D, "methods": [...], "run": METHOD, "share_mutable_buffers": B}. D holds
<method>.pt2 (torch.export.save, written by etlab's side, so both tools see one ExportedProgram) and
<method>.inputs.pt. Per job, upstream compiles the programs with an ETRecord
(to_edge(..., generate_etrecord=True)), writes D/model.pte and D/model.etrecord (with the run method's
inputs as representative inputs), runs METHOD twice with ETDump and debug buffer (D/run.etdp, D/run.bin),
then times its Inspector on those files warm, in this process: one untimed load, then N timed
`Inspector(etdump_path, etrecord, debug_buffer_path).to_dataframe()`. D/upstream_inspector.json is
written last (atomically): {"ok": true, "seconds": [...], "cpu_seconds": [...], "rows": R} or {"ok": false,
"error": ...}. --time-only times the Inspector again on the files made before (D/upstream_timing.json), so
that both tools are timed in one sitting.

--serve PREFIX: times upstream's Inspector on request, so that bench/inspector.py can interleave the two tools
(upstream, etlab, upstream, ...) on one model. Each stdin line is {"dir": D, "repeats": N, "warm": B}; the
reply is one stdout line, PREFIX then {"ok": true, "seconds": [...], "cpu_seconds": [...], "rows": R} (N timed loads,
after one untimed load when B) or {"ok": false, "error": ...}; the prefix tells replies from whatever a
library prints to stdout.
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

MARKER = "upstream_inspector.json"
TIMING = "upstream_timing.json"


def _job(job, repeats):
    import torch
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.runtime import Runtime

    d, methods, run = job["dir"], job["methods"], job["run"]
    programs = {m: torch.export.load(os.path.join(d, f"{m}.pt2")) for m in methods}
    config = None
    if job.get("share_mutable_buffers"):
        config = ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))
    inputs = torch.load(os.path.join(d, f"{run}.inputs.pt"), weights_only=True)
    et = to_edge(programs if len(programs) > 1 else programs[methods[0]], generate_etrecord=True).to_executorch(config)
    with open(os.path.join(d, "model.pte"), "wb") as f:
        f.write(et.buffer)
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(os.path.join(d, "model.etrecord"))
    program = Runtime.get().load_program(bytes(et.buffer), enable_etdump=True, debug_buffer_size=64 << 20)
    method = program.load_method(run)
    for _ in range(2):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(os.path.join(d, "run.etdp"), os.path.join(d, "run.bin"))
    return _time_inspector(d, repeats)


def _time_inspector(d, repeats, warm=True):
    """Upstream's Inspector on D's files: one untimed load (if `warm`), then `repeats` timed ones (wall
    and CPU time: on a shared machine the process's CPU time is the steadier measure)."""
    from executorch.devtools import Inspector

    etdp, buf, rec = (os.path.join(d, n) for n in ("run.etdp", "run.bin", "model.etrecord"))
    times, cpu, rows = [], [], 0
    for k in range(repeats + 1 if warm else repeats):
        t, c = time.perf_counter(), time.process_time()
        df = Inspector(etdump_path=etdp, etrecord=rec, debug_buffer_path=buf).to_dataframe()
        if k or not warm:
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        rows = len(df)
    return {"ok": True, "seconds": times, "cpu_seconds": cpu, "rows": rows}


def _serve(prefix):
    """The --serve loop (see the module docstring)."""
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            result = _time_inspector(req["dir"], int(req["repeats"]), bool(req.get("warm")))
        except Exception as e:  # reported; the next request goes on
            text = f"{type(e).__name__}: {e}".strip().splitlines()
            result = {"ok": False, "error": (text[0] if text else type(e).__name__)[:400]}
        print(prefix + json.dumps(result), flush=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        return _serve(sys.argv[2])
    p = argparse.ArgumentParser()
    p.add_argument("jobs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--time-only", action="store_true", help="only time the Inspector on the files made before; "
                   "the result goes to D/upstream_timing.json")
    a = p.parse_args()
    with open(a.jobs) as f:
        jobs = json.load(f)
    for job in jobs:
        t = time.perf_counter()
        try:
            result = _time_inspector(job["dir"], a.repeats) if a.time_only else _job(job, a.repeats)
        except Exception as e:  # recorded; the next job goes on
            text = f"{type(e).__name__}: {e}".strip().splitlines()
            result = {"ok": False, "error": (text[0] if text else type(e).__name__)[:400],
                      "trace": traceback.format_exc()[-2000:]}
        out = os.path.join(job["dir"], TIMING if a.time_only else MARKER)
        with open(out + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(out + ".tmp", out)
        print(json.dumps({"job": job["dir"], "ok": result["ok"], "seconds": time.perf_counter() - t}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
