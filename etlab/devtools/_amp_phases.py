"""The phases of `auto_mixed_precision`'s search in torch (see its module doc, steps 1-5): all int8, observers,
sensitivity of each layer alone in float, the shortest prefix of that ranking that meets the budget, pruning
and the cheaper fixes; and the stricter target a runtime miss leads to."""

from __future__ import annotations

from dataclasses import replace

import torch

from etlab.devtools._amp_budget import AccuracyBudget
from etlab.devtools._amp_config import (
    PrecisionConfig,
)
from etlab.devtools._amp_search import _Eval, _fmt, _report_ranking, _Search

OUTLIER_RATIO = 0.5  # a value is outlier-stretched when another observer's range is under half its min-max range
MIN_GAP_CLOSED = 0.05  # an observer change for every value is kept when it closes at least this much of the gap


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


