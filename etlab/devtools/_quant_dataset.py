"""Quantization debugging over a dataset: per-layer error statistics over N inputs, the shipped program's
output metrics, and calibration coverage, streamed in memory that does not grow with N.

`quantization_report(float_model, quantized, dataset=...)` lands here. Per batch of inputs:

- the float graph and the converted (quantized) graph are stepped through side by side in torch
  (`_quant_dataset_engine`): per layer its total, local and inherited error per input, folded into streaming
  statistics (mean, p95, worst input) once the whole batch has run (`_quant_dataset_rows`);
- the program that ships (`backend`: "xnnpack" or "portable", compiled from the converted graph, or a
  `.pte` given) runs each input on etlab's runtime: its outputs against the float model's give top-1
  agreement, cosine, SQNR and the user's metrics; against the converted graph's, how far the shipped
  program is from what the per-layer numbers describe (`program_vs_torch`);
- every static quantize node's range (what calibration chose) is checked against the values that reach
  it: the range seen, the share of elements and of inputs that were clipped.

The batch size follows `memory_budget` (bytes both graphs' live values take at most, measured on the first
input); a batch is split across `workers` threads (see _quant_dataset_engine.Workers); the inputs are read and
checked by _quant_dataset_inputs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch

from etlab.devtools._quant_dataset_engine import Engine, NotBatchAgnostic, Workers
from etlab.devtools._quant_dataset_inputs import dataset_inputs, graph_inputs, has_batch_of_one
from etlab.devtools._quant_dataset_plan import make_plan
from etlab.devtools._quant_dataset_report import (
    COVERAGE_COLUMNS,
    LAYER_COLUMNS,
    PER_INPUT_COLUMNS,
    DatasetQuantReport,
    _pooled_sqnr,
)
from etlab.devtools._quant_dataset_rows import LayerStats, commit_layer, layer_row, metric_functions, output_rows
from etlab.devtools._quant_dataset_run import gc_frozen, heap_kept
from etlab.devtools._quant_debug import QuantReport, _as_inputs, converted_graph, float_graph_of
from etlab.devtools._quant_debug import quantization_report as one_input_report

BACKENDS = ("xnnpack", "portable")
DEFAULT_MEMORY_BUDGET = 512 << 20
MAX_BATCH = 32

__all__ = ["dataset_report", "graph_inputs", "make_plan", "quantization_report"]


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
    torch.get_num_threads(); each runs single-threaded ops, see Workers)."""
    from tqdm.auto import tqdm

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if not isinstance(memory_budget, int) or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    metric_fns = metric_functions(metrics)
    quantized = converted_graph(quantized)
    example, stream, total = dataset_inputs(dataset, _as_inputs(inputs) if inputs is not None else None, limit,
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
    layers = [LayerStats(j) for j in plan.joins]
    rows: list[dict] = []
    energy = np.zeros(2)  # the outputs' signal and noise over the dataset
    pool = Workers([Engine(float_gm, quantized, plan) for _ in range(workers or torch.get_num_threads())])
    bar = tqdm(total=total, unit="input", desc="quantization report", disable=not progress, leave=False)
    size, first = 1, 0
    with heap_kept(), gc_frozen():  # see heap_kept (without it, page faults cost more than the ops), gc_frozen
        try:
            pending = list(itertools.islice(stream, 1))
            while pending:
                chunk = pending
                sizing = first == 0 and has_batch_of_one(example)
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
                            commit_layer(acc, m, start, batch)
                    for name, m in coverage_batches.items():
                        if m is not None:
                            plan.quantizers[name].commit(m, start)
                    sub_p = p_out[offset:offset + batch] if p_out is not None else None
                    for r in output_rows(f_out, q_out, sub_p, start, batch, metric_fns):
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
    layer_rows = [layer_row(i, acc, plan) for i, acc in enumerate(layers) if acc.inputs]
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
