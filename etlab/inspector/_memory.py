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
    # per block with allocation events: its allocation rows, the row each belongs to (-1: none) and names
    alloc_rows, owner_rows, names, block_of, run_of, load_of, order_of = [], [], [], [], [], [], []
    init_code = c.strings.index(METHOD_INIT) if METHOD_INIT in c.strings else -2
    runs_seen = 0
    for b, r in enumerate(c.runs):
        is_run = r.name != me.LOAD_BLOCK
        runs_seen += is_run
        sl = slice(r.first_event, r.first_event + r.num_events)
        if not c.has_allocation[sl].any():
            continue
        owners = np.asarray(me.owner_positions([_KINDS.get(k, "empty") for k in c.kind[sl].tolist()]), np.int64)
        mine = np.flatnonzero(c.has_allocation[sl])
        ids = c.allocator_id[r.first_event + mine].tolist()
        base = me.allocator_base(ids)
        names += [me.allocator_name(r.allocator_names, aid, base) for aid in ids]
        own = owners[mine]
        alloc_rows.append(r.first_event + mine)
        owner_rows.append(np.where(own >= 0, r.first_event + own, -1))
        block_of.append(np.full(len(mine), b, np.int64))
        run_of.append(np.full(len(mine), runs_seen - 1 if is_run else -1, np.int64))
        # which method's load: the n-th Method::init of the block the event belongs to
        inits = np.cumsum(c.has_profile[sl] & (c.name_code[sl] == init_code))
        load = np.where(own >= 0, inits[np.maximum(own, 0)] - 1, inits[-1])
        load_of.append(np.maximum(load, 0) if not is_run else np.full(len(mine), -1, np.int64))
        order_of.append(np.arange(len(mine), dtype=np.int64))
    if not alloc_rows:
        return pd.DataFrame({k: [] for k in FRAME_COLUMNS}).astype(_FRAME_TYPES)
    rows, own = np.concatenate(alloc_rows), np.concatenate(owner_rows)
    block, size = np.concatenate(block_of), c.allocation_size[rows]
    bad = np.flatnonzero(size >= np.uint64(1 << 63))
    if len(bad):
        raise FormatError(f"{c.what}: run block {int(block[bad[0]])}: an allocation event's size {int(size[bad[0]])} "
                          "is not a size (past 2**63 bytes)")
    size = size.astype(np.int64)
    parsed = {n: me.parse_allocator(n) for n in set(names)}
    owner = {n: owner_of(n) for n in parsed}
    p = [parsed[n] for n in names]
    has_owner = own >= 0
    safe = np.where(has_owner, own, 0)
    ev_code = np.where(has_owner, c.name_code[safe], -1)
    ev_names = [c.string(int(x)) for x in ev_code.tolist()]
    framework = ~has_owner | (c.chain_index[safe] < 0) | np.isin(
        ev_code, [c.strings.index(n) for n in FRAMEWORK_EVENT_NAMES if n in c.strings])
    run, load = np.concatenate(run_of), np.concatenate(load_of)
    df = pd.DataFrame({
        "block": block, "block_name": [c.runs[b].name for b in block.tolist()],
        "phase": np.where(run >= 0, "run", "load"), "run": pd.array(np.where(run >= 0, run, 0), "Int64"),
        "load": pd.array(np.where(load >= 0, load, 0), "Int64"), "order": np.concatenate(order_of),
        "allocator_id": c.allocator_id[rows].astype(np.int64), "allocator": names,
        "owner": [owner[n] for n in names], "kind": [x.kind for x in p], "mem_id": [x.mem_id for x in p],
        "backend": [x.backend for x in p], "what": [x.what for x in p], "size": size,
        "bytes": size * np.array([x.sign for x in p], dtype=np.int64),
        "chain": pd.array(np.where(framework, 0, c.chain_index[safe]), "Int64"),
        "instruction": pd.array(np.where(framework, 0, c.instruction_id[safe]), "Int64"),
        "event": ev_names, "op": [kernel_of_event(n) if n else None for n in ev_names],
    }, columns=FRAME_COLUMNS)
    df.loc[run < 0, "run"] = pd.NA
    df.loc[load < 0, "load"] = pd.NA
    df.loc[framework, ["chain", "instruction"]] = pd.NA
    return df.astype(_FRAME_TYPES)


_FRAME_TYPES = {"block": "int64", "run": "Int64", "load": "Int64", "order": "int64", "allocator_id": "int64",
                "mem_id": "Int64", "size": "int64", "bytes": "int64", "chain": "Int64", "instruction": "Int64"}


