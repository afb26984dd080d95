"""How the views put an Inspector's rollups (`etlab.inspector.op_timings`, `numeric_gaps`) on the
nodes of a GraphModel, and how they color op kinds."""

from __future__ import annotations

import math

from etlab.inspector import DELEGATE_CALL, GapRow, OpTiming, execute_timings
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


def annotate(model: GraphModel, timings: list[OpTiming] | None = None, gaps: list[GapRow] | None = None,
             unit: str = "ms", gap_metric: str = "") -> GraphModel:
    """Puts latency (sum of p50 of the most specific events covering a node) and gap on its nodes."""
    model.time_unit = unit
    model.gap_metric = gap_metric
    if timings:
        covering: dict[int, list[OpTiming]] = {}
        for t in execute_timings(timings):
            for h in t.handles:
                covering.setdefault(h, []).append(t)
        users: dict[int, int] = {}  # id(event) -> number of nodes it is attributed to
        chosen: dict[int, list[OpTiming]] = {}
        for n in model.nodes:
            events = {id(t): t for h in n.handles for t in covering.get(h, ())}
            inner = [t for t in events.values() if t.is_delegated]
            picked = inner or [t for t in events.values() if t.name != DELEGATE_CALL or n.kind == "delegate"] or \
                list(events.values())
            if picked:
                chosen[n.id] = picked
                for t in picked:
                    users[id(t)] = users.get(id(t), 0) + 1
        for n in model.nodes:
            picked = chosen.get(n.id)
            if not picked:
                continue
            stat = {k: sum(getattr(t, k) for t in picked) for k in ("p10", "p50", "p90", "avg", "min", "max")}
            stat["runs"] = min(t.runs for t in picked)
            stat["events"] = [t.name for t in picked]
            stat["shared"] = max(users[id(t)] for t in picked)
            n.latency = stat
    if gaps:
        for n in model.nodes:
            hs = set(n.handles)
            vals = [g.gap for g in gaps if hs & set(g.handles) and not math.isnan(g.gap)]
            if vals:
                n.gap = max(vals)
    return model
