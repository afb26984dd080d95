"""Both graphs of a report over a dataset run on a batch of inputs, every per-layer measurement taken on the
way (`Engine`, one per worker), and a batch split across workers (`Workers`).

Per batch, the float graph and the converted (quantized) graph are stepped through side by side
(`_quant_dataset_plan`, `_quant_dataset_run.Stepper`): as soon as both graphs have computed a layer, its total
error, local error (its float op re-run on the quantized inputs, for the whole batch at once) and inherited
error (its inputs' SQNR) are measured per input (`_quant_dataset_stats.batch_metrics`), and each value is freed
once the last measurement that reads it is done.

Batches: the exported graphs are specialised to the example's batch of 1, but most are batch-agnostic
(convolutions, linears, pools). The first batch is checked against a batch-1 run (every kept value has the
batch in dim 0, the outputs agree); the caller runs a graph that is not batch-agnostic one input at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.fx import GraphModule, Node

from etlab.devtools._quant_dataset_fold import conv_bn_pair, fold, folded_conv
from etlab.devtools._quant_dataset_inputs import stack
from etlab.devtools._quant_dataset_plan import FLOAT, QUANT, CoverageTask, LayerTask, _Plan, output_nodes
from etlab.devtools._quant_dataset_run import Stepper, _storage_bytes
from etlab.devtools._quant_dataset_stats import CoverageBatch, Scratch, batch_metrics, raw_ranges
from etlab.devtools._quant_debug import rerun_float
from etlab.errors import Error


def as_float(x) -> torch.Tensor | None:
    return x if isinstance(x, torch.Tensor) and x.is_floating_point() else None


class NotBatchAgnostic(Error):
    """A graph gave a value without the batch in dim 0: it runs one input at a time (caught here)."""


@dataclass
class LayerBatch:
    """One layer's numbers for one batch, committed to its streams once the whole batch has run."""

    total: dict
    local: dict | None
    inherited: np.ndarray | None
    ok: np.ndarray


