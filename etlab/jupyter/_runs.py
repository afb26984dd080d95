"""What the .etdp viewer shows: run blocks, the profile table, a per-run timeline and, with the
program beside it (.etrecord or .pte), the joined dashboard; plus the comparison of two runs.

The pairing is checked first (`etlab.inspector.run_mismatch`, the Inspector's own check): a run
matches a program when every call it logged sits on an instruction of the same kind (kernel /
delegate) running the same operator in that program.
"""

from __future__ import annotations

import math
from pathlib import Path

from etlab.jupyter._program import instruction_graph
from etlab.schema.program import PteFile

# The event and its p50 first (a notebook cell or a narrow panel shows them without scrolling), then
# its share of the run, then the long text columns.
PROFILE_COLUMNS = [("name", "event", False), ("p50", "p50", True), ("share", "share %", True), ("runs", "runs", True),
                   ("ops", "ops", False), ("module", "module", False), ("backend", "backend", False),
                   ("instruction", "instr", True), ("avg", "avg", True), ("min", "min", True), ("max", "max", True),
                   ("source", "source", False)]


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


def profile_rows(timings) -> list[dict]:
    """The profile table's rows (TableView format); a row with debug handles focuses its graph node.
    share: the event's p50 as a percentage of the sum of p50 with each instruction counted once (a
    delegate call, not also its backend's events inside it)."""
    from etlab.inspector import timings_counted_once

    total = sum(t.p50 for t in timings_counted_once(timings) if math.isfinite(t.p50))
    return [{"name": t.name, "ops": ", ".join(t.op_types), "module": t.module, "backend": t.backend or "",
             "share": _num(round(100.0 * t.p50 / total, 2)) if total > 0 and math.isfinite(t.p50) else None,
             "instruction": t.instruction_id, "p50": _num(t.p50), "avg": _num(t.avg), "min": _num(t.min),
             "max": _num(t.max), "runs": t.runs, "source": t.source, "handles": list(t.handles),
             "focus": {"name": t.nodes[-1] if t.nodes else None, "handles": list(t.handles),
                       "instruction": t.instruction_id} if (t.handles or t.instruction_id is not None) else None}
            for t in timings]


def timeline_spans(timings, max_runs: int = 200) -> list[dict]:
    """Per run, each timed event as a span [start, start + duration] from the run's start. `kind` is what
    colors it (its op kind, or "<backend> (delegated)"); `depth` 1 marks a backend's per-op event inside
    its DELEGATE_CALL (depth 0), drawn nested under the call as Perfetto draws a slice in a slice."""
    from etlab.inspector import DELEGATE_CALL
    from etlab.visualizer import op_kind

    calls = {(t.block, t.instruction_id) for t in timings if t.name == DELEGATE_CALL}
    spans = []
    for row, t in enumerate(timings):
        inner = bool(t.is_delegated) and t.name != DELEGATE_CALL and (t.block, t.instruction_id) in calls
        kind = f"{t.backend or 'delegate'} call" if t.name == DELEGATE_CALL else op_kind(t)
        for r, (start, dur) in enumerate(zip(t.start, t.raw)):
            if r >= max_runs:
                break
            spans.append({"run": r, "row": row, "start": _num(start), "dur": _num(dur), "name": t.name,
                          "handles": list(t.handles), "instruction": t.instruction_id,
                          "delegated": bool(t.is_delegated) or t.name == DELEGATE_CALL, "kind": kind,
                          "depth": 1 if inner else 0})
    return spans


