"""The runtime timeline as a Chrome trace (JSON Trace Event Format), viewable in Perfetto.

One process; one track (thread) per run, named after the run; every profile event is a complete
event ("X") with microsecond timestamps relative to the earliest event, except an OPERATOR_CALL that
repeats the kernel event logged just before it (the runtime times each kernel call twice: as
`native_call_<op>` and as OPERATOR_CALL), so each op is one slice. Delegate events sit on
their run's track, where Perfetto nests them inside the DELEGATE_CALL that contains them; a
delegate whose clock does not line up with the runtime's gets a track of its own instead, so
tracks never hold overlapping, non-nested slices.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from etlab.etdump import ETDumpColumns
from etlab.inspector._events import TimeScale, time_scale_factor
from etlab.inspector._grouping import elapsed_ticks
from etlab.schema import write_atomic
from etlab.schema.etdump import DELEGATE_CALL, FRAMEWORK_EVENT_NAMES, OPERATOR_CALL, kernel_of_event

_PID = 1


def _category(name: str, delegated: bool) -> str:
    if delegated:
        return "delegate"
    if name in FRAMEWORK_EVENT_NAMES:
        return "framework"
    return "operator"


def _kernel_twins(names: list[str], run, chain: list, instr: list, delegated) -> set[int]:
    """Rows of OPERATOR_CALL events that only repeat the kernel event logged just before them (same
    run and instruction: the runtime times one kernel call as both)."""
    return {j for j in range(1, len(names))
            if names[j] == OPERATOR_CALL and kernel_of_event(names[j - 1]) is not None and not delegated[j - 1]
            and run[j] == run[j - 1] and chain[j] == chain[j - 1] and instr[j] == instr[j - 1]}


def chrome_trace(c: ETDumpColumns, source: TimeScale, target: TimeScale,
                 delegate_time_scale_converter: Callable | None = None) -> dict:
    """The ETDump's profile events as a Chrome trace (chrome://tracing, Perfetto): one track per run, with a second
    track for its delegate events that overlap others, times in microseconds (cycle counts kept as they are)."""
    rows = np.flatnonzero(c.has_profile)
    cycles = source == TimeScale.CYCLES
    to_us = 1.0 if cycles else time_scale_factor(source, TimeScale.US)
    target_to_us = 1.0 if cycles else time_scale_factor(target, TimeScale.US)
    start = c.start_time[rows].astype(np.float64) / to_us
    dur = elapsed_ticks(c.start_time[rows], c.end_time[rows]) / to_us
    did_str = c.delegate_id_str_code[rows]
    if "" in c.strings:
        did_str = np.where(did_str == c.strings.index(""), -1, did_str)
    delegated = (c.delegate_id_int[rows] != -1) | (did_str >= 0)
    names = np.array([*c.strings, ""], dtype=object)[c.name_code[rows]].tolist()
    ids: list = [None] * len(rows)
    for j in np.flatnonzero(delegated).tolist():
        did = int(c.delegate_id_int[rows[j]])
        ids[j] = did if did != -1 else c.strings[did_str[j]]
        if delegate_time_scale_converter is not None:
            s = delegate_time_scale_converter(str(ids[j]), int(c.start_time[rows[j]]))
            e = delegate_time_scale_converter(str(ids[j]), int(c.end_time[rows[j]]))
            start[j], dur[j] = s * target_to_us, (e - s) * target_to_us
    origin = float(np.nanmin(start)) if len(rows) else 0.0
    start -= origin
    run = c.run[rows]
    tid = run.astype(np.int64) * 2 + 1          # odd: the run's track, even: its stray delegate events
    for r in np.unique(run).tolist():
        in_run = run == r
        calls = np.flatnonzero(in_run & ~delegated & np.array([n == DELEGATE_CALL for n in names]))
        for j in np.flatnonzero(in_run & delegated).tolist():
            inside = (start[calls] <= start[j]) & (start[j] + dur[j] <= start[calls] + dur[calls])
            if not inside.any():
                tid[j] = r * 2 + 2

    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": _PID, "tid": 0,
                           "args": {"name": f"ETDump {c.what}"}}]
    for r, info in enumerate(c.runs):
        label = f"run {r}: {info.name or ''}"
        events.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": r * 2 + 1, "args": {"name": label}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": r * 2 + 1,
                       "args": {"sort_index": r * 2 + 1}})
        if (tid == r * 2 + 2).any():
            events.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": r * 2 + 2,
                           "args": {"name": f"{label} (delegate clock)"}})
    chain, instr = c.chain_index[rows].tolist(), c.instruction_id[rows].tolist()
    meta_len = c.metadata_len[rows].tolist()
    twins = _kernel_twins(names, run.tolist(), chain, instr, delegated.tolist())
    for j, (n, ts, d, t) in enumerate(zip(names, start.tolist(), dur.tolist(), tid.tolist())):
        if d != d or j in twins:  # NaN: start after end on a clock that cannot have wrapped
            continue
        args = {"chain_index": chain[j], "instruction_id": instr[j]}
        if ids[j] is not None:
            args["delegate_debug_identifier"] = ids[j]
        if meta_len[j]:
            args["delegate_metadata_bytes"] = meta_len[j]
        events.append({"name": str(ids[j]) if ids[j] is not None else n, "cat": _category(n, bool(delegated[j])),
                       "ph": "X", "ts": ts, "dur": d, "pid": _PID, "tid": t, "args": args})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": c.what, "clock": "cycles (shown as us)" if cycles else source.value,
                      "origin": origin},
    }


def write_chrome_trace(trace: dict, path) -> None:
    """Writes a Chrome trace as compact JSON, atomically (a viewer never opens half a file)."""
    write_atomic(path, json.dumps(trace, separators=(",", ":")).encode())
