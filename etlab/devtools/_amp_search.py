"""The evaluator `auto_mixed_precision` searches with (`_Search`): a configuration quantized (prepare, calibrate,
convert with the observers' fixed ranges) and its converted model run on the dataset in torch, judged by the
budget, cached; every step of the search's path recorded with why it was kept or not. Also the dataset's
inputs checked (`_samples`) and the layers ranked by the error they introduce (`_report_ranking`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.fx import GraphModule

from etlab.devtools._amp_budget import AccuracyBudget, dataset_sqnr
from etlab.devtools._amp_config import (
    Layer,
    PrecisionConfig,
    Probe,
    configured_quantizer,
    layer_of_node,
)
from etlab.devtools._quant_debug import _as_inputs, quantization_report
from etlab.devtools._quant_debug_fix import quantize_pt2e

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


