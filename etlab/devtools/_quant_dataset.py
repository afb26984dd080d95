"""Quantization debugging over a dataset: per-layer error statistics over N inputs, the shipped program's
output metrics, and calibration coverage, streamed in memory that does not grow with N.

`quantization_report(float_model, quantized, dataset=...)` lands here. Per batch of inputs:

- the float graph and the converted (quantized) graph are stepped through side by side in torch
  (`_quant_dataset_plan`, `_quant_dataset_run.Stepper`): as soon as both graphs have computed a layer,
  its total error, local error (its float op re-run on the quantized inputs, for the whole batch at once)
  and inherited error (its inputs' SQNR) are measured per input (`_quant_dataset_stats.batch_metrics`),
  and each value is freed once the last measurement that reads it is done; a batch's numbers are folded
  into streaming statistics (mean, p95, worst input) once the whole batch has run;
- the program that ships (`backend`: "xnnpack" or "portable", compiled from the converted graph, or a
  `.pte` given) runs each input on etlab's runtime: its outputs against the float model's give top-1
  agreement, cosine, SQNR and the user's metrics; against the converted graph's, how far the shipped
  program is from what the per-layer numbers describe (`program_vs_torch`);
- every static quantize node's range (what calibration chose) is checked against the values that reach
  it: the range seen, the share of elements and of inputs that were clipped.

Batches: the exported graphs are specialised to the example's batch of 1, but most are batch-agnostic
(convolutions, linears, pools). The first batch is checked against a batch-1 run (every kept value has
the batch in dim 0, the outputs agree); a graph that is not batch-agnostic runs one input at a time.
The batch size follows `memory_budget` (bytes both graphs' live values take at most, measured on the first
input); a batch is split across `workers` threads (see _Workers).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.fx import GraphModule, Node

from etlab.devtools._quant_dataset_plan import FLOAT, QUANT, CoverageTask, LayerTask, _Plan, make_plan, output_nodes
from etlab.devtools._quant_dataset_report import (
    COVERAGE_COLUMNS,
    LAYER_COLUMNS,
    P95,
    PER_INPUT_COLUMNS,
    DatasetQuantReport,
    _pooled_sqnr,
)
from etlab.devtools._quant_dataset_run import Stepper, _storage_bytes
from etlab.devtools._quant_dataset_stats import (
    CoverageBatch,
    Scratch,
    Stream,
    batch_metrics,
    max_abs_stream,
    raw_ranges,
    sqnr_stream,
)
from etlab.devtools._quant_debug import (
    LayerJoin,
    QuantReport,
    _as_inputs,
    converted_graph,
    float_graph_of,
    rerun_float,
)
from etlab.devtools._quant_debug import quantization_report as one_input_report
from etlab.errors import Error
from etlab.facts.fx import node_op_name
from etlab.facts.source import module_path, source_line

BACKENDS = ("xnnpack", "portable")
DEFAULT_MEMORY_BUDGET = 512 << 20
MAX_BATCH = 32

# --- running the graphs on a batch -------------------------------------------------------------------


def _float(x) -> torch.Tensor | None:
    return x if isinstance(x, torch.Tensor) and x.is_floating_point() else None


# --- the dataset --------------------------------------------------------------------------------------


def _split(item: tuple, example: tuple) -> list[tuple]:
    """An item of the dataset as inputs of the program: itself, or, when its tensors carry k times the
    example's batch of 1 in dim 0 (a DataLoader's batch), its k rows."""
    first = item[0] if item and isinstance(item[0], torch.Tensor) else None
    ex = example[0] if example and isinstance(example[0], torch.Tensor) else None
    if first is None or ex is None or ex.dim() == 0 or ex.shape[0] != 1 or first.dim() != ex.dim() \
            or first.shape[0] == 1 or first.shape[1:] != ex.shape[1:]:
        return [item]
    k = first.shape[0]
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == k for t in item):
        return [item]
    return [tuple(t[i:i + 1] for t in item) for i in range(k)]


def _check(item: tuple, example: tuple, index: int) -> tuple:
    if len(item) != len(example):
        raise ValueError(f"dataset item {index}: {len(item)} input(s), the model takes {len(example)}")
    for k, (x, e) in enumerate(zip(item, example)):
        if isinstance(e, torch.Tensor):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"dataset item {index}: input {k} is a {type(x).__name__}, not a tensor")
            if x.shape != e.shape or x.dtype != e.dtype:
                raise ValueError(f"dataset item {index}: input {k} is {x.dtype} {list(x.shape)}, the program takes "
                                 f"{e.dtype} {list(e.shape)} (one shape: the program is compiled for it)")
    return item


def graph_inputs(gm: GraphModule) -> tuple | None:
    """The (fake) tensors a converted graph was exported with, one per user input: the shapes the program
    takes; None when a placeholder has no static tensor value recorded."""
    vals = tuple(n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder")
    if not vals or not all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals):
        return None
    return vals


def _inputs_of(dataset, example: tuple | None, limit: int | None, shapes: tuple | None = None):
    """(example, iterator of checked single inputs, total count or None). shapes: what one input looks like
    (the program's inputs; default the example, else the first item)."""
    if isinstance(dataset, (torch.Tensor, str, bytes)) or not isinstance(dataset, Iterable):
        raise TypeError(f"dataset must be an iterable of the model's inputs (tensors or tuples of tensors), "
                        f"got {type(dataset).__name__}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    total = None
    try:
        total = len(dataset)
    except TypeError:
        pass
    it = iter(dataset)
    try:
        head = _as_inputs(next(it))
    except StopIteration:
        raise ValueError("dataset is empty: a report over a dataset needs at least one input") from None
    ref = shapes if shapes is not None else example if example is not None else head
    first = _split(head, ref)
    example = first[0] if example is None else example
    if total is not None and len(first) > 1:
        total *= len(first)

    def stream():
        n = 0
        for item in itertools.chain([head], it):
            for x in _split(_as_inputs(item), ref):
                if limit is not None and n >= limit:
                    return
                yield _check(x, ref, n)
                n += 1

    if limit is not None:
        total = limit if total is None else min(total, limit)
    return example, stream(), total


def _batched(stream, size: int):
    while True:
        chunk = list(itertools.islice(stream, size))
        if not chunk:
            return
        yield chunk


def _stack(chunk: list[tuple], channels_last: bool = False) -> tuple:
    """A batch of inputs as the graphs' arguments; channels_last: 4-D float images laid out channels-last
    (oneDNN's convolutions run ~1.5x faster on it, and every later activation keeps it)."""
    def arg(k: int):
        x = chunk[0][k]
        if not isinstance(x, torch.Tensor):
            return x
        x = torch.cat([c[k] for c in chunk])
        if channels_last and x.dim() == 4 and x.is_floating_point():
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    return tuple(arg(k) for k in range(len(chunk[0])))


# --- per-layer and per-output accumulation -------------------------------------------------------------


@dataclass
class _Layer:
    join: LayerJoin
    sqnr: Stream = field(default_factory=sqnr_stream)
    local: Stream = field(default_factory=sqnr_stream)
    inherited: Stream = field(default_factory=sqnr_stream)
    max_abs: Stream = field(default_factory=max_abs_stream)
    cosine_total: float = 0.0
    cosine_n: int = 0
    cosine_min: float = math.inf
    inputs: int = 0
    degenerate: int = 0
    exact: int = 0


class NotBatchAgnostic(Error):
    """A graph gave a value without the batch in dim 0: it runs one input at a time (caught here)."""


@dataclass
class _LayerBatch:
    """One layer's numbers for one batch, committed to its streams once the whole batch has run."""

    total: dict
    local: dict | None
    inherited: np.ndarray | None
    ok: np.ndarray


class _Batch:
    """Both graphs stepped through one batch (see _quant_dataset_plan): per task the measurement, then the
    outputs. Values are read from the steppers by node name; `sqnr_of` (float node, converted graph's value)
    -> SQNR per input lets a layer reuse the total error measured where its input was computed, `ranges` the
    float values' raw per-input extremes (a layer's degenerate check and its output quantizer's coverage)."""

    def __init__(self, plan: _Plan, fs: Stepper, qs: Stepper, batch: int, scratch: Scratch):
        self.plan, self.fs, self.qs, self.batch = plan, fs, qs, batch
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

    def _check_batch(self, name: str, v) -> None:
        if self.batch > 1 and _float(v) is not None and (v.dim() == 0 or v.shape[0] != self.batch):
            raise NotBatchAgnostic(f"{name} has shape {list(v.shape)} on a batch of {self.batch}")

    def layer(self, task: LayerTask) -> _LayerBatch | None:
        j, batch = task.join, self.batch
        end = j.chain[-1]
        ref, val = self.fs.values.get(end.name), self.qs.values.get(j.qvalue_node.name)
        self._check_batch(end.name, ref)
        self._check_batch(j.qvalue_node.name, val)
        ref, val = _float(ref), _float(val)
        if ref is None or val is None or ref.shape != val.shape:
            return None
        feeds = {name: self.value(src) for name, src in task.feeds.items()}
        total = batch_metrics(ref, val, batch, scratch=self.scratch)
        self.sqnr_of[(end.name, self.canonical((QUANT, j.qvalue_node.name))[1])] = total["sqnr"]
        local = None
        if task.local:
            reads = {name: self.fs.values[name] for name in task.reads}
            local_ref = _float(rerun_float(j.chain, feeds, reads))
            if local_ref is not None and local_ref.shape == val.shape:
                local = batch_metrics(local_ref, val, batch, value_norm=total["b_norm"], extremes=False,
                                      scratch=self.scratch)
            del local_ref
        inherited = []
        for name, src in task.feeds.items():
            v, ref_in = _float(feeds[name]), _float(self.fs.values.get(name))
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
        return _LayerBatch(total, local, np.minimum.reduce(inherited) if inherited else None, ok)

    def coverage(self, task: CoverageTask) -> CoverageBatch | None:
        # the float model's value where there is one: what calibration observed, so the dataset is compared
        # with the calibration data, not with requantization noise (up to a step or so)
        x = _float(self.value(task.source))
        if x is None:
            return None
        raw = self.float_ranges(task.source[1], x) if task.source[0] == FLOAT else None
        return self.plan.quantizers[task.node].measure(x, self.batch, raw)


def _commit_layer(acc: _Layer, m: _LayerBatch, first: int, batch: int) -> None:
    rows, ok, total, local = np.arange(first, first + batch), m.ok, m.total, m.local
    acc.inputs += batch
    acc.degenerate += int((~ok).sum())
    acc.exact += int(((local if local is not None else total)["sqnr"] == math.inf).sum())
    acc.sqnr.add(total["sqnr"][ok], rows[ok])
    acc.max_abs.add(total["max_abs"], rows)
    if local is not None:
        acc.local.add(local["sqnr"][ok], rows[ok])
    if m.inherited is not None:
        acc.inherited.add(m.inherited[ok], rows[ok])
    cos = total["cosine"][~np.isnan(total["cosine"])]
    acc.cosine_total += float(cos.sum())
    acc.cosine_n += cos.size
    acc.cosine_min = min(acc.cosine_min, float(cos.min()) if cos.size else math.inf)


def top1_agreement(reference: torch.Tensor, value: torch.Tensor, batch: int) -> np.ndarray:
    """Per input (dim 0), the share of positions whose arg-max over the last dimension agrees (a classifier's
    top-1; a sequence model's per token); NaN for outputs with fewer than 2 classes."""
    if reference.dim() < (2 if batch > 1 else 1) or reference.shape[-1] < 2:
        return np.full(batch, math.nan)
    same = (reference.argmax(-1) == value.argmax(-1)).reshape(batch, -1).to(torch.float64)
    return same.mean(1).numpy()


def _metric_functions(metrics) -> dict[str, Callable]:
    if metrics is None:
        return {}
    if callable(metrics):
        return {getattr(metrics, "__name__", "metric") or "metric": metrics}
    if isinstance(metrics, Mapping) and all(isinstance(k, str) and callable(v) for k, v in metrics.items()):
        return dict(metrics)
    raise TypeError("metrics must be a callable (float_outputs, quantized_outputs) -> float, or a dict of them "
                    f"by name; got {type(metrics).__name__}")


def _output_rows(f_out: list, q_out: list, p_out: list[list] | None, first: int, batch: int,
                 metrics: dict[str, Callable]) -> list[dict]:
    """Per input: output SQNR/cosine (worst over the outputs), top-1 agreement with the float model, the
    shipped program's distance to the converted graph, and the user's metrics; all on the shipped program's
    outputs when there is one (`p_out`, one list per input), else on the converted graph's."""
    def row(outs: list, i: int) -> list:  # input i's outputs, as the model returns them for one input
        return outs if batch == 1 else [o[i:i + 1] if isinstance(o, torch.Tensor) else o for o in outs]

    shipped = q_out if p_out is None else p_out[0] if batch == 1 else [
        torch.cat([r[k] for r in p_out]) if isinstance(p_out[0][k], torch.Tensor) else p_out[0][k]
        for k in range(len(p_out[0]))]
    sqnr, cosine, top1, vs_torch, energy = [], [], [], [], np.zeros((2, batch))
    for k, (ref, val) in enumerate(zip(f_out, shipped)):
        if _float(ref) is None or _float(val) is None or ref.shape != val.shape:
            continue
        m = batch_metrics(ref, val, batch)
        sqnr.append(m["sqnr"])
        energy += np.nan_to_num(np.stack([m["signal"], m["noise"]]), nan=0.0, posinf=np.inf)
        cosine.append(m["cosine"])
        top1.append(top1_agreement(ref, val, batch))
        if p_out is not None and _float(q_out[k]) is not None and q_out[k].shape == val.shape:
            vs_torch.append((val.double() - q_out[k].double()).abs().reshape(batch, -1).amax(1).numpy())
    rows = []
    for i in range(batch):
        t1 = [t[i] for t in top1 if not math.isnan(t[i])]
        out = {"input": first + i, "output_sqnr": min((s[i] for s in sqnr), default=math.nan),
               "output_cosine": min((c[i] for c in cosine), default=math.nan),
               "top1_agree": float(np.mean(t1)) if t1 else math.nan,
               "program_vs_torch": max((v[i] for v in vs_torch), default=math.nan),
               "_energy": energy[:, i]}
        if metrics:
            ref_i, val_i = row(f_out, i), p_out[i] if p_out is not None else row(q_out, i)
            for name, fn in metrics.items():
                out[name] = float(fn(ref_i, val_i))
        rows.append(out)
    return rows


def _layer_row(order: int, acc: _Layer, plan: _Plan) -> dict:
    j = acc.join
    first = j.chain[0]
    exact = acc.exact == acc.inputs
    qname = plan.quantizer_of.get(first.name)
    cov = plan.quantizers[qname].row() if qname else {}
    return {
        "order": order, "layer": first.name, "op": node_op_name(first),
        "module": module_path(first.meta.get("nn_module_stack")), "source": source_line(first.meta.get("stack_trace")),
        "quantized": j.quantized, "ranked": j.quantized and not exact and acc.degenerate < acc.inputs,
        "inputs": acc.inputs, "degenerate_inputs": acc.degenerate,
        "local_sqnr_p95": acc.local.quantile(P95), "local_sqnr_mean": acc.local.mean, "local_sqnr_min": acc.local.low,
        "local_worst_input": acc.local.low_input,
        "sqnr_p95": acc.sqnr.quantile(P95), "sqnr_mean": acc.sqnr.mean, "sqnr_min": acc.sqnr.low,
        "sqnr_worst_input": acc.sqnr.low_input,
        "input_sqnr_p95": acc.inherited.quantile(P95), "input_sqnr_mean": acc.inherited.mean,
        "cosine_mean": acc.cosine_total / acc.cosine_n if acc.cosine_n else math.nan,
        "cosine_min": acc.cosine_min if acc.cosine_n else math.nan,
        "max_abs_p95": acc.max_abs.quantile(0.95), "max_abs_max": acc.max_abs.high,
        "max_abs_worst_input": acc.max_abs.high_input,
        **{k: cov.get(k, math.nan) for k in ("range_lo", "range_hi", "seen_min", "seen_max", "clipped",
                                             "clipped_inputs", "range_used")},
        "first_clipped_input": cov.get("first_clipped_input", -1),
        "folded": [n.name for n in j.chain[1:]], "quantized_node": j.qnode.name,
    }


# --- the loop -------------------------------------------------------------------------------------------


def _outputs(values: dict, gm: GraphModule) -> list:
    return [values.get(a.name) if isinstance(a, Node) else a for a in output_nodes(gm)]


def _agrees(batched: list, single: list) -> bool:
    """Row 0 of a batched run's outputs against a batch-1 run of the same input."""
    for b, s in zip(batched, single):
        if _float(s) is None:
            continue
        if _float(b) is None or b.shape[1:] != s.shape[1:] or b.shape[0] < 1:
            return False
        scale = float(s.abs().max()) if s.numel() else 0.0
        if not torch.allclose(b[:1], s, rtol=1e-4, atol=1e-5 * max(scale, 1.0), equal_nan=True):
            return False
    return True


def _has_batch_of_one(example: tuple) -> bool:
    """Inputs that can be stacked into a batch: every tensor has dim 0 of size 1."""
    tensors = [x for x in example if isinstance(x, torch.Tensor)]
    return bool(tensors) and all(x.dim() and x.shape[0] == 1 for x in tensors)


@dataclass
class _Engine:
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

    def __post_init__(self):
        p = self.plan
        self.fs = Stepper(self.float_gm, p.keep_float, p.float_constants)
        self.qs = Stepper(self.quantized, p.keep_quant, p.quant_constants, p.fusable)

    def _measure(self) -> None:
        live = {**self.fs.live_bytes(), **self.qs.live_bytes(), **_storage_bytes([self.scratch.buffer])}
        self.peak_bytes = max(self.peak_bytes, sum(live.values()))

    def run(self, chunk: list[tuple], measure: bool = False) -> tuple[list, dict, list, list]:
        """Both graphs on a batch of inputs, every task measured on the way: (per layer a _LayerBatch or None,
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
        args, batch, plan = _stack(chunk, self.channels_last and len(chunk) > 1), len(chunk), self.plan
        if batch > 1 and not self.checked:
            self.fs.start(chunk[0])
            single = _outputs(self._finish(self.fs), self.float_gm)
        for s in (self.fs, self.qs):
            s.start(args)
            s.on_step = self._measure if measure else None
        b = _Batch(plan, self.fs, self.qs, batch, self.scratch)
        layers: dict[str, _LayerBatch | None] = {}
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
        f_out, q_out = _outputs(self._finish(self.fs), self.float_gm), _outputs(self._finish(self.qs), self.quantized)
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


class _Workers:
    """A batch split across `n` engines on threads, each op single-threaded meanwhile: torch's own intra-op
    threads synchronise after every op, which a shared machine turns into waiting (a reduction 10x slower on
    2 threads than on 1 under load), while whole sub-batches on their own threads never wait on each other.
    The shipped program runs on the calling thread at the same time."""

    def __init__(self, engines: list[_Engine]):
        self.engines = engines
        self.pool = None
        if len(engines) > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(len(engines), thread_name_prefix="quant-report")

    def run(self, chunk: list[tuple], measure: bool, alongside: Callable[[], Any]) -> tuple[list, Any]:
        """[(offset, size, engine result)] per sub-batch of the chunk, and what `alongside()` returned (run
        meanwhile)."""
        if self.pool is None or len(chunk) == 1:
            return [(0, len(chunk), self.engines[0].run(chunk, measure))], alongside()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            futures = [(offset, len(part), self.pool.submit(engine.run, part))
                       for engine, (offset, part) in zip(self.engines, _split_chunk(chunk, len(self.engines)))]
            extra = alongside()
            return [(offset, size, f.result()) for offset, size, f in futures], extra
        finally:
            torch.set_num_threads(threads)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def dataset_report(float_model, quantized, dataset: Iterable, *, inputs=None, backend: str | None = "xnnpack",
                   program=None, metrics=None, batch_size: int | None = None,
                   memory_budget: int = DEFAULT_MEMORY_BUDGET, limit: int | None = None, progress: bool = True,
                   label: str = "", workers: int | None = None) -> DatasetQuantReport:
    """Per-layer quantization error of `quantized` (convert_pt2e's GraphModule) against `float_model` over
    every input of `dataset` (an iterable of the model's inputs: tensors or tuples; a DataLoader's batches are
    split into single inputs), with the output metrics of the program that ships. See DatasetQuantReport.

    backend: "xnnpack" or "portable": the converted graph compiled for it and run on etlab's runtime for
    every input (None: no program, output metrics from the converted graph in torch). program: an already
    compiled `.pte` (path, bytes or ExecutorchProgramManager) to run instead. metrics: a callable
    (float_outputs, quantized_outputs) -> float per input, or a dict of them by name. inputs: the example
    the float model is exported with (default: the first input). batch_size: inputs per batch of the torch
    passes (default: as many as `memory_budget` bytes of live values allow, at most 32 per worker). limit: stop after
    this many inputs. progress: a progress bar (tqdm). workers: threads a batch is split across (default
    torch.get_num_threads(); each runs single-threaded ops, see _Workers)."""
    from tqdm.auto import tqdm

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if not isinstance(memory_budget, int) or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    metric_fns = _metric_functions(metrics)
    quantized = converted_graph(quantized)
    example, stream, total = _inputs_of(dataset, _as_inputs(inputs) if inputs is not None else None, limit,
                                        graph_inputs(quantized))
    started = time.perf_counter()
    float_gm = float_graph_of(float_model, example)
    plan = make_plan(float_gm, quantized)
    notes: list[str] = []
    method, what = None, ""
    if program is not None or backend is not None:
        from etlab.devtools._quant_debug_runtime import shipped_method

        method, what = shipped_method(quantized, example, backend, program)
        notes.append(f"outputs of {what} on etlab's runtime; per-layer values from the converted graph in torch "
                     "(program_vs_torch: how far the program's outputs are from it)")
    layers = [_Layer(j) for j in plan.joins]
    rows: list[dict] = []
    energy = np.zeros(2)  # the outputs' signal and noise over the dataset
    pool = _Workers([_Engine(float_gm, quantized, plan) for _ in range(workers or torch.get_num_threads())])
    bar = tqdm(total=total, unit="input", desc="quantization report", disable=not progress, leave=False)
    size, first = 1, 0
    try:
        pending = list(itertools.islice(stream, 1))
        while pending:
            chunk = pending
            sizing = first == 0 and _has_batch_of_one(example)
            try:
                parts, p_out = pool.run(chunk, sizing, lambda c=chunk: [method.execute(list(x)) for x in c]
                                        if method is not None else None)
            except (NotBatchAgnostic, RuntimeError) as e:
                if len(chunk) == 1:
                    raise
                notes.append(f"one input at a time: the graphs are not batch-agnostic ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:120] if str(e) else ''})")
                size, stream, pending = 1, itertools.chain(chunk[1:], stream), chunk[:1]
                pool.engines = pool.engines[:1]
                continue
            for offset, batch, (layer_batches, coverage_batches, f_out, q_out) in parts:
                start = first + offset
                for acc, m in zip(layers, layer_batches):
                    if m is not None:
                        _commit_layer(acc, m, start, batch)
                for name, m in coverage_batches.items():
                    if m is not None:
                        plan.quantizers[name].commit(m, start)
                sub_p = p_out[offset:offset + batch] if p_out is not None else None
                for r in _output_rows(f_out, q_out, sub_p, start, batch, metric_fns):
                    energy += r.pop("_energy")
                    rows.append(r)
            bar.update(len(chunk))
            if sizing:  # sized from the first input's peak memory
                per_input = max(pool.engines[0].peak_bytes, 1)
                size = batch_size or max(1, min(MAX_BATCH * len(pool.engines), memory_budget // per_input))
            first += len(chunk)
            pending = list(itertools.islice(stream, size))
    finally:
        bar.close()
        pool.close()
    if not rows:
        raise ValueError("dataset is empty: a report over a dataset needs at least one input")
    layer_rows = [_layer_row(i, acc, plan) for i, acc in enumerate(layers) if acc.inputs]
    by_layer = {acc.join.chain[0].name: acc for acc in layers}
    layer_of_quantizer = {q: layer for layer, q in plan.quantizer_of.items()}
    coverage = [{"node": name, "layer": layer_of_quantizer.get(name, plan.quant_inputs[name]), "scale": cov.scale,
                 "zero_point": cov.zero_point, **cov.row()} for name, cov in plan.quantizers.items() if cov.inputs]
    return DatasetQuantReport(
        layers=pd.DataFrame(layer_rows, columns=LAYER_COLUMNS),
        per_input=pd.DataFrame(rows, columns=[*PER_INPUT_COLUMNS, *metric_fns]),
        coverage=pd.DataFrame(coverage, columns=COVERAGE_COLUMNS),
        distributions={name: {"local_sqnr": acc.local, "sqnr": acc.sqnr, "input_sqnr": acc.inherited,
                              "max_abs": acc.max_abs} for name, acc in by_layer.items() if acc.inputs},
        backend=backend if program is None else None, batch_size=size, seconds=time.perf_counter() - started,
        float_graph=float_gm, quantized_graph=quantized, label=label, notes=notes,
        shipped=what, output_sqnr_pooled=_pooled_sqnr(*energy))


def quantization_report(float_model, quantized, inputs=None, *, runtime: bool = False, label: str = "",
                        dataset: Iterable | None = None, **dataset_options) -> QuantReport | DatasetQuantReport:
    """Per-layer error of `quantized` (convert_pt2e's GraphModule, or an ExportedProgram of it) against
    `float_model` (the nn.Module, its ExportedProgram or the GraphModule it was quantized from).

    On `inputs` (one example): a QuantReport, total and local error per layer (runtime=True: the quantized
    values from etlab's runtime; see etlab.devtools._quant_debug.quantization_report).

    On `dataset=` (an iterable of inputs): a DatasetQuantReport, statistics over all of them streamed in
    bounded memory (mean and p95 SQNR per layer, local vs inherited, the shipped program's top-1 agreement and
    cosine, calibration coverage); `dataset_options` are `dataset_report`'s: backend ("xnnpack" default,
    "portable"; runtime=True alone means "portable"), program, metrics, batch_size, memory_budget, limit,
    progress. `inputs` is then the export example (default: the first input)."""
    if dataset is not None:
        if runtime:
            dataset_options.setdefault("backend", "portable")
        return dataset_report(float_model, quantized, dataset, inputs=inputs, label=label, **dataset_options)
    if dataset_options:
        raise TypeError(f"quantization_report: {sorted(dataset_options)} apply to a report over a dataset "
                        "(give dataset=...)")
    if inputs is None:
        raise TypeError("quantization_report: give the inputs (one example) or dataset=... (many)")
    return one_input_report(float_model, quantized, inputs, runtime=runtime, label=label)
