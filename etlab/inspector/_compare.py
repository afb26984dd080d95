"""Two runs side by side: per-op latency and numeric deltas of run B against run A.

The situation users meet most: one model compiled two ways (portable vs delegated, float vs
quantized, two builds) or one program run in two places (etlab's host runtime vs a device's
ETDump). `compare(a, b)` joins the two Inspectors' events into rows:

- by debug handle (the default) when an event knows the graph nodes it ran: events of the two
  runs sharing any handle (transitively) form one row, so a delegate event covering three nodes
  of the Edge graph meets the three kernels that run them in a portable build, and their
  latencies are added up per run before the median is taken;
- by module + op when the two builds' handles do not line up (a float build and its quantized
  build have different graphs), or always with `by="module"`: ops pair by their module path,
  operator and order in the source model, quantize/dequantize ops attached to the op they wrap
  (`etlab.inspector._compare_join`); each row says how it was joined (`CompareRow.join`);
- events without handles (no ETRecord on that side) are joined by block, event name, delegate
  id and occurrence, which pairs the events of two runs of the same program (and of two builds
  that run the same op sequence);
- `by="instruction"` joins every event by (block, instruction id, name, delegate id) instead.

Latency: the median over runs (runs of same-named blocks pooled). Numerics: where both sides
logged the output of the row's last node (a quantize's integer codes dequantized with its scale and
zero point), max-abs difference, relative L2 difference, SQNR of B against A and cosine similarity
(etlab.inspector's `snr` and `cosine_similarity`), and the relative error the row added to what its
inputs carried (`added_error`: where a difference starts rather than where it is inherited).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from etlab.facts import display
from etlab.inspector._compare_join import Rejoin, added_errors, key_label
from etlab.inspector._compare_numeric import _numerics
from etlab.inspector._rollups import _handles, _innermost_module, _source, event_label
from etlab.schema.etdump import DELEGATE_CALL, FRAMEWORK_EVENT_NAMES, METHOD_EXECUTE, OPERATOR_CALL

JOIN_KINDS = ("debug_handle", "module", "instruction")  # what callers ask for; "event" is the fallback below
EXECUTE = METHOD_EXECUTE


@dataclass
class _Unit:
    """One event of one side, its runs pooled over the blocks of the same name."""

    block: str
    order: int                     # execution order on its side
    name: str
    label: str
    instruction: int | None
    delegate_id: Any
    handles: tuple[int, ...]
    op_types: list[str]
    nodes: list[str]
    module: str
    source: str
    is_delegated: bool
    backend: str | None
    raw: list[float]
    outputs: list
    num_outputs: int
    links: list = field(default_factory=list)      # join keys (debug handle or module + op), see _compare_join
    role: str = "op"                               # "in": dequantizes an input of its op; "out": quantizes its output
    qparams: tuple[float, int] | None = None       # (scale, zero point) of a quantize's integer output
    notes: list[str] = field(default_factory=list)


@dataclass
class CompareRow:
    """One op (or group of ops) of the program and how run B differs from run A there."""

    key: str                        # "#9" (debug handles) or "Execute/native_call_add.out#0"
    block: str
    present: str                    # "both", "a" or "b"
    handles: tuple[int, ...]
    ops: list[str]                  # operator types (from the ETRecord), else event names
    nodes: list[str]                # graph node names
    module: str
    source: str
    events_a: list[str]
    events_b: list[str]
    instructions_a: list[int]
    instructions_b: list[int]
    backend_a: str | None
    backend_b: str | None
    delegated: bool                 # an event a backend logged inside a delegate call (not the call itself)
    latency_a: float | None         # median over runs of the summed events, in `Comparison.unit`
    latency_b: float | None
    runs_a: int
    runs_b: int
    delta: float | None             # latency_b - latency_a
    ratio: float | None             # latency_b / latency_a
    max_abs: float | None = None    # max |B - A| over the row's output
    relative: float | None = None   # ||B - A|| / ||A||
    sqnr: float | None = None       # dB, B against A (inf: identical)
    cosine: float | None = None
    numeric_note: str = ""          # why no numeric delta, when there is none
    op_mismatch: bool = False       # joined by handle, but the two sides ran disjoint op types there
    join: str = ""                  # "debug_handle", "module+op", "event", "instruction" or "unmatched"
    join_note: str = ""             # what a reader should know about the join (a folded batch norm, ...)
    added_error: float | None = None  # relative error minus the largest of its input rows': introduced here
    # each side's own debug handles (a module + op row joins different handles of two different graphs)
    handles_a: tuple[int, ...] = ()
    handles_b: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """The row's ops, short ("convolution, hardtanh"), else its events."""
        short = [o.split(".")[1] if o.count(".") >= 2 else o for o in self.ops]
        return ", ".join(dict.fromkeys(short)) or ", ".join(self.events_a or self.events_b)


