"""Upstream ExecuTorch's compile timer for bench/corpus_speed.py and bench/corpus.py: a long-lived worker,
so upstream's compile of each corpus model can be timed interleaved with etlab's in one run. Runs ONLY under the
reference python (../shared/reference/setup.sh prints it); etlab never imports upstream.

  $REF bench/_ref_corpus_timer.py

Reads one JSON request per line on stdin, {"dir": D, "methods": [...]}: loads D/<method>.pt2
(torch.export.save files of the ExportedPrograms etlab compiled), times
`to_edge(programs).to_executorch().buffer` once (the deep copy of the programs is outside the timer,
as in bench/_ref_corpus.py) and answers one JSON line {"seconds": wall, "cpu_seconds": process CPU
time, "pte_bytes": n} or {"error": "..."}. Single-threaded like the etlab side. Exits at end of input.

Optional request fields: "share_mutable_buffers": true compiles with MemoryPlanningPass(share_mutable_buffers=True)
(methods sharing a KV cache, as the corpus entry says); "pte": PATH also writes the timed compile's program
there (atomically, after the timer stops): bench/corpus.py's upstream .pte is the one it timed.
{"warmup": true} compiles a tiny program untimed (imports and first-call set-up out of the first sample) and
answers {"ok": true}.

With "etrecord": PATH in the request, the compile runs with generate_etrecord=True (untimed) and what is
timed is `get_etrecord().save(PATH)` alone; the answer's "bytes" is the written file's size.
"""

import copy
import json
import logging
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def _config(request):
    if not request.get("share_mutable_buffers"):
        return None
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass

    return ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))


def _warmup():
    import torch
    from executorch.exir import to_edge

    ep = torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),))
    bytes(to_edge(ep).to_executorch().buffer)
    return {"ok": True}


def _write(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _time_compile(request, loaded):
    import torch
    from executorch.exir import to_edge

    if request.get("warmup"):
        return _warmup()
    key = (request["dir"], tuple(request["methods"]))
    if key not in loaded:
        loaded.clear()  # one model at a time: keep memory flat over 44 models
        loaded[key] = {m: torch.export.load(os.path.join(request["dir"], f"{m}.pt2")) for m in request["methods"]}
    programs = copy.deepcopy(loaded[key])
    config = _config(request)
    if request.get("etrecord"):
        record = to_edge(programs, generate_etrecord=True).to_executorch(config).get_etrecord()
        t, cpu = time.perf_counter(), time.process_time()
        record.save(request["etrecord"])
        seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - cpu
        return {"seconds": seconds, "cpu_seconds": cpu_seconds, "bytes": os.path.getsize(request["etrecord"])}
    t, cpu = time.perf_counter(), time.process_time()
    buf = to_edge(programs).to_executorch(config).buffer
    seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - cpu
    if request.get("pte"):
        _write(request["pte"], buf)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "pte_bytes": len(buf)}


def main():
    import torch

    torch.set_num_threads(1)
    loaded = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            answer = _time_compile(json.loads(line), loaded)
        except Exception as e:  # reported to the harness, which names it in the table
            text = f"{type(e).__name__}: {e}".strip().splitlines()
            answer = {"error": (text[0] if text else type(e).__name__)[:300]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    sys.exit(main())
