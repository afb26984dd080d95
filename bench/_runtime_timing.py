"""Timing shared by the runtime benches (bench/runtime.py, runtime_holdout.py, runtime_xnnpack.py): contenders
timed in alternating rounds on one clock with one thread setting, and upstream's runtime in a long-lived worker
(bench/_ref_runtime.py) timed the same way.

The clock is the thread's CPU time by default (`--clock cpu`): on a shared machine the wall clock also counts the
time other processes hold the cores, which swamps differences of a few percent; `--clock wall` times by wall
clock. `configure` sets the clock and the threads (torch, etlab's `load_program(threads=N)`, upstream's XNNPACK
threadpool) for every contender of a run.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median, quantiles

import torch
from _common import ET_REF, ref_env

from etlab.runtime import Runtime

CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


@dataclass
class Settings:
    """The clock and thread count every contender of a run uses."""

    clock_name: str = "cpu"
    threads: int = 1

    def clock(self) -> float:
        return CLOCKS[self.clock_name]()


SETTINGS = Settings()


def configure(clock: str, threads: int) -> None:
    SETTINGS.clock_name, SETTINGS.threads = clock, threads
    torch.set_num_threads(threads)


def clock_words(clock: str) -> str:
    return "thread CPU time" if clock == "cpu" else "wall time"


def load_method(d: Path, core: str, **trace):
    """`d/model.pte`'s forward on `core`, with the run's threads."""
    return Runtime.get(core=core).load_program(d / "model.pte", threads=SETTINGS.threads, **trace).load_method(
        "forward")


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


SPREAD = "~"  # result key suffix: a contender's interquartile range over its rounds / its median


def local(fn):
    """An in-process contender: `calls` timed calls after one untimed one, seconds per call on the clock."""
    def batch(calls: int) -> float:
        fn()
        start = SETTINGS.clock()
        for _ in range(calls):
            fn()
        return (SETTINGS.clock() - start) / calls
    return batch


def interleaved(contenders: dict, rounds: int = 30, per_round: int = 5, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each contender, in alternating rounds with the order rotated each round
    (each follows each other equally often), each batch after one untimed call (steady state: the
    contenders' working sets evict each other; a 500-add chain run right after eager's 500 fresh
    tensors took twice as long). Plain callables run in process (`local`); an `Upstream.contender`
    times its batch in the worker on the same clock. Also `<name>~`: the spread of its rounds."""
    batches = {k: fn if getattr(fn, "is_batch", False) else local(fn) for k, fn in contenders.items()}
    for batch in batches.values():
        batch(warmup)
    samples: dict[str, list[float]] = {k: [] for k in batches}
    order = list(batches.items())
    for r in range(rounds):
        for name, batch in order[r % len(order):] + order[: r % len(order)]:
            samples[name].append(batch(per_round))
    result = {k: median(v) for k, v in samples.items()}
    for k, v in samples.items():
        q1, _, q3 = quantiles(v, n=4) if len(v) > 1 else (v[0], v[0], v[0])
        result[k + SPREAD] = (q3 - q1) / result[k] if result[k] else 0.0
    return result


def timings(result: dict) -> dict[str, float]:
    """The medians of an `interleaved` result (without the spreads)."""
    return {k: v for k, v in result.items() if not k.endswith(SPREAD)}


class Upstream:
    """Upstream's runtime in a long-lived worker (bench/_ref_runtime.py), same threads and clock as etlab."""

    def __init__(self, ref: str, threads: int):
        self.proc = subprocess.Popen([ref, str(Path(__file__).parent / "_ref_runtime.py"), "--threads", str(threads),
                                      "--ref-dir", str(ET_REF.parent)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ref_env())

    def _ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        answer = json.loads(line) if line else {"error": "the upstream worker exited"}
        if "error" in answer:
            raise RuntimeError(f"upstream worker, {req}: {answer['error']}")
        return answer

    def contender(self, label: str, d: Path, pte: str = "model.pte"):
        """A contender running `d/pte` on upstream's runtime (loaded now)."""
        self._ask(cmd="load", label=label, pte=str(d / pte), inputs=str(d / "inputs.pt"))

        def batch(calls: int) -> float:
            return self._ask(cmd="time", label=label, calls=calls, clock=SETTINGS.clock_name)["seconds"]
        batch.is_batch = True
        return batch

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)