class BatchRun:
    """Both graphs stepped through one batch (see _quant_dataset_plan): per task the measurement, then the
    outputs. Values are read from the steppers by node name; `sqnr_of` (float node, converted graph's value)
    -> SQNR per input lets a layer reuse the total error measured where its input was computed, `ranges` the
    float values' raw per-input extremes (a layer's degenerate check and its output quantizer's coverage)."""

    def __init__(self, plan: _Plan, fs: Stepper, qs: Stepper, batch: int, scratch: Scratch,
                 folds: dict[str, tuple | None]):
        self.plan, self.fs, self.qs, self.batch, self.folds = plan, fs, qs, batch, folds
        self.sqnr_of: dict[tuple[str, str], np.ndarray] = {}
        self.ranges: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.scratch = scratch

    def value(self, ref: tuple[str, str]):
        graph, name = ref
        return (self.fs if graph == FLOAT else self.qs).values.get(name)

    def canonical(self, ref: tuple[str, str]) -> tuple[str, str]:
        graph, name = ref
        return ref if graph == FLOAT else (graph, self.qs.alias.get(name, name))

    def float_ranges(self, name: str, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.ranges:
            self.ranges[name] = raw_ranges(x, self.batch)
        return self.ranges[name]

    def rerun(self, task: LayerTask, feeds: dict[str, Any]):
        """The layer's float ops on the quantized inputs; a convolution and its batch norm as one convolution
        (see _quant_dataset_fold; the folded parameters computed once per layer, kept in `folds`)."""
        chain, reads = task.join.chain, {name: self.fs.values[name] for name in task.reads}
        if len(chain) == 2 and chain[0].args and isinstance(chain[0].args[0], Node) \
                and chain[0].args[0].name in feeds and conv_bn_pair(*chain):
            key = chain[0].name
            if key not in self.folds:
                self.folds[key] = fold(*chain, lambda a: reads[a.name]) \
                    if all(a.name in reads for n in chain for a in n.all_input_nodes[1:]) else None
            if self.folds[key] is not None:
                return folded_conv(chain[0], feeds[chain[0].args[0].name], *self.folds[key])
        return rerun_float(chain, feeds, reads)

    def _check_batch(self, name: str, v) -> None:
        if self.batch > 1 and as_float(v) is not None and (v.dim() == 0 or v.shape[0] != self.batch):
            raise NotBatchAgnostic(f"{name} has shape {list(v.shape)} on a batch of {self.batch}")

    def layer(self, task: LayerTask) -> LayerBatch | None:
        j, batch = task.join, self.batch
        end = j.chain[-1]
        ref, val = self.fs.values.get(end.name), self.qs.values.get(j.qvalue_node.name)
        self._check_batch(end.name, ref)
        self._check_batch(j.qvalue_node.name, val)
        ref, val = as_float(ref), as_float(val)
        if ref is None or val is None or ref.shape != val.shape:
            return None
        feeds = {name: self.value(src) for name, src in task.feeds.items()}
        # the float value's extremes (degenerate check, coverage) taken in the same pass while its rows are in cache
        want = end.name not in self.ranges and (j.quantized or end.name in self.plan.ranged)
        total = batch_metrics(ref, val, batch, scratch=self.scratch, ranges=want)
        if want:
            self.ranges[end.name] = (total["lo"], total["hi"])
        self.sqnr_of[(end.name, self.canonical((QUANT, j.qvalue_node.name))[1])] = total["sqnr"]
        local = None
        if task.local:
            if task.computed:  # the converted graph computed the re-run's value itself (same_computation)
                local_ref = as_float(self.qs.values.get(task.computed))
            else:
                local_ref = as_float(self.rerun(task, feeds))
            if local_ref is not None and local_ref.shape == val.shape:
                local = batch_metrics(local_ref, val, batch, value_norm=total["b_norm"], extremes=False,
                                      scratch=self.scratch)
            del local_ref
        inherited = []
        for name, src in task.feeds.items():
            v, ref_in = as_float(feeds[name]), as_float(self.fs.values.get(name))
            if v is None or ref_in is None or ref_in.shape != v.shape:
                continue
            key = (name, self.canonical(src)[1]) if src[0] == QUANT else None
            inherited.append(self.sqnr_of[key] if key in self.sqnr_of else
                             batch_metrics(ref_in, v, batch, extremes=False, scratch=self.scratch)["sqnr"])
        ok = np.ones(batch, dtype=bool)
        if j.quantized:  # as degenerate_reason: an SQNR of a zero, tiny or rounded-away value means nothing
            lo, hi = self.float_ranges(end.name, ref)
            peak = np.maximum(-lo, hi)
            ok = ~((peak < 1e-6) | np.isnan(peak) | total["b_zero"])
        return LayerBatch(total, local, np.minimum.reduce(inherited) if inherited else None, ok)

    def coverage(self, task: CoverageTask) -> CoverageBatch | None:
        # the float model's value where there is one: what calibration observed, so the dataset is compared
        # with the calibration data, not with requantization noise (up to a step or so)
        x = as_float(self.value(task.source))
        if x is None:
            return None
        raw = self.float_ranges(task.source[1], x) if task.source[0] == FLOAT else None
        return self.plan.quantizers[task.node].measure(x, self.batch, raw)


def graph_outputs(values: dict, gm: GraphModule) -> list:
    return [values.get(a.name) if isinstance(a, Node) else a for a in output_nodes(gm)]


def _agrees(batched: list, single: list) -> bool:
    """Row 0 of a batched run's outputs against a batch-1 run of the same input."""
    for b, s in zip(batched, single):
        if as_float(s) is None:
            continue
        if as_float(b) is None or b.shape[1:] != s.shape[1:] or b.shape[0] < 1:
            return False
        scale = float(s.abs().max()) if s.numel() else 0.0
        if not torch.allclose(b[:1], s, rtol=1e-4, atol=1e-5 * max(scale, 1.0), equal_nan=True):
            return False
    return True


@dataclass
class Engine:
    """The two graphs' steppers, reused batch after batch (their constants computed once)."""

    float_gm: GraphModule
    quantized: GraphModule
    plan: _Plan
    fs: Stepper = None
    qs: Stepper = None
    checked: bool = False  # a batch of more than one input was checked against a batch-1 run
    peak_bytes: int = 0  # the most bytes both graphs' live values took at once (measured on request)
    scratch: Scratch = field(default_factory=Scratch)
    channels_last: bool = True
    folds: dict = field(default_factory=dict)  # layer -> its folded convolution's parameters (see BatchRun.rerun)

    def __post_init__(self):
        p = self.plan
        # the float graph's convolutions (and the local re-runs) on oneDNN, see _quant_dataset_fold.conv2d; the
        # converted graph's too on a batch (see _run), one input as torch runs them: its values, and where they
        # round, stay the single-input report's
        self.fs = Stepper(self.float_gm, p.keep_float, p.float_constants, fold=True, onednn=True)
        self.qs = Stepper(self.quantized, p.keep_quant, p.quant_constants, p.fusable)

    def _measure(self) -> None:
        live = {**self.fs.live_bytes(), **self.qs.live_bytes(), **_storage_bytes([self.scratch.buffer])}
        self.peak_bytes = max(self.peak_bytes, sum(live.values()))

    def run(self, chunk: list[tuple], measure: bool = False) -> tuple[list, dict, list, list]:
        """Both graphs on a batch of inputs, every task measured on the way: (per layer a LayerBatch or None,
        per quantize node a CoverageBatch, float outputs, converted outputs). The first batch of more than one
        input is checked (NotBatchAgnostic): its float outputs' row 0 against a batch-1 run, and every
        layer's values carrying the batch in dim 0. measure: record `peak_bytes`. Images run channels-last
        unless a graph cannot take that layout (a view of a permuted tensor): then contiguous, from then on."""
        if self.channels_last:
            try:
                return self._run(chunk, measure)
            except RuntimeError:
                self.channels_last = False
        return self._run(chunk, measure)

    def _run(self, chunk: list[tuple], measure: bool) -> tuple[list, dict, list, list]:
        # one input at a time stays in the example's layout: it then reproduces the single-input report exactly
        args, batch, plan = stack(chunk, self.channels_last and len(chunk) > 1), len(chunk), self.plan
        # a batch's convolutions round differently from one input's whoever runs them (channels-last, blocked
        # sums): on oneDNN too they move an element across a quantization step here and there, within what
        # batching alone moves (tests/devtools/test_quant_dataset.py), at ~0.7x of torch's choice on one thread
        self.qs.onednn = batch > 1
        if batch > 1 and not self.checked:
            self.fs.start(chunk[0])
            single = graph_outputs(self._finish(self.fs), self.float_gm)
        for s in (self.fs, self.qs):
            s.start(args)
            s.on_step = self._measure if measure else None
        b = BatchRun(plan, self.fs, self.qs, batch, self.scratch, self.folds)
        layers: dict[str, LayerBatch | None] = {}
        coverage: dict[str, CoverageBatch | None] = {}
        for task, release in zip(plan.tasks, plan.release_after):
            for graph, name in task.needs:
                (self.fs if graph == FLOAT else self.qs).advance_to(name)
            if isinstance(task, LayerTask):
                layers[task.join.chain[0].name] = b.layer(task)
            else:
                coverage[task.node] = b.coverage(task)
            for graph, name in release:
                (self.fs if graph == FLOAT else self.qs).values.pop(name, None)
        f_out = graph_outputs(self._finish(self.fs), self.float_gm)
        q_out = graph_outputs(self._finish(self.qs), self.quantized)
        for s in (self.fs, self.qs):
            s.on_step = None
        if batch > 1 and not self.checked:
            if not _agrees(f_out, single):
                raise NotBatchAgnostic("a batched run's outputs differ from one input's")
            self.checked = True
        return [layers.get(j.chain[0].name) for j in plan.joins], coverage, f_out, q_out

    @staticmethod
    def _finish(stepper: Stepper) -> dict:
        stepper.finish()
        values, stepper.values = stepper.values, {}
        return values


def _split_chunk(chunk: list[tuple], parts: int) -> list[tuple[int, list[tuple]]]:
    """(offset, sub-batch) pairs: chunk in `parts` nearly equal contiguous slices (none empty)."""
    parts = max(1, min(parts, len(chunk)))
    bounds = [round(i * len(chunk) / parts) for i in range(parts + 1)]
    return [(bounds[i], chunk[bounds[i]:bounds[i + 1]]) for i in range(parts)]


class Workers:
    """A batch split across `n` engines on threads, each op single-threaded meanwhile: torch's own intra-op
    threads synchronise after every op, which a shared machine turns into waiting (a reduction 10x slower on
    2 threads than on 1 under load), while whole sub-batches on their own threads never wait on each other.
    The first sub-batch runs on the calling thread, the others and the shipped program on the pool's: glibc
    serves another thread's large blocks from its own arena, whose heaps it unmaps once free unless heap_kept's
    top pad keeps them (see heap_kept)."""

    def __init__(self, engines: list[Engine]):
        self.engines = engines
        self.pool = None
        if len(engines) > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(len(engines), thread_name_prefix="quant-report")  # n - 1 + the program

    def run(self, chunk: list[tuple], measure: bool, alongside: Callable[[], Any]) -> tuple[list, Any]:
        """[(offset, size, engine result)] per sub-batch of the chunk, and what `alongside()` returned (run
        meanwhile)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one input on the calling thread too: 2 threads cost ~10x the CPU under load
        try:
            if self.pool is None or len(chunk) == 1:
                return [(0, len(chunk), self.engines[0].run(chunk, measure))], alongside()
            parts = list(zip(self.engines, _split_chunk(chunk, len(self.engines))))
            futures = [(offset, len(part), self.pool.submit(engine.run, part)) for engine, (offset, part) in parts[1:]]
            extra = self.pool.submit(alongside)
            engine, (offset, part) = parts[0]
            here = (offset, len(part), engine.run(part))  # on this thread: glibc's main arena, see the class doc
            return [here, *((offset, size, f.result()) for offset, size, f in futures)], extra.result()
        finally:
            torch.set_num_threads(threads)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
