"""`auto_mixed_precision`: the quantization that meets an accuracy budget over a dataset with the fewest
layers left in float, found by search, measured on etlab's runtime, with every choice explained.

    from etlab.devtools import auto_mixed_precision
    result = auto_mixed_precision(model, dataset, budget="top1>=0.99", backend="xnnpack")
    result.steps          # the search's path: what was tried, the metric, whether it was kept and why
    result.layers         # per layer: float / int16 activations / int8, weights per channel or tensor, observer
    result.program        # the compiled ExecutorchProgramManager (result.program.buffer: the .pte)
    result.quantizer()    # a fresh PT2E quantizer with the chosen configuration (prepare_pt2e(gm, it))

What it can change (`_amp_config`): per activation value the observer (min-max, histogram, percentile
99.99 / 99.9); per layer per-channel instead of per-tensor weights, 16-bit activations (portable backend
only: etlab's quantize/dequantize kernels take int16, XNNPACK's activations are int8 or uint8, so an
int16 value would leave the delegate), or float. Observers run once over the calibration data; each
configuration then uses the ranges they computed (no histogram search per configuration).

The search, each configuration measured by quantizing (prepare, calibrate, convert) and running the
converted model on the dataset in torch (the evaluator: `_amp_search`; steps 1-5: `_amp_phases`; steps 6-7
and the result: here):
1. all int8 as the quantizer says; met: done.
2. observers (zero cost at run time): each value's lowest-MSE grid; values an outlier stretches,
   clipped one at a time; one observer for every value. Judged by the budget's metric.
3. sensitivity: every candidate layer (the `max_candidates` that introduce the most error over the
   dataset, by `quantization_report`'s local SQNR) kept in float alone; ranked by the metric that buys.
4. the shortest prefix of that ranking that meets the budget (doubling, then bisection).
5. pruning: each float layer, least useful first, quantized again if the budget still holds; then the
   cheaper fixes for the rest, cheapest first: another observer for its values, per-channel weights,
   16-bit output activations; repeated until nothing changes.
6. cost: the configurations found with as few float layers that also meet the budget (up to
   MAX_COST_CANDIDATES) compiled for `backend` and timed on etlab's runtime; the cheapest in latency
   and .pte size is kept.
7. the program runs on etlab's runtime over the whole dataset and the budget is checked there; when it
   misses what torch met (XNNPACK's integer kernels round differently), the search runs again (its
   evaluations cached) for a target stricter by 1.5x the gap (RUNTIME_ROUNDS in all). Its .pte size and
   latency are measured next to the all-int8 and float programs.

The greedy baseline (`greedy_float_baseline`) is the manual loop `sensitivity_table` tabulates: rank
layers by local SQNR on one input, keep the worst k in float, k = 0, 1, 2, ... until met.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

import pandas as pd

from etlab.devtools._amp_budget import AccuracyBudget, as_budget, dataset_sqnr
from etlab.devtools._amp_config import (
    PrecisionConfig,
    choose_observers,
    configured_quantizer,
    layer_of_node,
    probe,
)
from etlab.devtools._amp_phases import _run_search, _stricter, _weight_numel
from etlab.devtools._amp_result import MixedPrecisionResult
from etlab.devtools._amp_runtime import compile_program, runtime_latency_ms, runtime_outputs
from etlab.devtools._amp_search import _Eval, _samples, _Search
from etlab.devtools._quant_debug import float_graph_of, quantization_report

BACKENDS = ("xnnpack", "portable")
RUNTIME_ROUNDS = 3  # searches run when the runtime misses what torch met (each with a stricter target)
MAX_COST_CANDIDATES = 4  # configurations as good by float-layer count, compiled and timed to pick the cheapest
OBSERVERS = ("minmax", "histogram", "percentile", "percentile_99.9")
STEP_COLUMNS = ["step", "phase", "change", "layers", "metric", "sqnr_db", "met", "float_layers", "kept", "why"]
LAYER_COLUMNS = ["layer", "op", "module", "precision", "weights", "activation", "observer", "alone_in_float",
                 "why"]


# --- the search -------------------------------------------------------------------------------------


def auto_mixed_precision(float_model, dataset, *, budget, quantizer_factory: Callable[[], object] | None = None,
                         backend: str = "xnnpack", calibration=None, max_calibration: int = 32,
                         observers: Sequence[str] = OBSERVERS, max_candidates: int = 24,
                         allow_int16: bool | None = None,
                         latency_runs: int = 10, measure_cost: bool = True,
                         progress: bool | Callable[[str], None] = False) -> MixedPrecisionResult:
    """Quantizes `float_model` (an nn.Module, ExportedProgram or the exported GraphModule) so that the
    program meets `budget` over `dataset` with the fewest layers left in float (see the module docstring).

    dataset: an iterable of inputs (a tensor or a tuple per sample), read once into memory; the budget
    is measured on all of it. budget: 'top1>=0.99', 'cosine>=0.999', 'sqnr>=30dB', ... or a `AccuracyBudget`.
    quantizer_factory: makes a fresh PT2E quantizer (default EtlabQuantizer). backend: 'xnnpack'
    (the program lowered with XnnpackPartitioner) or 'portable'. calibration: samples for the observers
    (default: the first `max_calibration` of the dataset). allow_int16: 16-bit activations as a fix
    (default: on for portable; XNNPACK has no int16 activations, so True there is an error).
    progress: True prints each step to stderr; a callable receives each line."""
    if backend not in BACKENDS:
        raise ValueError(f"auto_mixed_precision: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if allow_int16 is None:
        allow_int16 = backend == "portable"
    if allow_int16 and backend == "xnnpack":
        raise ValueError("auto_mixed_precision: XNNPACK's quantized activations are int8 or uint8; 16-bit "
                         "activations would leave the delegate. Use backend='portable' or allow_int16=False")
    unknown = [o for o in observers if o not in OBSERVERS]
    if unknown or not observers:
        raise ValueError(f"auto_mixed_precision: observers must be a non-empty subset of {', '.join(OBSERVERS)}, "
                         f"got {list(observers)!r}")
    if not isinstance(max_candidates, int) or max_candidates < 1:
        raise ValueError(f"auto_mixed_precision: max_candidates must be a positive int, got {max_candidates!r}")
    budget = as_budget(budget)
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if progress is True else (progress or None)
    samples = _samples(dataset, "dataset")
    calib = _samples(calibration, "calibration") if calibration is not None else samples[:max_calibration]
    if quantizer_factory is None:
        from etlab.compiler import EtlabQuantizer

        quantizer_factory = EtlabQuantizer
    if not callable(quantizer_factory):
        raise TypeError("auto_mixed_precision: quantizer_factory must be a callable returning a fresh PT2E quantizer "
                        f"(e.g. EtlabQuantizer), got {type(quantizer_factory).__name__}")
    float_gm = float_graph_of(float_model, samples[0])
    probe_ = probe(float_gm, quantizer_factory())
    chosen, mse, ranges = choose_observers(probe_, calib, list(observers), say)
    search = _Search(float_gm, probe_, quantizer_factory, budget, samples, calib, ranges, say)
    search.max_candidates = max_candidates
    for attempt in range(RUNTIME_ROUNDS):
        best = _run_search(search, chosen, mse, allow_int16, max_candidates)
        best, program, outputs, metric = _on_runtime(search, best, backend, latency_runs if measure_cost else 0)
        if budget.met(metric) or not best.met or attempt == RUNTIME_ROUNDS - 1:
            break
        # the runtime's kernels (XNNPACK's integer arithmetic) land further from float than torch's run of
        # the converted model: search again for a target that much stricter
        gap = search.budget.margin(best.metric) - budget.margin(metric)
        search.retarget(_stricter(budget, search.budget, gap))
    return _finish(search, best, program, outputs, metric, backend, latency_runs, measure_cost, list(observers))



def _cheapest(search: _Search, best: _Eval, backend: str, latency_runs: int, limit: int = MAX_COST_CANDIDATES):
    """Among the configurations the search found that meet the budget with as few float layers (and no
    more 16-bit values), the one whose program costs least on etlab's runtime: each compiled, its
    latency measured (median of `latency_runs`) and its .pte size read; the lowest sum of latency and
    size, each relative to the smallest seen, wins. Returns (evaluation, compiled program)."""
    sample = search.samples[0]
    n_float, n_int16 = len(best.config.float_layers), len(best.config.int16)
    alternatives = [ev for ev in search.cache.values() if ev.met and ev is not best
                    and len(ev.config.float_layers) == n_float and len(ev.config.int16) <= n_int16]
    if not alternatives or latency_runs <= 0:
        return best, compile_program(search.model(best), sample, backend)
    alternatives.sort(key=lambda ev: (_weight_numel(search, ev.config), -search.budget.margin(ev.metric)))
    measured = []
    for ev in [best, *alternatives[:limit - 1]]:
        program = compile_program(search.model(ev), sample, backend)
        measured.append((ev, program, runtime_latency_ms(program.buffer, sample, latency_runs), len(program.buffer)))
    fastest, smallest = min(m[2] for m in measured), min(m[3] for m in measured)
    scores = [m[2] / fastest + m[3] / smallest for m in measured]
    chosen = min(range(len(measured)), key=lambda i: (scores[i], i))
    for i, (ev, _program, ms, nbytes) in enumerate(measured):
        search.step("cost", "compiled and timed on etlab's runtime", sorted(ev.config.float_layers), ev, i == chosen,
                    f"{nbytes / 1024:.1f} KB, {ms:.3f} ms; " + ("the cheapest that meets the budget with "
                    f"{n_float} float layer(s)" if i == chosen else "costs more"))
    return measured[chosen][0], measured[chosen][1]


def _on_runtime(search: _Search, best: _Eval, backend: str, latency_runs: int):
    """The cheapest configuration (`_cheapest`) compiled and run on etlab's runtime over the dataset:
    (evaluation, program, outputs, the user's budget metric on them); recorded as a step."""
    goal = search.goal
    best, program = _cheapest(search, best, backend, latency_runs)
    outputs = runtime_outputs(program.buffer, search.samples)
    metric = goal.measure(search.reference, outputs)
    met = goal.met(metric)
    if met:
        why = "budget met"
    elif best.met:
        why = (f"budget MISSED on the runtime (torch: {best.metric:.4g}): its kernels differ from torch's run of the "
               "converted model" + ("; searching again for a stricter target" if search.rounds + 1 < RUNTIME_ROUNDS
                                    else ""))
    else:
        why = "budget missed"
    search.step("runtime", f"compiled for {backend}, run on etlab's runtime", sorted(best.config.float_layers),
                _Eval(best.config, metric, dataset_sqnr(search.reference, outputs), met, None), met,
                f"{len(search.samples)} samples through the .pte ({len(program.buffer) / 1024:.1f} KB): {why}")
    search.rounds += 1
    return best, program, outputs, metric


def _finish(search: _Search, best: _Eval, program, outputs, metric: float, backend: str, latency_runs: int,
            measure_cost: bool, observers: list[str]) -> MixedPrecisionResult:
    budget, samples = search.goal, search.samples
    met = budget.met(metric)
    cost: dict = {"pte_bytes": len(program.buffer)}
    if measure_cost:
        int8 = compile_program(search.model(search.int8), samples[0], backend)
        flt = compile_program(search.float_gm, samples[0], backend)
        cost.update(int8_pte_bytes=len(int8.buffer), float_pte_bytes=len(flt.buffer))
        if latency_runs > 0:
            cost.update(latency_ms=runtime_latency_ms(program.buffer, samples[0], latency_runs),
                        int8_latency_ms=runtime_latency_ms(int8.buffer, samples[0], latency_runs),
                        float_latency_ms=runtime_latency_ms(flt.buffer, samples[0], latency_runs))
    config = best.config
    factory, layers = search.factory, search.probe.layers
    return MixedPrecisionResult(
        budget=budget, backend=backend, met=met, metric=metric, metric_torch=best.metric,
        int8_metric=search.int8.metric, float_layers=sorted(config.float_layers), config=config,
        steps=pd.DataFrame(search.steps, columns=STEP_COLUMNS), layers=_layer_table(search, config, observers),
        converted=search.model(best), program=program, cost=cost, evaluations=len(search.cache),
        _make_quantizer=lambda: configured_quantizer(factory(), config, layers))


def _layer_table(search: _Search, config: PrecisionConfig, observers: list[str]) -> pd.DataFrame:
    alone = search.alone
    chosen = config.observer_of
    rows = []
    for layer in search.probe.layers:
        is_float = layer.name in config.float_layers
        int16 = layer.output in config.int16
        if is_float:
            without = search.cache.get(config.with_(float_layers=config.float_layers - {layer.name}))
            precision = "float"
            why = (f"quantized, {search.goal.name} is {without.metric:.4g}: misses {search.budget}" if without
                   else "the budget is not met with it quantized (pruning kept it)")
        elif int16:
            precision, why = "int16 activations", "16-bit output activations meet the budget where int8 did not"
        elif layer.name in config.per_channel:
            precision, why = "int8", "per-channel weights meet the budget where per-tensor did not"
        else:
            precision, why = "int8", ""
        if layer.weight is None:
            weights = "none"
        elif is_float:
            weights = "float"
        elif layer.name in config.per_tensor or not (layer.per_channel or layer.name in config.per_channel):
            weights = "per-tensor int8"
        else:
            weights = "per-channel int8"
        activation = "float" if is_float else ("int16" if int16 else "int8" if layer.output else "shared")
        observer = "" if is_float or not layer.output else ("minmax" if int16 else chosen.get(layer.output, "minmax"))
        if observer not in ("", "minmax") and not int16:
            why = (why + "; " if why else "") + f"output calibrated by the {observer} observer (chosen from the data)"
        a = alone.get(layer.name)
        rows.append({"layer": layer.name, "op": layer.op, "module": layer.module, "precision": precision,
                     "weights": weights, "activation": activation, "observer": observer,
                     "alone_in_float": a.metric if a is not None else math.nan, "why": why})
    return pd.DataFrame(rows, columns=LAYER_COLUMNS)


# --- the greedy baseline -------------------------------------------------------------------------------


def greedy_float_baseline(float_model, dataset, *, budget, quantizer_factory: Callable[[], object] | None = None,
                          calibration=None, max_calibration: int = 32, max_layers: int | None = None,
                          backend: str | None = None) -> pd.DataFrame:
    """The manual fix loop as `sensitivity_table` does it: layers ranked by local SQNR on the first input
    (`quantization_report(...).worst()`), the worst k kept in float for k = 0, 1, 2, ... until the budget
    holds over the dataset (measured like the search's). One row per k: float layers, metric, met.
    backend ('xnnpack' / 'portable'): a k that meets the budget in torch is also compiled and run on etlab's
    runtime (`runtime_metric`), and only a program that meets it there ends the loop, as for the search."""
    budget = as_budget(budget)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"greedy_float_baseline: backend must be one of {', '.join(BACKENDS)} or None, "
                         f"got {backend!r}")
    samples = _samples(dataset, "dataset")
    calib = _samples(calibration, "calibration") if calibration is not None else samples[:max_calibration]
    if quantizer_factory is None:
        from etlab.compiler import EtlabQuantizer

        quantizer_factory = EtlabQuantizer
    float_gm = float_graph_of(float_model, samples[0])
    probe_ = probe(float_gm, quantizer_factory())
    search = _Search(float_gm, probe_, quantizer_factory, budget, samples, calib, None, None)
    base = search.evaluate(PrecisionConfig())
    report = quantization_report(float_gm, search.model(base), samples[0])
    owner = layer_of_node(probe_.layers)
    ranked = list(dict.fromkeys(owner[n] for n in report.worst(len(report.layers))["layer"] if n in owner))
    rows = []
    limit = len(ranked) if max_layers is None else min(max_layers, len(ranked))
    for k in range(limit + 1):
        ev = base if k == 0 else search.evaluate(PrecisionConfig().with_(float_layers=ranked[:k]))
        row = {"k": k, "float_layers": ranked[:k], "metric": ev.metric, "sqnr_db": ev.sqnr, "met": ev.met,
               "runtime_metric": math.nan}
        if ev.met and backend is not None:
            program = compile_program(search.model(ev), samples[0], backend)
            row["runtime_metric"] = budget.measure(search.reference, runtime_outputs(program.buffer, samples))
            row["met"] = budget.met(row["runtime_metric"])
        rows.append(row)
        if row["met"]:
            break
    return pd.DataFrame(rows)


__all__ = ["AccuracyBudget", "MixedPrecisionResult", "auto_mixed_precision", "greedy_float_baseline"]
