"""Memory as it ran: an ETDump's allocation events as a table, and the peaks they add up to.

The meaning of allocator names, which instruction an event belongs to and where load-time events
live are `etlab.facts.memory_events`' facts; this module only reads them:

- `memory_frame(columns)`: one row per allocation event (allocator x instruction x run): the block,
  load or run, the allocator and its owner kind, the instruction (and its event) it belongs to, the
  size as written and the signed bytes (`:released` allocators shrink what they count).
- `memory_summary(columns, pte=None)` -> `MemorySummary`: peak bytes per owner (each planned arena,
  the method allocator, temporaries, each delegate, unplanned tensors), load against run, the
  observed bytes at each instruction of each run (`timeline`), the process's RSS growth as measured
  beside them, and with the program's plan (a `.pte`) planned against observed: each arena's declared
  size and lower bound against the bytes live with the sizes that ran, and each planned tensor's
  declared upper bound against the sizes it ran with (from logged outputs).

How an owner's bytes add up over a run: temporaries and what a delegate declares while it runs are
held during their instruction only (the peak is the largest at one instruction); everything else
(unplanned tensors, arenas allocated late, other writers' allocators such as upstream's bump
allocators) accumulates over the run in event order, its peak the largest running total.
What was allocated at load is held throughout. The tracked peak of a run is load bytes plus, at
each instruction, the accumulated bytes and the transient bytes of that instruction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from etlab.errors import FormatError
from etlab.etdump import ETDumpColumns, EventKind
from etlab.facts import display
from etlab.facts import memory_events as me
from etlab.facts.pte_memory import ELEMENT_BYTES, instructions, memory_plan
from etlab.schema.etdump import FRAMEWORK_EVENT_NAMES, METHOD_INIT, kernel_of_event

# Measurements of the process beside the tracked allocators, not owners of memory.
MEASURED_KINDS = (me.RSS, me.PEAK_RSS)
# Held during their instruction only (see the module docstring).
TRANSIENT_KINDS = (me.TEMP, me.DELEGATE)

FRAME_COLUMNS = ["block", "block_name", "phase", "run", "load", "order", "allocator_id", "allocator", "owner",
                 "kind", "mem_id", "backend", "what", "size", "bytes", "chain", "instruction", "event", "op"]
_KINDS = {EventKind.PROFILE: "profile", EventKind.DEBUG: "debug", EventKind.ALLOCATION: "allocation"}


def owner_of(name: str | None) -> str:
    """The owner an allocator's bytes count for: each planned / shared arena ("planned:0"), each delegate
    ("delegate:XnnpackBackend"), the method allocator, temporaries, unplanned tensors, "rss" /
    "peak_rss"; another writer's allocator is its own owner (its name)."""
    p = me.parse_allocator(name)
    if p.kind in (me.PLANNED, me.SHARED):
        return f"{p.kind}:{p.mem_id}"
    if p.kind == me.DELEGATE:
        return f"{me.DELEGATE}:{p.backend}"
    if p.kind == "other":
        return name if name else "<unnamed allocator>"
    return p.kind


