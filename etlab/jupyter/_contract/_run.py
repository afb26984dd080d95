"""The contract's replies about runs (ETDump files): the .etdp viewer (profile rows, timeline spans, run blocks,
observed memory, graphs with timings) and the two-run comparison. Column and Focus are the TableView's."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from ._files import Versioned
from ._graph import Graph
from ._program import MemoryBlock


class Column(TypedDict):
    """A TableView column."""

    key: str
    label: str
    numeric: bool


class Focus(TypedDict):
    """Which graph node a table row shows (by node name or debug handles, or instruction id)."""

    name: str | None
    handles: list[int]
    instruction: int | None


class ProfileRow(TypedDict):
    """One row of the run's profile table: an instruction's or delegate event's share of the time and its latency
    statistics."""

    name: str
    ops: str
    module: str
    backend: str
    share: float | None
    instruction: int | None
    p50: float | None
    avg: float | None
    min: float | None
    max: float | None
    runs: int
    source: str
    handles: list[int]
    focus: Focus | None


class Span(TypedDict):
    """One timed event of one run, from the run's start; depth 1: a backend's event inside its call."""

    run: int
    row: int
    start: float | None
    dur: float | None
    name: str
    handles: list[int]
    instruction: int | None
    delegated: bool
    kind: str
    depth: int


class RunSummary(TypedDict):
    """The whole-method timing of a run file: how many runs, the unit, and p50/min/max."""

    runs: int
    unit: str
    p50: float | None
    min: float | None
    max: float | None


class RunBlock(TypedDict):
    """One run block of an ETDump: its name and how many events of each kind it holds, and the span it covers in
    ticks."""

    name: str
    events: int
    profile_events: int
    debug_events: int
    span_ticks: int


class MemoryOwner(TypedDict):
    """One owner of a run's memory (etlab.inspector.MemorySummary.owners): bytes at load, its peak in a run."""

    owner: str
    kind: str
    load_bytes: int
    run_peak_bytes: int
    peak_bytes: int
    peak_run: int | None
    peak_instruction: int | None


class MemoryPhase(TypedDict):
    """Memory at one phase of a run (load, execute): bytes the tracker saw and the process's resident set."""

    phase: str
    tracked_bytes: int
    rss_bytes: int
    peak_rss_bytes: int


class MemoryStep(TypedDict):
    """Tracked bytes at one instruction of one run: held since load + accumulated + the instruction's own."""

    run: int
    instruction: int
    accumulated: int
    transient: int
    bytes: int


class ObservedMemory(TypedDict):
    """What the run's allocation events add up to (Inspector.memory_summary()); null without such events."""

    peak_bytes: int
    load_bytes: int
    peak_run: int | None
    peak_instruction: int | None
    runs: int
    owners: list[MemoryOwner]
    phases: list[MemoryPhase]
    timeline: list[MemoryStep]


class EtdpView(Versioned):
    """GET /etlab/api/view/etdp. paired: the kind of program joined; with an .etrecord its graphs come
    from a second request (graphs_pending, part=graphs); memory*: the plan of a .pte of the program;
    observed_memory: the run's allocation events added up."""

    blocks: list[RunBlock]
    unit: str
    columns: list[Column]
    rows: list[ProfileRow]
    spans: list[Span]
    runs: int
    summary: RunSummary
    graphs: list[Graph]
    paired: Literal["pte", "etrecord"] | None
    graphs_pending: bool
    memory: NotRequired[list[MemoryBlock]]
    steps: NotRequired[int]
    memory_source: NotRequired[str]
    observed_memory: ObservedMemory | None
    program: str | None
    mismatch: str | None
    candidates: list[str]
    programs: list[str]


class EtdpGraphs(TypedDict):
    """GET /etlab/api/view/etdp?part=graphs: the ETRecord's graphs with the run's timings."""

    graphs: list[Graph]
    program: str | None
    path: NotRequired[str]
    size: NotRequired[int]
    mtime_ns: NotRequired[str]


class CompareRow(TypedDict):
    """A row of a two-run comparison: an instruction's p50 in A and B, the difference and ratio, and the node it
    shows."""

    name: str
    instruction: int | None
    ops: str
    p50_a: float | None
    p50_b: float | None
    delta: float | None
    ratio: float | None
    focus: Focus | None


class CompareView(TypedDict):
    """GET /etlab/api/compare: per-op p50 of run b against run a (graphs: the .pte's, colored by B / A)."""

    a: str
    b: str
    unit: str
    columns: list[Column]
    rows: list[CompareRow]
    graphs: list[Graph]
    warning: str | None
