"""What the views take from an Inspector: per-event timings keyed by debug handle, numeric gaps,
and how to put both on the nodes of a GraphModel."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from etlab.visualizer._graph_model import GraphModel

# Events the runtime emits around methods, and its per-instruction wrapper (its time is the kernel's
# plus dispatch): left out so each op is timed once. Names as in etlab.inspector._events.
FRAMEWORK_EVENTS = frozenset({"Method::init", "Program::load_method", "Method::execute"})
OPERATOR_CALL = "OPERATOR_CALL"
DELEGATE_CALL = "DELEGATE_CALL"


@dataclass
class OpTiming:
    """One timed event of an event block (an op, a delegate call, or an op inside a delegate)."""

    block: str
    name: str
    index: int  # position in its block (execution order)
    instruction_id: int | None
    handles: tuple[int, ...]
    op_types: list[str]
    nodes: list[str]  # graph node names (from the ETRecord)
    module: str
    source: str
    is_delegated: bool
    backend: str | None
    p10: float
    p50: float
    p90: float
    avg: float
    min: float
    max: float
    runs: int
    raw: list[float] = field(default_factory=list)
    start: list[float] = field(default_factory=list)  # per run, in the Inspector's time unit, from run start


def _handles(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(x) for x in value)


def _innermost_module(hierarchy: dict) -> str:
    for stack in hierarchy.values():
        if isinstance(stack, dict) and stack:
            val = list(stack.values())[-1]
            return str(val[0]) if isinstance(val, (tuple, list)) else str(val)
    return ""


def _source(traces: dict) -> str:
    from etlab.visualizer._graph_model import source_line

    for trace in traces.values():
        line = source_line(trace)
        if line:
            return line
    return ""


def time_unit(inspector) -> str:
    blocks = inspector.event_blocks
    return blocks[0].target_time_scale.value if blocks else "ms"


def op_timings(inspector, instruction_handles: dict[int, tuple[int, ...]] | None = None) -> list[OpTiming]:
    """Timed events of every event block, in execution order.

    Events without ETRecord handles get them from `instruction_handles` (instruction id ->
    handles, e.g. from ExecutorchProgramManager.debug_handle_map) when given.
    """
    scale = None
    out: list[OpTiming] = []
    for block in inspector.event_blocks:
        if scale is None:
            from etlab.inspector._events import time_scale_factor  # the Inspector's own unit conversion

            scale = time_scale_factor(block.source_time_scale, block.target_time_scale)
        firsts = [e.start_time for e in block.events if e.start_time]
        run_start = [min(s[r] for s in firsts if r < len(s)) for r in range(max((len(s) for s in firsts), default=0))]
        for i, e in enumerate(block.events):
            if e.name in FRAMEWORK_EVENTS or e.name == OPERATOR_CALL or e.perf_data is None:
                continue
            handles = _handles(e.debug_handles)
            if not handles and instruction_handles and e.instruction_id is not None and not e.is_delegated_op:
                handles = _handles(instruction_handles.get(e.instruction_id))
            p = e.perf_data
            start = [(s - run_start[r]) / scale for r, s in enumerate(e.start_time or []) if r < len(run_start)]
            name = e.name
            if e.is_delegated_op and str(name).isdigit():  # delegates may name events by debug id only
                name = f"{e.delegate_backend_name or 'delegate'} #{name}"
            out.append(OpTiming(
                block=block.name, name=name, index=i, instruction_id=e.instruction_id, handles=handles,
                op_types=list(e.op_types), nodes=list(e.stack_traces), module=_innermost_module(e.module_hierarchy),
                source=_source(e.stack_traces), is_delegated=bool(e.is_delegated_op), backend=e.delegate_backend_name,
                p10=p.p10, p50=p.p50, p90=p.p90, avg=p.avg, min=p.min, max=p.max, runs=len(p.raw), raw=list(p.raw),
                start=start,
            ))
    return out


def execute_timings(timings: list[OpTiming]) -> list[OpTiming]:
    """The timings of method executions (blocks other than the load block "Default" when there are any)."""
    runs = [t for t in timings if t.block != "Default"]
    return runs or timings


def timings_counted_once(timings: list[OpTiming]) -> list[OpTiming]:
    """Each instruction's time once: a DELEGATE_CALL stands for the events its backend logged
    inside it (those are left out), so the call's dispatch and backend-call overhead count too."""
    calls = {(t.block, t.instruction_id) for t in timings if t.name == DELEGATE_CALL}
    return [t for t in timings if not (t.is_delegated and (t.block, t.instruction_id) in calls)]


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
    from etlab.visualizer._graph_model import BACKEND_COLORS

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


@dataclass
class GapRow:
    """One matched intermediate output: its AOT handles, node names, gap and source."""

    order: int
    handles: tuple[int, ...]
    aot_ops: list[str]
    runtime_ops: list[str]
    gap: float
    source: str


def numeric_gaps(inspector, distance: str = "MSE") -> list[GapRow]:
    """calculate_numeric_gap() as rows in execution order; [] when the Inspector cannot compute it."""
    try:
        df = inspector.calculate_numeric_gap(distance)
    except (ValueError, TypeError, RuntimeError, KeyError):
        return []
    rows = []
    for i, r in enumerate(df.itertuples(index=False)):
        gap = r.gap[0] if isinstance(r.gap, (list, tuple)) and r.gap else r.gap
        try:
            gap = float(gap)
        except (TypeError, ValueError):
            continue
        traces = r.stacktraces if isinstance(r.stacktraces, dict) else {}
        rows.append(GapRow(order=i, handles=_handles(r.aot_debug_handle), aot_ops=list(r.aot_ops),
                           runtime_ops=list(r.runtime_ops), gap=gap, source=_source(traces)))
    return rows


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
