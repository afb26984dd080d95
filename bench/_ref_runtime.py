"""Upstream ExecuTorch's half of bench/runtime.py: a long-lived worker, so that upstream's runtime is
timed in the same rounds as etlab's, on the same clock and thread settings. Runs ONLY under the
reference python (../shared/reference/setup.sh prints it); etlab never imports upstream.

  $REF bench/_ref_runtime.py --threads 1 --ref-dir ../shared/reference

torch's intra-op threads and XNNPACK's threadpool are set to --threads at start (a pool of one runs
its work on the calling thread, as etlab's 1-thread runs do). One JSON request per line on stdin,
one JSON answer per line ({"error": "..."} on failure):

- {"cmd": "load", "label": L, "pte": P, "inputs": I}: loads P with upstream's runtime (its bytes kept
  alive) and the inputs (a torch.save list). Answer: {"ok": true}.
- {"cmd": "time", "label": L, "calls": K, "clock": "cpu" | "wall"}: one untimed call, then K timed
  calls of `execute`. Answer: {"seconds": per call} (thread CPU time or wall time).
"""

import argparse
import json
import logging
import sys
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ref-dir", required=True, help="the directory of et_ref.py (its quantized kernels loader)")
    a = ap.parse_args()
    sys.path.insert(0, a.ref_dir)
    import torch

    try:  # the quantized_decomposed kernels of upstream's int8 portable programs
        import et_ref

        et_ref._load_quantized_kernels()
    except Exception:
        pass
    torch.set_num_threads(a.threads)
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(a.threads)
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    loaded = {}  # label -> (bytes, program, method, inputs): the bytes outlive the program
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req["cmd"] == "load":
                data = open(req["pte"], "rb").read()
                program = runtime.load_program(data)
                inputs = list(torch.load(req["inputs"], weights_only=True))
                loaded[req["label"]] = (data, program, program.load_method("forward"), inputs)
                answer = {"ok": True}
            elif req["cmd"] == "time":
                _, _, method, inputs = loaded[req["label"]]
                clock, calls = CLOCKS[req.get("clock", "cpu")], int(req["calls"])
                method.execute(inputs)
                start = clock()
                for _ in range(calls):
                    method.execute(inputs)
                answer = {"seconds": (clock() - start) / calls}
            else:
                answer = {"error": f"unknown command {req['cmd']!r}"}
        except Exception as e:  # reported to the parent, which names the request
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