@dataclass
class CompareSummary:
    """Whole-run numbers: total latency (Method::execute median, else the rows' sum), row counts,
    the rows that moved most and the rows whose outputs differ most."""

    total_a: float | None
    total_b: float | None
    total_delta: float | None
    total_ratio: float | None
    matched: int
    only_a: int
    only_b: int
    compared_outputs: int
    worst_latency: list[str] = field(default_factory=list)   # row keys, largest |delta| first
    worst_numeric: list[str] = field(default_factory=list)   # row keys, lowest SQNR first
    max_abs: float | None = None
    min_sqnr: float | None = None
    # rows joined by a debug handle that names different ops on the two sides: the builds' Edge
    # graphs differ (a quantized build adds q/dq nodes), and handles only line up on the same graph
    mismatched: int = 0
    matched_pct: float | None = None                          # rows in both, % of all rows
    joins: dict[str, int] = field(default_factory=dict)       # rows per join kind (CompareRow.join)
    worst_added: list[str] = field(default_factory=list)      # row keys, largest added error first
    max_added_error: float | None = None
    biggest_latency: str | None = None                        # "key (±delta)", the row that moved most
    biggest_numeric: str | None = None                        # "key (+added error)", where numbers moved most

    def text(self, unit: str) -> str:
        """One paragraph for a terminal or a notebook note."""
        fmt = lambda v: "–" if v is None else f"{v:.4g}"
        joined = ", ".join(f"{n} {k}" if k == "unmatched" else f"{n} by {k}" for k, n in self.joins.items() if n)
        parts = [f"total {fmt(self.total_a)} → {fmt(self.total_b)} {unit}"
                 + (f" (B/A {self.total_ratio:.3f}×)" if self.total_ratio is not None else ""),
                 f"{self.matched} rows in both, {self.only_a} only in A, {self.only_b} only in B"
                 + (f" ({self.matched_pct:.0f}% matched: {joined})" if self.matched_pct is not None and joined
                    else "")]
        if self.biggest_latency:
            parts.append(f"biggest latency change {self.biggest_latency}")
        if self.biggest_numeric:
            parts.append(f"biggest numeric change {self.biggest_numeric}")
        if self.compared_outputs:
            parts.append(f"{self.compared_outputs} outputs compared: max |B-A| {fmt(self.max_abs)}, "
                         f"min SQNR {fmt(self.min_sqnr)} dB")
        else:
            parts.append("no intermediate outputs to compare (give both debug buffers)")
        if self.mismatched:
            parts.append(f"{self.mismatched} rows join ops of different types under one debug handle: the two "
                         "builds' graphs differ, so their handles do not line up (compare by event or instruction)")
        return "; ".join(parts) + "."


