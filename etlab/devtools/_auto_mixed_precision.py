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
converted model on the dataset in torch:
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import pandas as pd
import torch
from torch.fx import GraphModule

from etlab.devtools._amp_budget import AccuracyBudget, as_budget, dataset_sqnr
from etlab.devtools._amp_config import (
    Layer,
    PrecisionConfig,
    Probe,
    choose_observers,
    configured_quantizer,
    layer_of_node,
    probe,
)
from etlab.devtools._amp_result import MixedPrecisionResult
from etlab.devtools._amp_runtime import compile_program, runtime_latency_ms, runtime_outputs
from etlab.devtools._quant_debug import _as_inputs, float_graph_of, quantization_report
from etlab.devtools._quant_debug_fix import quantize_pt2e

BACKENDS = ("xnnpack", "portable")
OUTLIER_RATIO = 0.5  # a value is outlier-stretched when another observer's range is under half its min-max range
MIN_GAP_CLOSED = 0.05  # an observer change for every value is kept when it closes at least this much of the gap
RUNTIME_ROUNDS = 3  # searches run when the runtime misses what torch met (each with a stricter target)
MAX_COST_CANDIDATES = 4  # configurations as good by float-layer count, compiled and timed to pick the cheapest
OBSERVERS = ("minmax", "histogram", "percentile", "percentile_99.9")
STEP_COLUMNS = ["step", "phase", "change", "layers", "metric", "sqnr_db", "met", "float_layers", "kept", "why"]
LAYER_COLUMNS = ["layer", "op", "module", "precision", "weights", "activation", "observer", "alone_in_float",
                 "why"]


# --- inputs ---------------------------------------------------------------------------------------


def _samples(dataset, what: str, limit: int | None = None) -> list[tuple]:
    if isinstance(dataset, torch.Tensor) or dataset is None or isinstance(dataset, (str, bytes)):
        raise TypeError(f"{what} must be an iterable of model inputs (tensors or tuples of tensors), "
                        f"got {type(dataset).__name__}")
    try:
        iterator = iter(dataset)
    except TypeError:
        raise TypeError(f"{what} must be an iterable of model inputs, got {type(dataset).__name__}") from None
    out = []
    for i, sample in enumerate(iterator):
        if limit is not None and i >= limit:
            break
        try:
            args = _as_inputs(sample)
        except TypeError as e:
            raise TypeError(f"{what}[{i}]: {e}") from None
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError(f"{what}[{i}]: every input must be a tensor, got "
                            f"{', '.join(type(a).__name__ for a in args)}")
        out.append(args)
    if not out:
        raise ValueError(f"{what} is empty; give at least one input")
    shapes = [tuple(a.shape for a in s) for s in out]
    if any(len(s) != len(shapes[0]) for s in shapes):
        raise ValueError(f"{what}: samples have different numbers of inputs")
    return out


# --- the evaluator --------------------------------------------------------------------------------


@dataclass
class _Eval:
    config: PrecisionConfig
    metric: float
    sqnr: float
    met: bool
    converted: GraphModule | None  # dropped for configurations that miss the budget (memory); see _Search.model