def run_summary(timings, unit: str) -> dict:
    """What a dashboard says first: how many runs, and each run's length (first event's start to the last
    one's end, each instruction counted once) as p50 / min / max, in the Inspector's unit (ms)."""
    from etlab.inspector import timings_counted_once

    ends: dict[int, float] = {}
    for t in timings_counted_once(timings):
        for r, (start, dur) in enumerate(zip(t.start, t.raw)):
            if math.isfinite(start) and math.isfinite(dur):
                ends[r] = max(ends.get(r, 0.0), start + dur)
    lengths = sorted(ends.values())
    if not lengths:
        return {"runs": 0, "unit": unit, "p50": None, "min": None, "max": None}
    return {"runs": len(lengths), "unit": unit, "p50": _num(lengths[(len(lengths) - 1) // 2]),
            "min": _num(lengths[0]), "max": _num(lengths[-1])}


def run_blocks(cols) -> list[dict]:
    """The run blocks as written: name, event counts, profiled span (first start to last end, in ticks)."""
    out = []
    for r in cols.runs:
        sl = slice(r.first_event, r.first_event + r.num_events)
        prof = cols.has_profile[sl]
        starts, ends = cols.start_time[sl][prof], cols.end_time[sl][prof]
        out.append({"name": r.name or "", "events": r.num_events, "profile_events": int(prof.sum()),
                    "debug_events": int(cols.has_debug[sl].sum()),
                    "span_ticks": int(ends.max()) - int(starts.min()) if len(starts) else 0})
    return out


def _opt_int(v) -> int | None:
    """An int, or None for a missing value (None, NaN, pandas' NA)."""
    import pandas as pd

    return None if v is None or pd.isna(v) else int(v)


def observed_memory(inspector, max_runs: int = 200) -> dict | None:
    """The run's allocation events added up (Inspector.memory_summary()): tracked peak, bytes by owner, load
    against run, and the tracked bytes at each instruction of the first `max_runs` runs; None without
    allocation events (a run traced without trace_allocations)."""
    summary = inspector.memory_summary()
    if not len(summary.owners):
        return None
    tl = summary.timeline
    tl = tl[tl["run"] < max_runs]
    return {"peak_bytes": summary.peak_bytes, "load_bytes": summary.load_bytes,
            "peak_run": _opt_int(summary.peak_run), "peak_instruction": _opt_int(summary.peak_instruction),
            "runs": summary.runs,
            "owners": [{"owner": str(r.owner), "kind": str(r.kind), "load_bytes": int(r.load_bytes),
                        "run_peak_bytes": int(r.run_peak_bytes), "peak_bytes": int(r.peak_bytes),
                        "peak_run": _opt_int(r.peak_run), "peak_instruction": _opt_int(r.peak_instruction)}
                       for r in summary.owners.itertuples(index=False)],
            "phases": [{"phase": str(r.phase), "tracked_bytes": int(r.tracked_bytes), "rss_bytes": int(r.rss_bytes),
                        "peak_rss_bytes": int(r.peak_rss_bytes)} for r in summary.phases.itertuples(index=False)],
            "timeline": [{"run": int(r.run), "instruction": int(r.instruction), "accumulated": int(r.accumulated),
                          "transient": int(r.transient), "bytes": int(r.bytes)}
                         for r in tl.itertuples(index=False) if r.instruction >= 0]}


def etdp_view(etdump, inspector, *, program_kind: str | None = None, pte: PteFile | None = None,
              method: str = "forward") -> dict:
    """The run's blocks, profile table and timeline; paired with a .pte also its instruction graph with
    the p50 overlay (cheap). The ETRecord's graphs come separately (`etdp_graphs`): rebuilding them is
    the slow part, and the table and timeline should not wait for it."""
    from etlab.inspector import execute_timings, op_timings, time_unit

    timings = execute_timings(op_timings(inspector))
    unit = time_unit(inspector)
    view = {"blocks": run_blocks(etdump), "unit": unit,
            "columns": [{"key": k, "label": f"{label} ({unit})" if k in ("p50", "avg", "min", "max") else label,
                         "numeric": num} for k, label, num in PROFILE_COLUMNS],
            "rows": profile_rows(timings), "spans": timeline_spans(timings),
            "runs": max((t.runs for t in timings), default=0), "summary": run_summary(timings, unit),
            "graphs": [], "paired": program_kind,
            "graphs_pending": program_kind == "etrecord", "observed_memory": observed_memory(inspector)}
    if pte is not None:
        plans = list(pte.program.execution_plan or ())
        plan = next((p for p in plans if p.name == method), plans[0] if plans else None)
        if plan is not None:
            model = instruction_graph(plan)
            annotate_by_instruction(model, instruction_timings(timings), unit)
            view["graphs"] = [model.to_json()]
    return view


def etdp_graphs(inspector, record, *, method: str = "forward") -> list[dict]:
    """The ETRecord's graphs (ATen / Edge / runtime, whichever it holds) with the run's p50 on each node."""
    from etlab.jupyter._records import record_graph_kinds
    from etlab.visualizer import GraphView

    kinds = record_graph_kinds(record)
    if not kinds:
        return []
    gv = GraphView(record, graph=kinds, inspector=inspector, method=method, overlay="latency",
                   shown=kinds[:2] if len(kinds) > 1 else None)
    return gv.graphs


def instruction_timings(timings) -> dict:
    """Instruction id -> its one timing over all runs (`runs_merged`): the kernel's event, or the whole
    DELEGATE_CALL (not the backend's inner events, which share the instruction id)."""
    from etlab.visualizer import runs_merged

    return {t.instruction_id: t for t in runs_merged(timings) if t.instruction_id is not None and not t.is_delegated}


def annotate_by_instruction(model, by_instruction: dict, unit: str, *, ratio: bool = False) -> None:
    """Puts each instruction's timing on its node (node.handles[0] is the instruction id)."""
    model.time_unit = unit
    for node in model.nodes:
        if not node.handles:
            continue
        t = by_instruction.get(node.handles[0])
        if t is None:
            continue
        if ratio:
            node.latency = {"p50": t, "p10": t, "p90": t, "avg": t, "min": t, "max": t, "runs": 1}
        else:
            node.latency = {"p50": t.p50, "p10": t.p10, "p90": t.p90, "avg": t.avg, "min": t.min, "max": t.max,
                            "runs": t.runs, "events": [t.name], "shared": 1}


def compare_view(ins_a, ins_b, *, name_a: str, name_b: str, pte: PteFile | None = None,
                 method: str = "forward") -> dict:
    """Per-op p50 of two runs of one program side by side (delta, ratio B/A), and the instruction
    graph colored by the ratio when the program's .pte is known."""
    comparison = ins_a.compare(ins_b, by="instruction", name_a=name_a, name_b=name_b)  # etlab.inspector's join
    unit = comparison.unit
    rows, ratio_by_instr = [], {}
    for r in comparison.rows:
        instr = (r.instructions_a or r.instructions_b or [None])[0]
        rows.append({"name": (r.events_a or r.events_b)[0], "instruction": instr,
                     "ops": ", ".join(r.ops) if r.nodes else "", "p50_a": _num(r.latency_a),
                     "p50_b": _num(r.latency_b), "delta": _num(r.delta), "ratio": _num(r.ratio),
                     "focus": {"name": None, "handles": [instr], "instruction": instr} if instr is not None else None})
        if r.ratio is not None and instr is not None and not r.delegated:
            ratio_by_instr[instr] = r.ratio
    columns = [{"key": "name", "label": "event", "numeric": False},
               {"key": "instruction", "label": "instr", "numeric": True},
               {"key": "ops", "label": "ops", "numeric": False},
               {"key": "p50_a", "label": f"p50 A ({unit})", "numeric": True},
               {"key": "p50_b", "label": f"p50 B ({unit})", "numeric": True},
               {"key": "delta", "label": f"B - A ({unit})", "numeric": True},
               {"key": "ratio", "label": "B / A", "numeric": True}]
    graphs = []
    if pte is not None:
        plans = list(pte.program.execution_plan or ())
        plan = next((p for p in plans if p.name == method), plans[0] if plans else None)
        if plan is not None:
            model = instruction_graph(plan)
            model.title = f"p50 ratio {Path(name_b).name} / {Path(name_a).name} per instruction"
            annotate_by_instruction(model, ratio_by_instr, "× (B / A)", ratio=True)
            model.latency_center = 1.0
            graphs = [model.to_json()]
    from etlab.visualizer import capture_warning

    return {"a": name_a, "b": name_b, "unit": unit, "columns": columns, "rows": rows, "graphs": graphs,
            "warning": capture_warning(comparison)}
