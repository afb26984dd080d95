"""Upstream ExecuTorch's half of bench/xnnpack_lowering.py: a long-lived worker, so upstream's XNNPACK
lowering and runtime can be timed interleaved with etlab's in one run. Runs ONLY under the reference
python (../shared/reference/setup.sh prints it); etlab never imports upstream.

  $REF bench/_ref_xnnpack.py

Reads one JSON request per line on stdin and answers one JSON line ({"error": "..."} on failure):

- {"cmd": "compile", "dir": D, "write": bool}: loads D/model.pt2 (torch.export.save of the program etlab
  lowers too), times `to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
  .to_executorch().buffer` (the deep copy of the program is outside the timer); with "write", saves
  D/upstream.pte and reports upstream's get_delegation_info counts of the lowered edge graph.
  Answer: {"seconds", "cpu_seconds", "pte_bytes", ["delegated_nodes", "non_delegated_nodes", "partitions",
  "delegated_ops" (op type -> delegated occurrences)]}.
- {"cmd": "latency", "ptes": {label: path}, "inputs": P, "threads": N, "rounds": R, "per_round": K}:
  loads every program with upstream's runtime, sets torch's and XNNPACK's threadpool to N threads
  (0: the pool's size at start-up, its default), then times `execute` in R alternating rounds of K
  calls (one untimed call before each batch, the order rotated every round).
  Answer: {"median_ms": {label: ms}, "threads": the pool size used}.
- {"cmd": "outputs", "pte": path, "inputs": P, "out": Q}: one run; saves the outputs (a list of
  tensors) to Q. Answer: {"outputs": n}.
- {"cmd": "ready"}: answers {"ready": true} once upstream's runtime is imported (start-up, timed apart).

Single-threaded compile like the etlab side. Exits at end of input.
"""

import copy
import json
import logging
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

_DEFAULT_THREADS = None
_LOADED = {}  # (dir, mtime) -> ExportedProgram; one model at a time


def _program(d):
    import torch

    key = (d, os.stat(os.path.join(d, "model.pt2")).st_mtime_ns)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = torch.export.load(os.path.join(d, "model.pt2"))
    return copy.deepcopy(_LOADED[key])


def _compile(req):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = _program(req["dir"])
    t, cpu = time.perf_counter(), time.process_time()
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    buf = edge.to_executorch().buffer
    answer = {"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - cpu, "pte_bytes": len(buf)}
    if req.get("write"):
        from executorch.devtools.backend_debug import get_delegation_info

        with open(os.path.join(req["dir"], "upstream.pte"), "wb") as f:
            f.write(buf)
        info = get_delegation_info(edge.exported_program().graph_module)
        df = info.get_operator_delegation_dataframe()
        answer.update(delegated_nodes=info.num_delegated_nodes, non_delegated_nodes=info.num_non_delegated_nodes,
                      partitions=info.num_delegated_subgraphs,
                      delegated_ops={str(r["op_type"]): int(r["occurrences_in_delegated_graphs"])
                                     for _, r in df.iterrows() if r["op_type"] != "Total"})
    return answer


def _set_threads(n):
    import torch
    from executorch.extension.pybindings import portable_lib

    global _DEFAULT_THREADS
    if _DEFAULT_THREADS is None:
        _DEFAULT_THREADS = int(portable_lib._threadpool_get_thread_count())
    n = n or _DEFAULT_THREADS
    torch.set_num_threads(n)
    portable_lib._unsafe_reset_threadpool(n)
    return n


_KEEP = []  # the bytes and programs of the loaded methods: upstream's program reads the buffer in place


def _method(path):
    from executorch.runtime import Runtime

    with open(path, "rb") as f:
        data = f.read()
    program = Runtime.get().load_program(data)
    _KEEP[:] = [*_KEEP[-8:], data, program]
    return program.load_method("forward")


def _latency(req):
    import torch

    threads = _set_threads(int(req.get("threads", 0)))
    inputs = list(torch.load(req["inputs"], weights_only=True))
    methods = {label: _method(path) for label, path in req["ptes"].items()}
    rounds, per_round = int(req.get("rounds", 20)), int(req.get("per_round", 5))
    for m in methods.values():
        for _ in range(3):
            m.execute(inputs)
    samples = {label: [] for label in methods}
    order = list(methods.items())
    for r in range(rounds):
        for label, m in order[r % len(order):] + order[: r % len(order)]:
            m.execute(inputs)
            t = time.perf_counter()
            for _ in range(per_round):
                m.execute(inputs)
            samples[label].append((time.perf_counter() - t) / per_round)
    torch.set_num_threads(1)
    quartiles = {k: statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3 for k, v in samples.items()}
    return {"median_ms": {k: statistics.median(v) * 1e3 for k, v in samples.items()},
            "iqr_ms": {k: [q[0] * 1e3, q[2] * 1e3] for k, q in quartiles.items()}, "threads": threads}


def _outputs(req):
    import torch

    outs = _method(req["pte"]).execute(list(torch.load(req["inputs"], weights_only=True)))
    torch.save([o for o in outs], req["out"])
    return {"outputs": len(outs)}


def main():
    import torch
    from executorch.extension.pybindings import portable_lib  # noqa: F401  (the runtime's kernels and backends)

    torch.set_num_threads(1)
    handlers = {"compile": _compile, "latency": _latency, "outputs": _outputs, "ready": lambda req: {"ready": True}}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            answer = handlers[req["cmd"]](req)
        except Exception as e:  # reported to the harness, which names it in the table
            text = f"{type(e).__name__}: {e}".strip().splitlines()
            answer = {"error": (text[0] if text else type(e).__name__)[:300]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    sys.exit(main())
