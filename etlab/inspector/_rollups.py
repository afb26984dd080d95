"""Profile and numeric-gap rollups of an Inspector: one row per timed event or matched output.

Pure functions over the Inspector's event blocks, for the views (graph overlays, profile tables,
the dashboard summary) and for anyone who wants the same numbers as data: per event its
percentiles, per-run start offsets, debug handles, ops, module and the user's source line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etlab.facts.source import module_path, source_line
from etlab.inspector._events import time_scale_factor
from etlab.schema.etdump import DELEGATE_CALL, FRAMEWORK_EVENT_NAMES, OPERATOR_CALL


def _handles(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(x) for x in value)


def _innermost_module(hierarchy: dict) -> str:
    """The innermost module path of the first node (of an event) that has one."""
    for stack in (hierarchy or {}).values():
        path = module_path(stack) if isinstance(stack, dict) else ""
        if path:
            return path
    return ""


def _source(traces: dict) -> str:
    """The user's source line of the first node (of an event) whose stack trace has one."""
    for trace in (traces or {}).values():
        line = source_line(trace)
        if line:
            return line
    return ""


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


def event_label(event) -> str:
    """A readable name for an event. Delegates often name their events by debug identifier only
    ("0"): those become "<backend> #0: permute_copy, addmm" (the ops the ETRecord maps it to)."""
    name = str(event.name)
    if not (event.is_delegated_op and name.lstrip("-").isdigit()):
        return name
    ops = list(dict.fromkeys(str(o).split(".")[1] if str(o).count(".") >= 2 else str(o) for o in event.op_types))
    label = f"{event.delegate_backend_name or 'delegate'} #{name}"
    return f"{label}: {', '.join(ops)}" if ops else label


def time_unit(inspector) -> str:
    """The unit the Inspector's times are in ("ms" unless it was built with another target time scale)."""
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
            scale = time_scale_factor(block.source_time_scale, block.target_time_scale)
        firsts = [e.start_time for e in block.events if e.start_time]
        run_start = [min(s[r] for s in firsts if r < len(s)) for r in range(max((len(s) for s in firsts), default=0))]
        for i, e in enumerate(block.events):
            if e.name in FRAMEWORK_EVENT_NAMES or e.name == OPERATOR_CALL or e.perf_data is None:
                continue
            handles = _handles(e.debug_handles)
            if not handles and instruction_handles and e.instruction_id is not None and not e.is_delegated_op:
                handles = _handles(instruction_handles.get(e.instruction_id))
            p = e.perf_data
            start = [(s - run_start[r]) / scale for r, s in enumerate(e.start_time or []) if r < len(run_start)]
            out.append(OpTiming(
                block=block.name, name=event_label(e), index=i, instruction_id=e.instruction_id, handles=handles,
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
    delegated = _delegated_event_names(inspector)
    for i, r in enumerate(df.itertuples(index=False)):
        gap = r.gap[0] if isinstance(r.gap, (list, tuple)) and r.gap else r.gap
        try:
            gap = float(gap)
        except (TypeError, ValueError):
            continue
        traces = r.stacktraces if isinstance(r.stacktraces, dict) else {}
        runtime = _handles(r.runtime_debug_handle)
        rows.append(GapRow(order=i, handles=_handles(r.aot_debug_handle), aot_ops=list(r.aot_ops),
                           runtime_ops=[delegated.get((name, runtime), name) for name in r.runtime_ops],
                           gap=gap, source=_source(traces)))
    return rows


def _delegated_event_names(inspector) -> dict[tuple[str, tuple], str]:
    """A backend names the outputs it logs by its delegate debug identifier ("0"), which alone says
    nothing in a table: (event name, handles) -> "DemoBackend event 0"."""
    names = {}
    for block in getattr(inspector, "event_blocks", ()):
        for e in block.events:
            if e.is_delegated_op and e.delegate_backend_name and e.debug_handles is not None:
                names[(e.name, _handles(e.debug_handles))] = f"{e.delegate_backend_name} event {e.name}"
    return names


def ops_without_outputs(inspector) -> list[str]:
    """Ops that ran (timed, mapped to graph nodes) in an execution block but have no recorded output:
    the debug buffer was full, or intermediates were not asked for. Their numeric gap cannot be
    computed, and the view says so instead of leaving them out silently. One name per op and block."""
    missing: dict[tuple[str, tuple], str] = {}
    for block in inspector.event_blocks:
        if block.name == "Default":  # the load block runs no ops
            continue
        logged = {_handles(e.debug_handles) for e in block.events if e.debug_data}
        for e in block.events:
            if e.name in FRAMEWORK_EVENT_NAMES or e.name == OPERATOR_CALL or e.name == DELEGATE_CALL:
                continue
            handles = _handles(e.debug_handles)
            if e.op_types and handles and not e.is_delegated_op and handles not in logged:
                missing.setdefault((block.name, handles), event_label(e))
    return list(missing.values())
