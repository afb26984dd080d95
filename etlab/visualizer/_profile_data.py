"""How the views put an Inspector's rollups (`etlab.inspector.op_timings`, `numeric_gaps`) on the
nodes of a GraphModel, and how they color op kinds."""

from __future__ import annotations

import dataclasses
import functools
import math

from etlab.inspector import DELEGATE_CALL, GapRow, OpTiming, PerfData, execute_timings
from etlab.visualizer._graph_model import BACKEND_COLORS, GraphModel

# Op-kind colors: no red, which marks delegated work (the graph's first backend outline color).
KIND_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d", "#bab0ac", "#ff9da6",
               "#79706e"]


def op_kind(t: OpTiming) -> str:
    """What a timed event is, for coloring: "<backend> (delegated)", else its operator ("convolution")."""
    if t.backend or t.is_delegated:
        return f"{t.backend or 'delegate'} (delegated)"
    if t.op_types:
        parts = str(t.op_types[0]).split(".")
        return parts[1] if len(parts) > 2 else parts[0]  # aten.convolution.default -> convolution
    return t.name


def kind_colors(timings: list[OpTiming]) -> dict[str, str]:
    """A color per op kind, by first appearance; delegated kinds take their backend's graph color."""
    colors: dict[str, str] = {}
    backends = ops = 0
    for t in timings:
        kind = op_kind(t)
        if kind in colors:
            continue
        if kind.endswith("(delegated)"):
            colors[kind] = BACKEND_COLORS[backends % len(BACKEND_COLORS)]
            backends += 1
        else:
            colors[kind] = KIND_COLORS[ops % len(KIND_COLORS)]
            ops += 1
    return colors


STATS = ("p10", "p50", "p90", "avg", "min", "max")


def _nodes_of(by_handle: dict[int, list[int]], handles) -> list[int]:
    """The nodes (ids, in graph order) holding any of these debug handles."""
    return sorted({n for h in handles for n in by_handle.get(h, ())})


def _delegate_split(call: OpTiming, inner: list[OpTiming], targets: list[int],
                    nodes_of) -> tuple[dict[int, float], dict[int, list[str]], str]:
    """How a DELEGATE_CALL's time divides over the nodes of its partition in one graph: in proportion to
    its backend's own per-op events on them (an event covering several nodes split evenly), else evenly.
    Returns (fraction per node, inner events per node, how it was split)."""
    weight: dict[int, float] = {}
    names: dict[int, list[str]] = {}
    for e in inner:
        mine = [n for n in nodes_of(e.handles) if n in targets]
        for n in mine:
            weight[n] = weight.get(n, 0.0) + (e.p50 if math.isfinite(e.p50) else 0.0) / len(mine)
            names.setdefault(n, []).append(e.name)
    total = sum(weight.values())
    if len(targets) == 1:
        return {targets[0]: 1.0}, names, ""
    if total > 0:
        return {n: w / total for n, w in weight.items()}, names, "split by its backend's per-op times"
    why = "its backend logged no per-op times" if not inner else "its backend's per-op events name no node here"
    return {n: 1.0 / len(targets) for n in targets}, names, f"split evenly ({why})"


def runs_merged(timings: list[OpTiming]) -> list[OpTiming]:
    """One timing per event over all its runs: blocks that repeat a method (one per run when a run logged
    intermediates) give the same event once each; their samples are pooled, so a node shows the event's
    percentiles over every run, not their sum. Order: first appearance."""
    groups: dict[tuple, list[OpTiming]] = {}
    for t in timings:
        groups.setdefault((t.block, t.instruction_id, t.name, t.handles, t.is_delegated, t.backend), []).append(t)
    out = []
    for same in groups.values():
        if len(same) == 1:
            out.append(same[0])
            continue
        raw = [x for t in same for x in t.raw]
        perf = PerfData(raw)
        out.append(dataclasses.replace(same[0], p10=perf.p10, p50=perf.p50, p90=perf.p90, avg=perf.avg, min=perf.min,
                                       max=perf.max, runs=len(raw), raw=raw,
                                       start=[x for t in same for x in t.start]))
    return out


def node_latencies(model: GraphModel, timings: list[OpTiming], unit: str = "ms") -> dict[int, dict]:
    """Node id -> its latency stats, so that every event's time is shown once in the graph: an event on
    several nodes is split among them, and a delegate call's time (DELEGATE_CALL, which includes what
    its backend spent outside its per-op events) is divided over the nodes of its partition by
    `_delegate_split` — the nodes of a delegate sum to its call. The backend's per-op events are how
    it divides, not extra time."""
    by_handle: dict[int, list[int]] = {}
    for n in model.nodes:
        for h in n.handles:
            by_handle.setdefault(h, []).append(n.id)
    nodes_of = functools.partial(_nodes_of, by_handle)
    timings = runs_merged(execute_timings(timings))
    calls = {(t.block, t.instruction_id) for t in timings if t.name == DELEGATE_CALL}
    inner: dict[tuple, list[OpTiming]] = {}
    for t in timings:
        if t.is_delegated and (t.block, t.instruction_id) in calls:
            inner.setdefault((t.block, t.instruction_id), []).append(t)
    out: dict[int, dict] = {}
    for t in timings:
        if t.is_delegated and (t.block, t.instruction_id) in calls:
            continue  # divides its call's time (below)
        targets = nodes_of(t.handles)
        if not targets:
            continue
        names: dict[int, list[str]] = {}
        how = ""
        if t.name == DELEGATE_CALL:
            fractions, names, how = _delegate_split(t, inner.get((t.block, t.instruction_id), []), targets, nodes_of)
        else:
            fractions = {n: 1.0 / len(targets) for n in targets}
        for n, f in fractions.items():
            stat = out.setdefault(n, {**dict.fromkeys(STATS, 0.0), "runs": t.runs, "events": [], "shared": 1})
            for k in STATS:
                stat[k] += f * getattr(t, k)
            stat["runs"] = min(stat["runs"], t.runs)
            stat["events"] += [t.name, *names.get(n, ())]
            stat["shared"] = max(stat["shared"], len(fractions))
            if how:
                stat["note"] = (f"{f:.0%} of instruction {t.instruction_id}'s {DELEGATE_CALL} "
                                f"({t.p50:.4g} {unit} p50), {how}")
    return out


def annotate(model: GraphModel, timings: list[OpTiming] | None = None, gaps: list[GapRow] | None = None,
             unit: str = "ms", gap_metric: str = "") -> GraphModel:
    """Puts latency (`node_latencies`: each event's time once, a delegate's nodes summing to its call)
    and numeric gap (the worst of the matched outputs it holds) on the nodes."""
    model.time_unit = unit
    model.gap_metric = gap_metric
    if timings:
        for n_id, stat in node_latencies(model, timings, unit).items():
            model.nodes[n_id].latency = stat
    if gaps:
        for n in model.nodes:
            hs = set(n.handles)
            vals = [g.gap for g in gaps if hs & set(g.handles) and not math.isnan(g.gap)]
            if vals:
                n.gap = max(vals)
    return model
