"""Both sides of bench/xnnpack_lowering.py: the models (exported once, the same ExportedProgram for both
compilers), etlab's lowering in this process, and upstream's in the reference-python worker
(bench/_ref_xnnpack.py)."""

from __future__ import annotations

import json
import select
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from _common import ref_env, worker_answer
from _xnnpack_rows import Result

from etlab.models import DYNAMIC_SHAPES, ZOO
from etlab.models.corpus import CORPUS, flat_tensors, within_tolerance

HERE = Path(__file__).resolve().parent
ZOO_TOLERANCE = (1e-4, 1e-4)


@dataclass
class Model:
    """One model of the bench: its program, inputs, eager outputs and tolerance."""

    name: str
    ep: torch.export.ExportedProgram
    inputs: tuple
    eager: list
    atol: float
    rtol: float



class Upstream:
    """The reference-python worker (bench/_ref_xnnpack.py): one JSON request in, one JSON answer out.
    A worker that died (a program crashed upstream's runtime) is named in the error and started again
    for the next request, so an unattended run goes on with the next model."""

    def __init__(self, ref_python: str):
        self.ref_python = ref_python
        self.proc = self._start()

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen([self.ref_python, str(HERE / "_ref_xnnpack.py")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=ref_env())

    def ask(self, timeout: float | None = None, **req) -> dict:
        """One request's answer; `timeout` (seconds): a worker that has not answered by then is stopped
        (and started again by the next request) and the request raises."""
        if self.proc.poll() is not None:
            self.proc = self._start()
        try:
            self.proc.stdin.write(json.dumps(req, default=str) + "\n")
            self.proc.stdin.flush()
            if timeout is not None and not select.select([self.proc.stdout], [], [], timeout)[0]:
                self.proc.kill()
                self.proc.wait(timeout=60)
                raise RuntimeError(f"upstream worker gave no answer in {timeout:.0f} s (stopped)")
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        return worker_answer(self.proc, line, "upstream worker")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _etlab_partitioner():
    """etlab's XnnpackPartitioner class, or None (and why) when the backend is not there."""
    try:
        from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    except Exception as e:  # not built yet, or broken: upstream's side is still measured
        return None, f"etlab: no XnnpackPartitioner ({type(e).__name__}: {e})"
    return XnnpackPartitioner, ""


def load_models(names: list[str]) -> list[tuple[str, object]]:
    """(name, factory) per requested model: zoo names first, then corpus names."""
    out = []
    for name in names:
        if name in ZOO:
            out.append((name, "zoo"))
        elif name in CORPUS:
            out.append((name, "corpus"))
        else:
            raise SystemExit(f"xnnpack_lowering: unknown model {name!r} (zoo: {sorted(ZOO)}; corpus: {sorted(CORPUS)})")
    return out


def build(name: str, kind: str) -> Model:
    if kind == "zoo":
        module, inputs = ZOO[name]()
        module.eval()
        inputs = tuple(inputs)
        with torch.no_grad():
            ep = torch.export.export(module, inputs, dynamic_shapes=DYNAMIC_SHAPES.get(ZOO[name].__name__),
                                     strict=False)
            eager = flat_tensors(module(*inputs))
        return Model(name, ep, inputs, eager, *ZOO_TOLERANCE)
    entry = CORPUS[name]
    built = entry.build()
    if list(built[1]) != ["forward"]:
        raise ValueError(f"methods {list(built[1])}: the bench lowers single-method programs")
    ep = entry.export(built)["forward"]
    return Model(name, ep, tuple(built[1]["forward"]), entry.eager(built)["forward"], entry.atol, entry.rtol)


def _etlab_compile(model: Model, partitioner_cls, res: Result | None = None):
    from etlab.compiler import to_edge_transform_and_lower

    t, cpu = time.perf_counter(), time.process_time()
    edge = to_edge_transform_and_lower(model.ep, partitioner=[partitioner_cls()])
    buf = bytes(edge.to_executorch().buffer)
    if res is not None:
        res.etlab_s.append(time.perf_counter() - t)
        res.etlab_cpu.append(time.process_time() - cpu)
    return edge, buf


def delegated_ops(info) -> dict[str, int]:
    """Op type -> occurrences in delegated graphs, from a get_delegation_info answer."""
    df = info.get_operator_delegation_dataframe()
    return {str(r["op_type"]): int(r["occurrences_in_delegated_graphs"]) for _, r in df.iterrows()
            if r["op_type"] != "Total"}


def _etlab_runtime_outputs(pte: Path, inputs) -> list:
    from etlab.runtime import Runtime

    return flat_tensors(Runtime.get().load_program(pte).load_method("forward").execute(list(inputs)))


def _tolerance_ok(got: list, model: Model) -> bool:
    return len(got) == len(model.eager) and all(within_tolerance(g, w, model.atol, model.rtol)
                                                for g, w in zip(got, model.eager))