class _Search:
    """Evaluates configurations (cached), records the steps."""

    def __init__(self, float_gm, probe_: Probe, factory, budget: AccuracyBudget, samples, calibration, ranges,
                 progress):
        self.float_gm, self.probe, self.factory, self.budget = float_gm, probe_, factory, budget
        self.samples, self.calibration, self.ranges, self.progress = samples, calibration, ranges, progress
        with torch.no_grad():
            self.reference = [float_gm(*s) for s in samples]
        self.cache: dict[PrecisionConfig, _Eval] = {}
        self.steps: list[dict] = []
        self.recorded: set = set()
        self.max_candidates = 24
        self.observer_names: list[str] = sorted({n for r in (ranges or {}).values() for n in r})
        self.int8: _Eval | None = None  # the all-int8 evaluation
        self.alone: dict[str, _Eval] = {}  # layer -> its evaluation alone in float
        self.goal = budget  # the user's budget; self.budget: the target the search meets in torch
        self.rounds = 0

    def retarget(self, target: AccuracyBudget) -> None:
        """Searches for `target` from now on (cached evaluations judged again)."""
        self.step_note(f"target for torch's run tightened to {target}", "the runtime missed the budget the "
                       "search met in torch, by the margin shown; the search runs again for the stricter target")
        self.budget = target
        for ev in self.cache.values():
            ev.met = target.met(ev.metric)

    def step_note(self, change: str, why: str) -> None:
        self.steps.append({"step": len(self.steps), "phase": "retarget", "change": change, "layers": "",
                           "metric": math.nan, "sqnr_db": math.nan, "met": False, "float_layers": math.nan,
                           "kept": True, "why": why})

    def quantize(self, config: PrecisionConfig, ranges=True) -> GraphModule:
        quantizer = configured_quantizer(self.factory(), config, self.probe.layers, self.ranges if ranges else None)
        return quantize_pt2e(self.float_gm, quantizer, self.calibration)

    def evaluate(self, config: PrecisionConfig) -> _Eval:
        if config not in self.cache:
            converted = self.quantize(config)
            with torch.no_grad():
                outputs = [converted(*s) for s in self.samples]
            metric = self.budget.measure(self.reference, outputs)
            met = self.budget.met(metric)
            keep = met or not self.cache  # the all-int8 model is kept too (the cost comparison compiles it)
            self.cache[config] = _Eval(config, metric, dataset_sqnr(self.reference, outputs), met,
                                       converted if keep else None)
        return self.cache[config]

    def model(self, ev: _Eval) -> GraphModule:
        """The converted model of an evaluation (quantized again when it was dropped: same calibration, same
        fixed ranges, so the same model)."""
        return ev.converted if ev.converted is not None else self.quantize(ev.config)

    def better(self, a: _Eval, b: _Eval) -> bool:
        """a is closer to (or further within) the budget than b; SQNR breaks ties (top-1 is a step)."""
        ma, mb = self.budget.margin(a.metric), self.budget.margin(b.metric)
        return ma > mb or (ma == mb and a.sqnr > b.sqnr)

    def step(self, phase: str, change: str, layers: Iterable[str], ev: _Eval, kept: bool, why: str) -> None:
        """Records one step of the path (a trial repeated by a later round of pruning is recorded once)."""
        layers = list(layers)
        key = (phase, change, tuple(layers), ev.config, self.budget.threshold)
        if key in self.recorded:
            return
        self.recorded.add(key)
        row = {"step": len(self.steps), "phase": phase, "change": change, "layers": ", ".join(layers),
               "metric": ev.metric, "sqnr_db": ev.sqnr, "met": ev.met, "float_layers": len(ev.config.float_layers),
               "kept": kept, "why": why}
        self.steps.append(row)
        if self.progress is not None:
            self.progress(f"[{row['step']}] {phase}: {change} {row['layers']} -> {self.budget.name} "
                          f"{ev.metric:.4g} ({'met' if ev.met else 'missed'}){' kept' if kept else ''}")


def _fmt(budget: AccuracyBudget, v: float) -> str:
    return f"{budget.name} {v:.4g}"


# --- ranking ----------------------------------------------------------------------------------------


def _report_ranking(float_gm, converted, samples, layers: Sequence[Layer], k: int) -> list[str]:
    """Layers ordered by the error they introduce, averaged over up to `k` samples (local SQNR, dB)."""
    owner = layer_of_node(layers)
    total: dict[str, list[float]] = {}
    for s in samples[:k]:
        report = quantization_report(float_gm, converted, s)
        for _, row in report.layers.iterrows():
            name = owner.get(row["layer"])
            value = row["local_sqnr"]
            if name is not None and bool(row["ranked"]) and not (isinstance(value, float) and math.isnan(value)):
                total.setdefault(name, []).append(max(float(value), -1e9))
    mean = {n: sum(v) / len(v) for n, v in total.items()}
    ranked = sorted(mean, key=lambda n: mean[n])
    return ranked + [layer.name for layer in layers if layer.name not in mean]


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


def _stricter(goal: AccuracyBudget, target: AccuracyBudget, gap: float) -> AccuracyBudget:
    """`target` moved by 1.5x `gap` (the torch-vs-runtime difference seen) further into the good side."""
    shift = 1.5 * max(gap, 0.0) + 1e-9
    threshold = target.threshold + shift if goal.higher_is_better else max(target.threshold - shift, 0.0)
    if goal.metric in ("top1", "cosine", "min_cosine"):  # their best value is 1
        threshold = min(threshold, 1.0)
    return replace(target, threshold=threshold)