@dataclass
class Comparison:
    """Run B against run A, per op: see `etlab.inspector.Inspector.compare`."""

    name_a: str
    name_b: str
    by: str                          # the join used: "debug_handle", "instruction" or "event" (by name)
    unit: str
    rows: list[CompareRow]
    summary: CompareSummary
    inspector_a: Any = field(default=None, repr=False, compare=False)
    inspector_b: Any = field(default=None, repr=False, compare=False)

    @property
    def only_in_a(self) -> list[CompareRow]:
        """The ops run A has and run B lacks (removed, or renamed so they did not pair)."""
        return [r for r in self.rows if r.present == "a"]

    @property
    def only_in_b(self) -> list[CompareRow]:
        """The ops run B has and run A lacks."""
        return [r for r in self.rows if r.present == "b"]

    def top(self, n: int = 10, by: str = "latency") -> list[CompareRow]:
        """The n rows that differ most: by |latency delta| ("latency"), lowest SQNR ("numeric") or
        largest error added over their inputs' ("added": where a numeric difference starts)."""
        if by == "latency":
            rows = [r for r in self.rows if r.delta is not None]
            return sorted(rows, key=lambda r: -abs(r.delta))[:n]
        if by == "numeric":
            rows = [r for r in self.rows if r.sqnr is not None]
            return sorted(rows, key=lambda r: (r.sqnr, -(r.max_abs or 0.0)))[:n]
        if by == "added":
            rows = [r for r in self.rows if r.added_error is not None]
            return sorted(rows, key=lambda r: -r.added_error)[:n]
        raise ValueError(f"top: by must be 'latency', 'numeric' or 'added', got {by!r}")

    def to_dataframe(self):
        """One row per CompareRow (lists as lists; handles as a tuple)."""
        import pandas as pd

        return pd.DataFrame([{"label": r.label, **asdict(r)} for r in self.rows],
                            columns=["label", *CompareRow.__dataclass_fields__])

    def to_dict(self) -> dict:
        """JSON-ready: names, unit, summary and rows (non-finite numbers as None)."""
        return _json_safe({"a": self.name_a, "b": self.name_b, "by": self.by, "unit": self.unit,
                           "summary": asdict(self.summary),
                           "rows": [{"label": r.label, **asdict(r)} for r in self.rows]})

    def show(self, **kwargs):
        """The comparison view (table, latency chart, graph colored by ratio or numeric delta)."""
        return display.show(self, **kwargs)  # etlab.visualizer registers it

    def save_html(self, path, **kwargs):
        """Writes the comparison view as one offline HTML file."""
        return self.show(**kwargs).save_html(path)

    def _repr_html_(self) -> str | None:
        return display.html(self)

    def __repr__(self) -> str:
        return (f"Comparison({self.name_a!r} vs {self.name_b!r}, by {self.by}: {len(self.rows)} rows; "
                f"{self.summary.text(self.unit)})")


# -- helpers ------------------------------------------------------------------------------------------


def _json_safe(v):
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _median(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(vals)) if vals else None


# -- the join -----------------------------------------------------------------------------------------


def _execute_blocks(inspector) -> list:
    blocks = inspector.event_blocks
    run = [b for b in blocks if b.name != "Default"]
    return run or blocks


def _delegate_rest(inspector, block, call, inner: list) -> dict | None:
    """What a DELEGATE_CALL stands for beyond its backend's own events: the handles no inner event
    covers (ops the backend ran without logging them) with the call's time minus the inner events'
    per run; None when the inner events cover every handle."""
    covered = {h for e in inner for h in _handles(e.debug_handles)}
    rest = tuple(h for h in _handles(call.debug_handles) if h not in covered)
    if not rest:
        return None
    raw = list(call.perf_data.raw) if call.perf_data is not None else []
    timed = [e.perf_data.raw for e in inner if e.perf_data is not None]
    if raw and all(len(r) == len(raw) for r in timed):
        raw = list(np.asarray(raw) - np.sum(np.asarray(timed, dtype=np.float64).reshape(-1, len(raw)), axis=0))
    else:
        raw = []
    program = inspector.program_info
    method = program.method_for_block(block.name) if program is not None else None
    ops = [op for h in rest for op in (method.ops.get(h, ()) if method is not None else ())]
    return {"handles": rest, "raw": raw, "op_types": [op.op_type for op in ops], "nodes": [op.name for op in ops],
            "label": f"{DELEGATE_CALL} (ops its backend did not log)"}