def _timeline(frame: pd.DataFrame, held: int) -> pd.DataFrame:
    """The tracked bytes at each instruction of each run: what load holds (`held`), plus the accumulated bytes
    so far in the run, plus the transient bytes of that instruction; one row per run and instruction with
    events, in the order the run reached them (vectorized over all runs at once)."""
    ev = frame[(frame["phase"] == "run") & ~frame["kind"].isin(MEASURED_KINDS)]
    cols = ["run", "instruction", "accumulated", "transient", "bytes"]
    if not len(ev):
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in cols})
    transient = ev["kind"].isin(TRANSIENT_KINDS).to_numpy()
    size = ev["bytes"].to_numpy()
    t = pd.DataFrame({"run": ev["run"].to_numpy(np.int64), "instruction": _steps(ev),
                      "grow": np.where(transient, 0, size), "transient": np.where(transient, size, 0)})
    t["accumulated"] = t.groupby("run", sort=False)["grow"].cumsum()
    out = t.groupby(["run", "instruction"], sort=False).agg(accumulated=("accumulated", "last"),
                                                            transient=("transient", "sum")).reset_index()
    out["bytes"] = held + out["accumulated"] + out["transient"]
    out = out.sort_values("run", kind="stable").reset_index(drop=True)
    return out[cols].astype("int64")


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
    if not len(frame):
        return pd.DataFrame(columns=PEAK_COLUMNS).astype({"run": "Int64"})
    f = frame.assign(step=_steps(frame)).reset_index(drop=True)
    run = f["phase"] == "run"
    transient = run & f["kind"].isin(TRANSIENT_KINDS)
    cumulative = run & ~f["kind"].isin((*TRANSIENT_KINDS, *MEASURED_KINDS))
    keys = ["block", "owner"]
    first = f.groupby(keys, sort=True).agg(block_name=("block_name", "first"), phase=("phase", "first"),
                                           run=("run", "first"), kind=("kind", "first"),
                                           total=("bytes", "sum"))
    first["bytes"], first["instruction"] = first["total"], -1
    tr = f[transient].groupby([*keys, "step"], sort=False)["bytes"].sum().reset_index()
    if len(tr):
        best = tr.loc[tr.groupby(keys, sort=False)["bytes"].idxmax()].set_index(keys)
        first.loc[best.index, "bytes"], first.loc[best.index, "instruction"] = best["bytes"], best["step"]
    cu = f[cumulative]
    if len(cu):
        cu = cu.assign(acc=cu.groupby(keys, sort=False)["bytes"].cumsum())
        best = cu.loc[cu.groupby(keys, sort=False)["acc"].idxmax()].set_index(keys)
        grew = best["acc"] > 0
        first.loc[best.index, "bytes"] = best["acc"].clip(lower=0)
        first.loc[best.index, "instruction"] = np.where(grew, best["step"], -1)
    out = first.reset_index()[PEAK_COLUMNS]
    return out.astype({"block": "int64", "run": "Int64", "bytes": "int64", "instruction": "int64"})


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


def memory_summary(c: ETDumpColumns, pte=None, method: str | None = None) -> MemorySummary:
    """The tracked peaks of a run (see the module docstring); `pte` (a PteFile) adds planned against observed."""
    frame = memory_frame(c)
    n_runs = sum(r.name != me.LOAD_BLOCK for r in c.runs)
    peaks = block_peaks(frame)
    owners = _owners(peaks)
    load_held = int(frame.loc[(frame["phase"] == "load") & ~frame["kind"].isin(MEASURED_KINDS), "bytes"].sum())
    timeline = _timeline(frame, load_held)
    peak, peak_run, peak_instr = load_held, None, None
    if len(timeline):
        k = int(timeline["bytes"].to_numpy().argmax())
        if int(timeline["bytes"].iat[k]) > peak:
            peak, peak_run = int(timeline["bytes"].iat[k]), int(timeline["run"].iat[k])
            instr = int(timeline["instruction"].iat[k])
            peak_instr = None if instr < 0 else instr
    measured = peaks[peaks["kind"].isin(MEASURED_KINDS)]

    def growth(phase: str, kind: str, how: str) -> int:
        got = measured.loc[(measured["phase"] == phase) & (measured["kind"] == kind), "bytes"]
        return int(getattr(got, how)()) if len(got) else 0

    phases = pd.DataFrame([
        {"phase": "load", "tracked_bytes": load_held, "rss_bytes": growth("load", me.RSS, "sum"),
         "peak_rss_bytes": growth("load", me.PEAK_RSS, "sum")},
        {"phase": "run", "tracked_bytes": peak - load_held if peak_run is not None else 0,
         "rss_bytes": growth("run", me.RSS, "max"), "peak_rss_bytes": growth("run", me.PEAK_RSS, "max")},
        {"phase": "load + run", "tracked_bytes": peak,
         "rss_bytes": growth("load", me.RSS, "sum") + growth("run", me.RSS, "max"),
         "peak_rss_bytes": growth("load", me.PEAK_RSS, "sum") + growth("run", me.PEAK_RSS, "sum")},
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
    blocks = [b for b, r in enumerate(c.runs) if r.name != me.LOAD_BLOCK]
    names = [c.runs[b].name for b in blocks]
    best_bytes = np.full(len(blocks), load_held, dtype=np.int64)
    best_instr = np.full(len(blocks), -1, dtype=np.int64)
    if len(timeline):
        top = timeline.loc[timeline.groupby("run", sort=False)["bytes"].idxmax()]
        runs = top["run"].to_numpy()
        higher = top["bytes"].to_numpy() > load_held
        best_bytes[runs[higher]] = top["bytes"].to_numpy()[higher]
        best_instr[runs[higher]] = top["instruction"].to_numpy()[higher]
    extra = pd.DataFrame({"block": np.asarray(blocks, dtype=np.int64), "block_name": names, "phase": "run",
                          "run": np.arange(len(blocks)), "owner": TRACKED, "kind": TRACKED, "bytes": best_bytes,
                          "instruction": best_instr}, columns=PEAK_COLUMNS).astype({"run": "Int64"})
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