def _run_search(search: _Search, chosen: dict, mse: dict, allow_int16: bool, max_candidates: int) -> _Eval:
    budget, layers = search.budget, search.probe.layers
    base = search.evaluate(PrecisionConfig())
    search.step("int8", "all layers int8", [], base, True,
                "the quantizer's own configuration" + (": budget met, nothing to change" if base.met else
                                                       f": misses {budget}"))
    search.int8 = base
    if base.met:
        return base
    current = base
    current = _observer_phase(search, current, chosen, mse)
    if current.met:
        return current
    # sensitivity of each candidate layer kept in float alone
    ranking = _report_ranking(search.float_gm, search.model(current), search.samples, layers, k=4)
    candidates = ranking[:max_candidates]
    alone: dict[str, _Eval] = {}
    for name in candidates:
        alone[name] = search.evaluate(current.config.with_(float_layers={name}))
    search.alone = alone
    order = sorted(candidates, key=lambda n: (-budget.margin(alone[n].metric), -alone[n].sqnr, ranking.index(n)))
    order += [n for n in ranking if n not in order]
    top = order[0]
    search.step("sensitivity", "each candidate alone in float", [], alone[top], False,
                f"{len(candidates)} candidates (of {len(layers)} layers, by local SQNR over the dataset); best alone: "
                f"{top} -> {_fmt(budget, alone[top].metric)}")
    # shortest prefix that meets the budget: doubling, then bisection
    def prefix(k: int) -> _Eval:
        return search.evaluate(current.config.with_(float_layers=order[:k]))

    hi = 1
    while hi < len(order) and not prefix(hi).met:
        hi *= 2
    hi = min(hi, len(order))
    found = prefix(hi)
    if not found.met:
        search.step("prefix", "every layer in float", order, found, True,
                    f"the budget is not met even with all {len(order)} layers in float (the float model's own "
                    "outputs differ from its graph's?)" if len(order) == len(layers) else "not met")
        return found
    lo = hi // 2  # prefix(lo) missed (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if prefix(mid).met:
            hi = mid
        else:
            lo = mid
    current = prefix(hi)
    search.step("prefix", f"the {hi} most useful layers in float", order[:hi], current, True,
                f"shortest prefix of the sensitivity ranking that meets {budget}")
    # pruning (least useful first) and cheaper fixes for what stays float, until nothing changes: a
    # cheaper fix for one layer can make another float layer unnecessary
    for _ in range(len(layers)):
        before = current.config
        current = _prune(search, current, order)
        current = _cheaper_fixes(search, current, order, allow_int16)
        if current.config == before:
            break
    return current


def _observer_phase(search: _Search, current: _Eval, chosen: dict[str, str], mse: dict) -> _Eval:
    """Observers for the activation values: (1) each value's lowest-MSE observer; (2) outlier-stretched
    values clipped one at a time (`_clip_outlier_values`); (3) one observer for every value. A grid's MSE
    weighs every element alike, the budget may not (a clipped outlier nothing reads costs nothing), so
    each is judged by the budget's metric; (1) and (3) are kept only when they close at least
    MIN_GAP_CLOSED of the gap to the budget (a grid that clips everywhere for a rounding-level gain would
    cost more than it buys once the search fixes the layers that matter)."""
    start = current
    needed = MIN_GAP_CLOSED * abs(search.budget.margin(current.metric))

    def closes(ev: _Eval, than: _Eval) -> bool:
        return search.budget.margin(ev.metric) - search.budget.margin(than.metric) >= needed and search.better(ev, than)

    changed = {v: o for v, o in chosen.items() if o != "minmax"}
    if changed:
        detail = ", ".join(f"{o}: {sum(1 for x in changed.values() if x == o)}" for o in sorted(set(changed.values())))
        ev = search.evaluate(current.config.with_(observers=chosen))
        keep = closes(ev, current)
        search.step("observers", "lowest-MSE observer per value", sorted(changed), ev, keep,
                    f"each activation's grid with the lowest MSE over the calibration data ({detail} values; the "
                    "rest min-max)" + (": closes part of the gap" if keep else
                                       f": closes less than {MIN_GAP_CLOSED:.0%} of the gap to the budget"))
        if keep:
            current = ev
    if current.met:
        return current
    current = _clip_outlier_values(search, current)
    if current.met:
        return current
    names = sorted({n for per_value in mse.values() for n in per_value} - {"minmax"})
    best, best_row = current, None
    for name in names:
        ev = search.evaluate(start.config.with_(observers={v: name for v in mse}))
        keep = closes(ev, best)
        search.step("observers", f"{name} observer for every value", [], ev, False,
                    f"every activation calibrated by the {name} observer"
                    + (": better than the grids before" if keep else ": no better than the grids before"))
        if keep:
            best, best_row = ev, len(search.steps) - 1
    if best_row is not None:
        search.steps[best_row]["kept"] = True
    return best