def _units(inspector, by: str) -> tuple[list[_Unit], list[float]]:
    """(events as units, Method::execute durations) of one side."""
    pooled: dict[tuple, _Unit] = {}
    execute: list[float] = []
    order = 0
    for block in _execute_blocks(inspector):
        inner: dict[int, list] = {}
        for e in block.events:
            if e.is_delegated_op and e.debug_handles:
                inner.setdefault(e.instruction_id, []).append(e)
        for e in block.events:
            if e.name == EXECUTE and e.perf_data is not None:
                execute += list(e.perf_data.raw)
            if e.name in FRAMEWORK_EVENT_NAMES or e.name == OPERATOR_CALL:
                continue
            if e.perf_data is None and not e.debug_data:
                continue
            facts = {"handles": _handles(e.debug_handles), "raw": list(e.perf_data.raw) if e.perf_data else [],
                     "op_types": list(e.op_types), "nodes": list(e.stack_traces), "label": event_label(e)}
            if by in ("debug_handle", "module") and e.name == DELEGATE_CALL and e.instruction_id in inner:
                # the backend's own events stand for the call, op by op; the call keeps what they miss
                facts = _delegate_rest(inspector, block, e, inner[e.instruction_id])
                if facts is None:
                    continue
            key = (block.name, e.instruction_id, e.name, str(e.delegate_debug_identifier), e.chain_index)
            if key in pooled:
                pooled[key].raw += facts["raw"]
                continue
            pooled[key] = _Unit(
                block=block.name, order=order, name=e.name, label=facts["label"], instruction=e.instruction_id,
                delegate_id=e.delegate_debug_identifier, handles=facts["handles"], op_types=facts["op_types"],
                nodes=facts["nodes"], module=_innermost_module(e.module_hierarchy),
                source=_source(e.stack_traces), is_delegated=bool(e.is_delegated_op),
                backend=e.delegate_backend_name, raw=facts["raw"], outputs=list(e.debug_data or []),
                num_outputs=e.num_outputs)
            order += 1
    return list(pooled.values()), execute


def _groups(units_a: list[_Unit], units_b: list[_Unit], by: str) -> list[tuple[str, list[_Unit], list[_Unit]]]:
    """(key, A units, B units) per row: units sharing a join key (a debug handle or a module + op
    key, `_Unit.links`) are one row; the rest pair by their name key."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent.setdefault(i, i) != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    every = [("a", u) for u in units_a] + [("b", u) for u in units_b]
    owner: dict[tuple, int] = {}
    seen: dict[tuple, int] = {}
    for i, (side, u) in enumerate(every):
        find(i)
        if by in ("debug_handle", "module") and u.links:
            for k in u.links:
                if k in owner:
                    parent[find(i)] = find(owner[k])
                else:
                    owner[k] = i
            continue
        if by == "instruction":
            k = (u.block, u.instruction, u.name, str(u.delegate_id))
        else:
            base = (u.block, u.name, str(u.delegate_id))
            n = seen[(side, *base)] = seen.get((side, *base), -1) + 1
            k = (*base, n)
        k = ("name", *k)
        if k in owner:
            parent[find(i)] = find(owner[k])
        else:
            owner[k] = i
    groups: dict[int, tuple[list, list]] = {}
    for i, (side, u) in enumerate(every):
        a, b = groups.setdefault(find(i), ([], []))
        (a if side == "a" else b).append(u)
    out = []
    for a, b in groups.values():
        first = (a or b)[0]
        handles = sorted({h for u in a + b for h in u.handles})
        by_module = [k for u in a + b for k in u.links if k[0] == "m"]
        if by_module:
            key = key_label(min(by_module, key=lambda k: (k[2] != first.module, k)))
        elif handles and by in ("debug_handle", "module"):
            key = "#" + ",".join(map(str, handles)) if len(handles) <= 3 else f"#{handles[0]}…{handles[-1]}"
        else:
            occurrence = sum(1 for u in (units_a if a else units_b) if u.name == first.name and u.order < first.order)
            key = f"{first.block}/{first.label}#{occurrence}"
        out.append((key, a, b))
    return out


def _latency(units: list[_Unit]) -> tuple[float | None, int]:
    """Median over runs of the units' summed durations (sum of medians if their run counts differ)."""
    timed = [u.raw for u in units if u.raw]
    if not timed:
        return None, 0
    runs = {len(r) for r in timed}
    if len(runs) == 1:
        return _median(list(np.sum(np.asarray(timed, dtype=np.float64), axis=0))), runs.pop()
    return float(sum(np.median(r) for r in timed)), min(runs)