def memory_frame(c: ETDumpColumns) -> pd.DataFrame:
    """One row per allocation event of the ETDump, in file order (see FRAME_COLUMNS and the module docstring).

    run: the n-th run block (None in the load block); load: the n-th `Method::init` of the load block the
    event belongs to (one per method loaded; None in run blocks); instruction/chain: of the profile event
    the allocation belongs to, None when that is a framework event (a load, a whole run) or there is none.
    """
    rows: dict[str, list] = {k: [] for k in FRAME_COLUMNS}
    runs_seen = 0
    for b, r in enumerate(c.runs):
        phase = "load" if r.name == me.LOAD_BLOCK else "run"
        run_index = None if phase == "load" else runs_seen
        runs_seen += phase == "run"
        sl = slice(r.first_event, r.first_event + r.num_events)
        if not c.has_allocation[sl].any():
            continue
        kinds = [_KINDS.get(int(k), "empty") for k in c.kind[sl].tolist()]
        owners = me.owner_positions(kinds)
        first = r.first_event
        alloc_rows = [first + i for i, k in enumerate(kinds) if k == "allocation"]
        ids = c.allocator_id[alloc_rows].tolist()
        base = me.allocator_base(ids)
        init_code = c.strings.index(METHOD_INIT) if METHOD_INIT in c.strings else -2
        init_before = np.cumsum(c.has_profile[sl] & (c.name_code[sl] == init_code))
        for order, (row, aid) in enumerate(zip(alloc_rows, ids)):
            name = me.allocator_name(r.allocator_names, aid, base)
            parsed = me.parse_allocator(name)
            own = owners[row - first]
            ev_name = c.string(int(c.name_code[first + own])) if own >= 0 else None
            framework = own < 0 or ev_name in FRAMEWORK_EVENT_NAMES or int(c.chain_index[first + own]) < 0
            size = int(c.allocation_size[row])
            if size >= 1 << 63:
                raise FormatError(f"{c.what}: run block {b}: an allocation event's size {size} is not a size "
                                  "(past 2**63 bytes)")
            inits = int(init_before[own]) - 1 if own >= 0 else int(init_before[-1])
            rows["block"].append(b)
            rows["block_name"].append(r.name)
            rows["phase"].append(phase)
            rows["run"].append(run_index)
            rows["load"].append(max(inits, 0) if phase == "load" else None)
            rows["order"].append(order)
            rows["allocator_id"].append(aid)
            rows["allocator"].append(name)
            rows["owner"].append(owner_of(name))
            rows["kind"].append(parsed.kind)
            rows["mem_id"].append(parsed.mem_id)
            rows["backend"].append(parsed.backend)
            rows["what"].append(parsed.what)
            rows["size"].append(size)
            rows["bytes"].append(parsed.sign * size)
            rows["chain"].append(None if framework else int(c.chain_index[first + own]))
            rows["instruction"].append(None if framework else int(c.instruction_id[first + own]))
            rows["event"].append(ev_name)
            rows["op"].append(kernel_of_event(ev_name) if ev_name else None)
    df = pd.DataFrame(rows, columns=FRAME_COLUMNS)
    return df.astype({"block": "int64", "run": "Int64", "load": "Int64", "order": "int64", "allocator_id": "int64",
                      "mem_id": "Int64", "size": "int64", "bytes": "int64", "chain": "Int64", "instruction": "Int64"})


def _transient(kind: str, phase: str) -> bool:
    return phase == "run" and kind in TRANSIENT_KINDS


def _run_timeline(events: pd.DataFrame, held: int) -> pd.DataFrame:
    """The tracked bytes at each instruction of one run: what load holds (`held`), plus the accumulated
    bytes so far, plus the transient bytes of that instruction; one row per instruction with events."""
    ev = events[~events["kind"].isin(MEASURED_KINDS)]
    if not len(ev):
        return pd.DataFrame(columns=["instruction", "accumulated", "transient", "bytes"])
    transient = ev["kind"].isin(TRANSIENT_KINDS).to_numpy()
    acc = np.cumsum(np.where(transient, 0, ev["bytes"].to_numpy()))
    steps = ev["instruction"].astype("float64").fillna(-1).astype(np.int64).to_numpy()
    out = pd.DataFrame({"instruction": steps, "accumulated": acc,
                        "transient": np.where(transient, ev["bytes"].to_numpy(), 0)})
    out = out.groupby("instruction", sort=False).agg(accumulated=("accumulated", "last"),
                                                     transient=("transient", "sum")).reset_index()
    out["bytes"] = held + out["accumulated"] + out["transient"]
    return out


@dataclass
class MemorySummary:
    """What `Inspector.memory_summary()` returns (see etlab.inspector._memory): tables, and the tracked peak.

    owners: one row per owner: load bytes, the run peak (largest over runs), both together, and the run
    and instruction of that peak. phases: load against run (tracked bytes and the measured RSS growth).
    timeline: tracked bytes at each instruction of each run. blocks: each owner's bytes per block (`block_peaks`)
    and each run's tracked peak (owner "tracked"), what a fleet stores per run. arenas / tensors: planned against
    observed (empty without the program's plan). peak_bytes: load plus the largest run peak (at peak_run,
    peak_instruction; None when no run allocated).
    """

    owners: pd.DataFrame
    phases: pd.DataFrame
    timeline: pd.DataFrame
    arenas: pd.DataFrame = field(default_factory=pd.DataFrame)
    tensors: pd.DataFrame = field(default_factory=pd.DataFrame)
    peak_bytes: int = 0
    load_bytes: int = 0
    peak_run: int | None = None
    peak_instruction: int | None = None
    runs: int = 0
    blocks: pd.DataFrame = field(default_factory=pd.DataFrame)

    def _repr_html_(self) -> str | None:
        return display.html(self)

    def __repr__(self) -> str:
        where = "" if self.peak_run is None else f" (run {self.peak_run}, instruction {self.peak_instruction})"
        return (f"MemorySummary: tracked peak {self.peak_bytes:,} bytes{where}, {self.load_bytes:,} at load, "
                f"{len(self.owners)} owners over {self.runs} run(s)")