def _clip_outlier_values(search: _Search, current: _Eval) -> _Eval:
    """Values whose min-max range an outlier stretched (another observer's range under OUTLIER_RATIO of it),
    most stretched first, each tried with that observer alone and kept when the budget's metric improves:
    a grid's MSE counts a clipped outlier even when nothing downstream reads it (a dead channel), the
    budget does not."""
    config = current.config
    tried = []
    for value, by_observer in search.ranges.items():
        full = by_observer.get("minmax")
        if full is None or full[1] - full[0] <= 0:
            continue
        width = {n: r[1] - r[0] for n, r in by_observer.items() if n != "minmax"}
        if not width:
            continue
        name = min(width, key=width.get)
        ratio = width[name] / (full[1] - full[0])
        if ratio < OUTLIER_RATIO and config.observer_of.get(value) != name:
            tried.append((ratio, value, name))
    for ratio, value, name in sorted(tried)[:search.max_candidates]:
        cfg = current.config
        ev = search.evaluate(cfg.with_(observers={**cfg.observer_of, value: name}))
        keep = search.budget.margin(ev.metric) > search.budget.margin(current.metric)
        search.step("observers", f"{name} observer for one value", [value], ev, keep,
                    f"its min-max range is {1 / ratio:.0f}x the {name} range (an outlier stretches it): "
                    + ("clipping it brings the metric closer to the budget" if keep else "clipping it does not help"))
        if keep:
            current = ev
            if ev.met:
                break
    return current


def _prune(search: _Search, current: _Eval, order: list[str]) -> _Eval:
    """Each float layer, least useful first, quantized again where the budget still holds."""
    for name in sorted(current.config.float_layers, key=order.index, reverse=True):
        trial = search.evaluate(current.config.with_(float_layers=current.config.float_layers - {name}))
        search.step("prune", "quantize again", [name], trial, trial.met,
                    "the budget holds without it in float" if trial.met else "needed: the budget breaks without it")
        if trial.met:
            current = trial
    return current


def _cheaper_fixes(search: _Search, current: _Eval, order: list[str], allow_int16: bool) -> _Eval:
    """For each float layer, the cheapest fix that meets the budget with it quantized: another observer
    for the values it reads and writes (free at run time), per-channel weights (when the quantizer gave
    per-tensor), 16-bit output activations (portable), or both."""
    by_name = {layer.name: layer for layer in search.probe.layers}
    for name in sorted(current.config.float_layers, key=order.index):
        layer, cfg = by_name[name], current.config
        rungs = []
        values = [v for v in (*layer.inputs, layer.output) if v in search.ranges]
        for observer in search.observer_names:
            if observer != "minmax" and values and any(cfg.observer_of.get(v) != observer for v in values):
                rungs.append((f"{observer} observer on its inputs and output",
                              {"observers": {**cfg.observer_of, **{v: observer for v in values}}}))
        if layer.per_channel is False:
            rungs.append(("per-channel weights", {"per_channel": cfg.per_channel | {name}}))
        if allow_int16 and layer.output is not None:
            rungs.append(("16-bit output activations", {"int16": cfg.int16 | {layer.output}}))
            if layer.per_channel is False:
                rungs.append(("per-channel weights and 16-bit output activations",
                              {"per_channel": cfg.per_channel | {name}, "int16": cfg.int16 | {layer.output}}))
        for label, changes in rungs:
            trial = search.evaluate(cfg.with_(float_layers=cfg.float_layers - {name}, **changes))
            search.step("cheaper fix", label + " instead of float", [name], trial, trial.met,
                        "meets the budget with the layer quantized" if trial.met else "not enough: stays float")
            if trial.met:
                current = trial
                break
    return current


def _weight_numel(search: _Search, config: PrecisionConfig) -> int:
    """Elements of the weights the float layers of `config` keep in float (what they add to the .pte)."""
    gm, total = search.probe.graph, 0
    nodes = {n.name: n for n in gm.graph.nodes}
    for layer in search.probe.layers:
        node = nodes.get(layer.weight or "")
        if layer.name in config.float_layers and node is not None and node.op == "get_attr":
            obj = gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part, None)
            total += obj.numel() if isinstance(obj, torch.Tensor) else 0
    return total


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