def _disjoint_ops(a: list[_Unit], b: list[_Unit]) -> bool:
    """Both sides know their op types here and share none of them."""
    ops_a = {o for u in a for o in u.op_types}
    ops_b = {o for u in b for o in u.op_types}
    return bool(ops_a and ops_b) and not (ops_a & ops_b)


def _join_kind(a: list[_Unit], b: list[_Unit], by: str) -> str:
    """How a row's two sides were joined."""
    if not (a and b):
        return "unmatched"
    links = [k for u in a + b for k in u.links]
    if not links:
        return by if by in ("instruction", "event") else "event"
    return "module+op" if any(k[0] == "m" for k in links) else "debug_handle"


def _row(key: str, a: list[_Unit], b: list[_Unit]) -> CompareRow:
    units = a + b
    first = units[0]
    lat_a, runs_a = _latency(a)
    lat_b, runs_b = _latency(b)
    both = lat_a is not None and lat_b is not None
    ops = list(dict.fromkeys(o for u in units for o in u.op_types)) or list(dict.fromkeys(u.name for u in units))
    return CompareRow(
        key=key, block=first.block, present="both" if a and b else "a" if a else "b",
        handles=tuple(sorted({h for u in units for h in u.handles})), ops=ops,
        nodes=list(dict.fromkeys(n for u in units for n in u.nodes)),
        module=next((u.module for u in units if u.module), ""), source=next((u.source for u in units if u.source), ""),
        events_a=[u.label for u in a], events_b=[u.label for u in b],
        instructions_a=sorted({u.instruction for u in a if u.instruction is not None}),
        instructions_b=sorted({u.instruction for u in b if u.instruction is not None}),
        backend_a=next((u.backend for u in a if u.backend), None),
        backend_b=next((u.backend for u in b if u.backend), None),
        delegated=any(u.is_delegated for u in units),
        latency_a=lat_a, latency_b=lat_b, runs_a=runs_a, runs_b=runs_b,
        delta=lat_b - lat_a if both else None,
        ratio=lat_b / lat_a if both and lat_a > 0 else None,
        op_mismatch=_disjoint_ops(a, b),
        join_note="; ".join(dict.fromkeys(n for u in units for n in u.notes)),
        handles_a=tuple(sorted({h for u in a for h in u.handles})),
        handles_b=tuple(sorted({h for u in b for h in u.handles})),
    )


def _summary(rows: list[CompareRow], exec_a: list[float], exec_b: list[float]) -> CompareSummary:
    if exec_a and exec_b:
        total_a, total_b = _median(exec_a), _median(exec_b)
    else:  # no Method::execute events: the rows both sides timed
        both = [r for r in rows if r.delta is not None]
        total_a = sum(r.latency_a for r in both) if both else None
        total_b = sum(r.latency_b for r in both) if both else None
    numeric = [r for r in rows if r.sqnr is not None]
    moved = sorted((r for r in rows if r.delta is not None), key=lambda r: -abs(r.delta))
    worst_numeric = sorted((r for r in numeric if r.max_abs), key=lambda r: (r.sqnr, -r.max_abs))
    added = sorted((r for r in rows if r.added_error), key=lambda r: -r.added_error)
    joins = {k: sum(r.join == k for r in rows) for k in dict.fromkeys(r.join for r in rows)}
    return CompareSummary(
        total_a=total_a, total_b=total_b,
        total_delta=total_b - total_a if total_a is not None and total_b is not None else None,
        total_ratio=total_b / total_a if total_a and total_b is not None else None,
        matched=sum(r.present == "both" for r in rows), only_a=sum(r.present == "a" for r in rows),
        only_b=sum(r.present == "b" for r in rows), compared_outputs=len(numeric),
        worst_latency=[r.key for r in moved[:5]], worst_numeric=[r.key for r in worst_numeric[:5]],
        max_abs=max((r.max_abs for r in numeric), default=None),
        min_sqnr=min((r.sqnr for r in numeric), default=None),
        mismatched=sum(r.op_mismatch for r in rows),
        matched_pct=100.0 * sum(r.present == "both" for r in rows) / len(rows) if rows else None,
        joins=joins, worst_added=[r.key for r in added[:5]],
        max_added_error=added[0].added_error if added else None,
        biggest_latency=f"{moved[0].key} ({moved[0].delta:+.4g})" if moved and moved[0].delta else None,
        biggest_numeric=f"{added[0].key} (+{added[0].added_error:.3g} relative error)" if added else None,
    )