PEAK_COLUMNS = ["block", "block_name", "phase", "run", "owner", "kind", "bytes", "instruction"]
TRACKED = "tracked"  # the owner label of a run's tracked peak in `MemorySummary.blocks` (load bytes included)


def _steps(ev: pd.DataFrame) -> np.ndarray:
    return ev["instruction"].astype("float64").fillna(-1).to_numpy().astype(np.int64)


def block_peaks(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per block and owner: at load its bytes, in a run its peak there (a transient owner's most at
    one instruction, another's largest running total, at least 0; a measurement's growth over the block)
    and the instruction of that peak (-1: none, or the block as a whole)."""
    rows = []
    for (block, owner), ev in frame.groupby(["block", "owner"], sort=True):
        kind, phase, run = ev["kind"].iloc[0], ev["phase"].iloc[0], ev["run"].iloc[0]
        steps = _steps(ev)
        if phase == "run" and kind in TRANSIENT_KINDS:
            sums = ev["bytes"].groupby(steps, sort=False).sum()
            peak, at = int(sums.max()), int(sums.idxmax())
        elif phase == "run" and kind not in MEASURED_KINDS:
            acc = ev["bytes"].cumsum().to_numpy()
            k = int(np.argmax(acc))
            peak, at = (int(acc[k]), int(steps[k])) if acc[k] > 0 else (0, -1)
        else:
            peak, at = int(ev["bytes"].sum()), -1
        rows.append({"block": int(block), "block_name": ev["block_name"].iloc[0], "phase": phase, "run": run,
                     "owner": owner, "kind": kind, "bytes": peak, "instruction": at})
    return pd.DataFrame(rows, columns=PEAK_COLUMNS).astype({"run": "Int64"})


def _owners(peaks: pd.DataFrame) -> pd.DataFrame:
    rows = []
    tracked = peaks[~peaks["kind"].isin((*MEASURED_KINDS, TRACKED))]
    for owner, ev in tracked.groupby("owner", sort=False):
        load = int(ev.loc[ev["phase"] == "load", "bytes"].sum())
        runs = ev[(ev["phase"] == "run") & (ev["bytes"] > 0)]
        best = runs.loc[runs["bytes"].idxmax()] if len(runs) else None
        rows.append({"owner": owner, "kind": ev["kind"].iloc[0], "load_bytes": load,
                     "run_peak_bytes": 0 if best is None else int(best["bytes"]),
                     "peak_bytes": load + (0 if best is None else int(best["bytes"])),
                     "peak_run": None if best is None else int(best["run"]),
                     "peak_instruction": None if best is None or best["instruction"] < 0 else int(best["instruction"])})
    order = {k: i for i, k in enumerate((*me.OWNER_KINDS, "other"))}
    df = pd.DataFrame(rows, columns=["owner", "kind", "load_bytes", "run_peak_bytes", "peak_bytes", "peak_run",
                                     "peak_instruction"])
    df = df.iloc[sorted(range(len(df)), key=lambda i: (order.get(df["kind"].iat[i], 99), df["owner"].iat[i]))]
    return df.reset_index(drop=True).astype({"peak_run": "Int64", "peak_instruction": "Int64"})


def _measured(frame: pd.DataFrame, phase: str, kind: str, run=None) -> int:
    sel = (frame["phase"] == phase) & (frame["kind"] == kind)
    if run is not None:
        sel &= frame["run"] == run
    return int(frame.loc[sel, "bytes"].sum())


def memory_summary(c: ETDumpColumns, pte=None, method: str | None = None) -> MemorySummary:
    """The tracked peaks of a run (see the module docstring); `pte` (a PteFile) adds planned against observed."""
    frame = memory_frame(c)
    n_runs = sum(r.name != me.LOAD_BLOCK for r in c.runs)
    peaks = block_peaks(frame)
    owners = _owners(peaks)
    load_held = int(frame.loc[(frame["phase"] == "load") & ~frame["kind"].isin(MEASURED_KINDS), "bytes"].sum())
    parts = []
    for run, ev in frame[frame["phase"] == "run"].groupby("run", sort=True):
        t = _run_timeline(ev, load_held)
        if len(t):
            parts.append(t.assign(run=int(run)))
    timeline = (pd.concat(parts, ignore_index=True) if parts else
                pd.DataFrame(columns=["instruction", "accumulated", "transient", "bytes", "run"]))
    timeline = timeline[["run", "instruction", "accumulated", "transient", "bytes"]].astype("int64")
    peak, peak_run, peak_instr = load_held, None, None
    if len(timeline):
        k = int(timeline["bytes"].to_numpy().argmax())
        if int(timeline["bytes"].iat[k]) > peak:
            peak, peak_run = int(timeline["bytes"].iat[k]), int(timeline["run"].iat[k])
            instr = int(timeline["instruction"].iat[k])
            peak_instr = None if instr < 0 else instr
    run_ids = sorted(int(r) for r in frame.loc[frame["phase"] == "run", "run"].dropna().unique())

    def run_max(kind: str) -> int:
        return max((_measured(frame, "run", kind, r) for r in run_ids), default=0)

    phases = pd.DataFrame([
        {"phase": "load", "tracked_bytes": load_held, "rss_bytes": _measured(frame, "load", me.RSS),
         "peak_rss_bytes": _measured(frame, "load", me.PEAK_RSS)},
        {"phase": "run", "tracked_bytes": peak - load_held if peak_run is not None else 0,
         "rss_bytes": run_max(me.RSS), "peak_rss_bytes": run_max(me.PEAK_RSS)},
        {"phase": "load + run", "tracked_bytes": peak,
         "rss_bytes": _measured(frame, "load", me.RSS) + run_max(me.RSS),
         "peak_rss_bytes": _measured(frame, "load", me.PEAK_RSS) + _measured(frame, "run", me.PEAK_RSS)},
    ])
    summary = MemorySummary(owners=owners, phases=phases, timeline=timeline, peak_bytes=peak, load_bytes=load_held,
                            peak_run=peak_run, peak_instruction=peak_instr, runs=n_runs,
                            blocks=_with_tracked(peaks, timeline, c, load_held))
    if pte is not None:
        summary.arenas, summary.tensors = planned_vs_observed(c, pte, frame, method)
    return summary


def _with_tracked(peaks: pd.DataFrame, timeline: pd.DataFrame, c: ETDumpColumns, load_held: int) -> pd.DataFrame:
    """`peaks` and, for every run block, its tracked peak (owner TRACKED): the load bytes plus the most the run
    added at one instruction (a run without allocation events: the load bytes)."""
    rows, runs_seen = [], 0
    for b, r in enumerate(c.runs):
        if r.name == me.LOAD_BLOCK:
            continue
        mine = timeline[timeline["run"] == runs_seen]
        k = int(mine["bytes"].to_numpy().argmax()) if len(mine) else -1
        best = int(mine["bytes"].iat[k]) if k >= 0 else load_held
        rows.append({"block": b, "block_name": r.name, "phase": "run", "run": runs_seen, "owner": TRACKED,
                     "kind": TRACKED, "bytes": max(best, load_held),
                     "instruction": int(mine["instruction"].iat[k]) if k >= 0 and best > load_held else -1})
        runs_seen += 1
    extra = pd.DataFrame(rows, columns=PEAK_COLUMNS).astype({"run": "Int64"})
    return pd.concat([peaks, extra], ignore_index=True) if len(peaks) else extra


# -- planned against observed -------------------------------------------------------------------


def _plan_of(pte, method: str | None):
    plans = list(pte.program.execution_plan or ())
    if not plans:
        raise ValueError("the .pte has no methods")
    if method is None:
        return plans[0]
    for p in plans:
        if str(p.name) == method:
            return p
    raise ValueError(f"the .pte has no method {method!r}; methods are {sorted(str(p.name) for p in plans)}")


def ran_shapes(c: ETDumpColumns) -> dict[tuple[int, int], list[list[list[int]]]]:
    """(chain, instruction) -> per run, the shapes of the tensors its logged output held (intermediate
    outputs; program outputs and non-tensor values left out), with their element bytes as the last item."""
    out: dict[tuple[int, int], list] = {}
    if c.values is None:
        return out
    v = c.values
    debug_rows = np.flatnonzero(c.has_debug & ~c.has_profile)
    all_debug = np.flatnonzero(c.has_debug)
    pos = {int(r): j for j, r in enumerate(all_debug.tolist())}
    for row in debug_rows.tolist():
        chain = int(c.chain_index[row])
        j = pos[row]
        if chain < 0 or v.is_output[j] or not v.present[j]:
            continue
        idx = [int(v.tensor[j])] if v.tensor[j] >= 0 else list(v.tensor_list[j] or [])
        shapes = [[*v.tensors.shape(i), ELEMENT_BYTES.get(int(v.tensors.scalar_type[i]), 1)] for i in idx]
        if shapes:
            out.setdefault((chain, int(c.instruction_id[row])), []).append(shapes)
    return out


def _nbytes(shape_and_elem: list[int]) -> int:
    n = 1
    for s in shape_and_elem[:-1]:
        n *= max(int(s), 0)
    return n * shape_and_elem[-1]


def _covered(blocks: list[tuple[int, int]]) -> int:
    """Bytes covered by [offset, offset + size) intervals (a view and its base count once)."""
    total, end = 0, -1
    for off, size in sorted(blocks):
        lo, hi = max(off, end), off + size
        if hi > lo:
            total += hi - lo
        end = max(end, hi)
    return total


def planned_vs_observed(c: ETDumpColumns, pte, frame: pd.DataFrame | None = None, method: str | None = None
                        ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(arenas, tensors): per memory id the declared arena, the bytes the load allocated for it, the plan's
    lower bound (most bytes live at once at declared sizes) and the most live with the sizes that ran;
    per planned tensor written by an instruction that logged its output, the declared upper bound
    against the largest size it ran with (`dynamic`: they differ)."""
    plan = _plan_of(pte, method)
    frame = memory_frame(c) if frame is None else frame
    blocks = memory_plan(plan)
    steps = instructions(plan)
    chain_start, k = [], 0
    for ch in plan.chains or ():
        chain_start.append(k)
        k += len(ch.instructions or ())
    inputs = {int(i) for i in plan.inputs or ()}
    shapes = ran_shapes(c)
    ran_bytes: dict[int, int] = {}
    trows = []
    written: dict[int, list] = {}
    for b in blocks:
        if b.value not in inputs:
            written.setdefault(b.first, []).append(b)
    for (chain, instr), per_run in sorted(shapes.items()):
        if not 0 <= chain < len(chain_start):
            continue
        step = chain_start[chain] + instr
        outs = sorted(written.get(step, []), key=lambda b: b.value)
        for i, b in enumerate(outs):
            got = [run[i] for run in per_run if len(run) == len(outs)]
            if not got:
                continue
            largest = max(got, key=_nbytes)
            ran_bytes[b.value] = _nbytes(largest)
            trows.append({"value": b.value, "mem_id": b.memory_id, "instruction": instr, "chain": chain,
                          "dtype": b.dtype, "declared_shape": tuple(b.shape), "declared_bytes": b.size,
                          "ran_shape": tuple(largest[:-1]), "ran_bytes": ran_bytes[b.value], "runs": len(got),
                          "dynamic": tuple(b.shape) != tuple(largest[:-1])})
    tensors = pd.DataFrame(trows, columns=["value", "mem_id", "instruction", "chain", "dtype", "declared_shape",
                                           "declared_bytes", "ran_shape", "ran_bytes", "runs", "dynamic"])
    sizes = [int(s) for s in plan.non_const_buffer_sizes or ()]
    arows = []
    for m in sorted({b.memory_id for b in blocks}):
        mine = [b for b in blocks if b.memory_id == m]
        declared_peak = observed_peak = 0
        for step in range(max(len(steps), 1)):
            live = [b for b in mine if b.first <= step <= b.last]
            declared_peak = max(declared_peak, _covered([(b.offset, b.size) for b in live]))
            observed_peak = max(observed_peak, _covered([(b.offset, ran_bytes.get(b.value, b.size)) for b in live]))
        loaded = frame.loc[frame["kind"].isin((me.PLANNED, me.SHARED)) & (frame["mem_id"] == m) &
                           (frame["phase"] == "load"), "bytes"]
        arows.append({"mem_id": m, "arena_bytes": sizes[m] if m < len(sizes) else None,
                      "allocated_bytes": int(loaded.sum()) if len(loaded) else None,
                      "lower_bound": declared_peak, "observed_peak": observed_peak,
                      "observed_share": observed_peak / sizes[m] if m < len(sizes) and sizes[m] else None})
    arenas = pd.DataFrame(arows, columns=["mem_id", "arena_bytes", "allocated_bytes", "lower_bound", "observed_peak",
                                          "observed_share"])
    arenas = arenas.astype({"arena_bytes": "Int64", "allocated_bytes": "Int64"})
    return arenas, tensors
