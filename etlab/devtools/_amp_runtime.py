"""Compiling a converted model for etlab's runtime and measuring it there (auto_mixed_precision's last steps)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
from torch.fx import GraphModule


def compile_program(converted: GraphModule, example: tuple, backend: str):
    """The converted model compiled by etlab (XNNPACK-lowered or portable): an ExecutorchProgramManager."""
    from etlab.compiler import to_edge, to_edge_transform_and_lower

    exported = torch.export.export(converted, example)
    if backend == "xnnpack":
        from etlab.compiler.backends.xnnpack import XnnpackPartitioner

        return to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    return to_edge(exported).to_executorch()


def runtime_outputs(buffer: bytes, samples: Sequence[tuple]) -> list:
    """Each sample run through the .pte on etlab's runtime."""
    from etlab.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    return [[t.clone() if isinstance(t, torch.Tensor) else t for t in method.execute(list(s))] for s in samples]


def runtime_latency_ms(buffer: bytes, sample: tuple, runs: int) -> float:
    """Median wall time of one `execute` on etlab's runtime (after a warm-up run), ms."""
    from etlab.runtime import Runtime

    method = Runtime.get().load_program(buffer).load_method("forward")
    args = list(sample)
    method.execute(args)
    times = []
    for _ in range(max(1, runs)):
        t = time.perf_counter()
        method.execute(args)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3