def _link(units: list[_Unit], side: str, rejoin: Rejoin) -> None:
    """Gives each unit with debug handles its join keys, role, quantize parameters and notes."""
    for u in units:
        if not u.handles:
            continue
        m = rejoin.method(u.block)
        u.links = m.links(side, u.block, u.handles)
        u.role = m.role(side, u.handles)
        u.qparams = m.qparams(side, u.handles) if u.role != "in" else None
        u.notes = m.notes(side, m.linking(side, u.handles))


def _row_inputs(groups: list, rejoin: Rejoin) -> list[set[int]]:
    """Per row (in `groups` order), the indices of the rows holding the ops that feed its ops."""
    row_of = {k: i for i, (_, ua, ub) in enumerate(groups) for u in ua + ub for k in u.links}
    out = []
    for i, (_, ua, ub) in enumerate(groups):
        feeding = {row_of.get(k) for side, units in (("a", ua), ("b", ub)) for u in units if u.role == "op"
                   for h in u.handles for k in rejoin.method(u.block).inputs(side, u.block, h)}
        out.append({j for j in feeding if j is not None and j != i})
    return out


def compare(a, b, *, by: str = "debug_handle", name_a: str = "A", name_b: str = "B") -> Comparison:
    """Run B (Inspector `b`) against run A (Inspector `a`), per op; see the module docstring."""
    from etlab.inspector._rollups import time_unit

    if by not in JOIN_KINDS:
        raise ValueError(f"compare: by must be one of {JOIN_KINDS}, got {by!r}")
    unit_a, unit_b = time_unit(a), time_unit(b)
    if unit_a != unit_b:
        raise ValueError(f"compare: the Inspectors report different time units ({unit_a} vs {unit_b}); "
                         "create both with the same target_time_scale")
    units_a, exec_a = _units(a, by)
    units_b, exec_b = _units(b, by)
    if by != "instruction" and not (any(u.handles for u in units_a) and any(u.handles for u in units_b)):
        by = "event"  # a side without an ETRecord has no handles: pair the events by name instead
        units_a, exec_a = _units(a, by)
        units_b, exec_b = _units(b, by)
    rejoin = Rejoin(a, b, force_module=by == "module") if by in ("debug_handle", "module") else None
    if rejoin is not None:
        _link(units_a, "a", rejoin)
        _link(units_b, "b", rejoin)
        by = "debug_handle" if rejoin.by_handle else "module+op"
    groups = _groups(units_a, units_b, "module" if rejoin is not None else by)
    rank_a = {id(u): u.order for u in units_a}
    rank_b = {id(u): u.order for u in units_b}
    groups.sort(key=lambda g: (0, min(rank_a[id(u)] for u in g[1])) if g[1] else (1, min(rank_b[id(u)] for u in g[2])))
    rows = []
    for key, ua, ub in groups:
        row = _row(key, sorted(ua, key=lambda u: u.order), sorted(ub, key=lambda u: u.order))
        row.join = _join_kind(ua, ub, by)
        row.op_mismatch = row.op_mismatch and row.join == "debug_handle"  # module + op rows differ by design
        if ua and ub:
            _numerics(row, ua, ub)
        rows.append(row)
    if rejoin is not None:
        added_errors(rows, _row_inputs(groups, rejoin))
    return Comparison(name_a=name_a, name_b=name_b, by=by, unit=unit_a, rows=rows,
                      summary=_summary(rows, exec_a, exec_b), inspector_a=a, inspector_b=b)
