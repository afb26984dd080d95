"""The JSON the server extension answers, as TypedDicts: the one contract between etlab/jupyter and the
JupyterLab extension. `_contract_ts` generates labextension/src/contract.d.ts from this module (never
edited by hand; `make labextension` regenerates it, a test checks it is current) and `check` holds a
value to these types (the tests run it on what every endpoint answers for real files).

Only the standard library here: the generator runs before etlab is installed. Python's int and float
are both TypeScript's `number`; a non-finite float is sent as null (`_store.clean_json`), hence
`float | None` wherever a measurement may be missing or NaN.
"""

from __future__ import annotations

import types
import typing
from typing import Literal, NotRequired, TypedDict, Union

# --- shared pieces -------------------------------------------------------------------------------------


class Versioned(TypedDict):
    """The file a view was read from, relative to the server root, and its version (the reload check)."""

    path: str
    size: int
    mtime_ns: str  # nanoseconds as text: beyond a JavaScript number's exact range


class Stat(Versioned):
    """GET /etlab/api/stat."""


class ErrorReply(TypedDict):
    """What every endpoint answers instead when the file, path or request is bad (with a 4xx/5xx status)."""

    error: str


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


class OperatorCount(TypedDict):
    """How many kernel calls of one operator a method's instructions make."""

    name: str
    calls: int


class DelegateCount(TypedDict):
    """How many delegate calls of one delegate (by index and backend) a method makes."""

    index: int
    backend: str
    calls: int


class MethodSummary(TypedDict):
    """One method of a program: its values, operators with call counts, delegates and arenas."""

    name: str
    inputs: list[str]
    outputs: list[str]
    instructions: int
    values: int
    operators: list[OperatorCount]
    delegates: list[DelegateCount]
    arena_bytes: list[int]
    constant_bytes: int


class MemoryBlock(TypedDict):
    """One planned tensor (etlab.facts.pte_memory.PlannedBlock): its arena, place and live steps."""

    value: int
    memory_id: int
    offset: int
    size: int
    first: int
    last: int
    shape: list[int]
    dtype: str


# --- graphs (etlab.visualizer.GraphModel.to_json, drawn by static/graph_view.js) -------------------------


class Latency(TypedDict):
    """A node's or row's latency statistics over the runs (in the run's time unit; null when missing or not finite)."""

    p50: float | None
    p10: float | None
    p90: float | None
    avg: float | None
    min: float | None
    max: float | None
    runs: int
    events: NotRequired[list[str]]  # the events whose time it is
    shared: NotRequired[int]  # how many nodes share an event's time
    note: NotRequired[str]  # how a delegate call's time was divided among its nodes


class GraphNode(TypedDict):
    """A node of a drawn graph (etlab.visualizer.GraphNode as JSON): what it computes, its group, debug handles,
    shapes and the overlays' values."""

    id: int
    name: str
    kind: Literal["op", "input", "output", "delegate", "control_flow"]
    op: str
    group: str | None
    handles: list[int]
    shapes: list[list[int]]
    dtypes: list[str]
    bytes: int | None
    module: str
    module_type: str
    source: str
    stack_trace: str
    backend: str | None
    weights: list[str]
    latency: Latency | None
    gap: float | None


class GraphGroup(TypedDict):
    """A box of a drawn graph: an nn.Module scope or a delegated partition (etlab.visualizer.GraphGroup as JSON)."""

    id: str
    label: str
    kind: Literal["module", "delegate"]
    parent: str | None
    module_type: str
    backend: str | None


class Graph(TypedDict):
    """One graph; `layout` is placement data only graph_view.js reads (JSON text in the notebook widget,
    data here; visualizer/_layout.py documents it)."""

    title: str
    kind: Literal["aten", "edge", "runtime"]
    method: str
    nodes: list[GraphNode]
    edges: list[list[int]]
    groups: list[GraphGroup]
    backend_colors: dict[str, str]
    time_unit: str
    gap_metric: str
    latency_center: float | None
    layout: dict[str, object] | str


# --- delegation (_delegation.delegation_view) ---------------------------------------------------------


class BackendShare(TypedDict):
    """What one backend took: its partitions and the nodes in them."""

    backend: str
    partitions: int
    nodes: int


class LeftOutNode(TypedDict):
    """A node no backend took, with the partitioner's reason and hint, its module and source line."""

    node: str
    op: str
    reason: str
    hint: str
    module: str
    source: str
    handle: int | None


class RefusalGroup(TypedDict):
    """The nodes left out for one category of reason, with the group's full count (`nodes` may be capped)."""

    category: str
    count: int
    nodes: list[LeftOutNode]


class Delegation(TypedDict):
    """What each backend took and why nodes were left out; `source` names the ETRecord it is from."""

    method: str
    delegated_nodes: int
    left_out: int
    backends: list[BackendShare]
    groups: list[RefusalGroup]
    unexplained: list[LeftOutNode]
    unexplained_count: int
    source: str


# --- the viewers ---------------------------------------------------------------------------------------


class PteView(Versioned):
    """GET /etlab/api/view/pte. A program without methods has only methods (empty), graph (null), memory,
    signature, segments."""

    methods: list[MethodSummary]
    graph: Graph | None
    memory: list[MemoryBlock]
    signature: str
    segments: int
    version: NotRequired[int]
    segment_bytes: NotRequired[int]
    method: NotRequired[str]
    steps: NotRequired[int]
    delegation: Delegation | None


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


class ModuleRow(TypedDict):
    """A row of the ETRecord viewer's module tree: a module or delegate group, its depth and how many nodes it holds."""

    id: str
    label: str
    kind: str
    type: str
    depth: int
    nodes: int


class DelegateAt(TypedDict):
    """Which backend the delegate call at a runtime instruction runs."""

    instruction: int
    backend: str


class EtrecordView(Versioned):
    """GET /etlab/api/view/etrecord."""

    methods: list[str]
    method: str
    kinds: list[str]
    graphs: list[Graph]
    modules: list[ModuleRow]
    instructions: int
    delegates: list[DelegateAt]
    signature: str
    delegation: Delegation | None


class BundledValue(TypedDict):
    """A bundled input or expected output: a tensor (dtype, shape, bytes, first numbers) or a scalar."""

    kind: Literal["tensor", "int", "bool", "double", "none"]
    dtype: NotRequired[str]
    shape: NotRequired[list[int]]
    bytes: NotRequired[int]
    preview: NotRequired[list[float]]
    value: NotRequired[float | bool]


class BundledCase(TypedDict):
    """One bundled test case as the viewer lists it: its inputs and expected outputs."""

    index: int
    inputs: list[BundledValue]
    expected: list[BundledValue]


class BundledSuite(TypedDict):
    """The test cases of one method of a bundled program."""

    method: str
    cases: list[BundledCase]


class Tolerance(TypedDict):
    """The relative and absolute tolerance an output check used."""

    rtol: float
    atol: float


class BpteView(Versioned):
    """GET /etlab/api/view/bpte."""

    version: int
    program_bytes: int
    methods: list[MethodSummary]
    suites: list[BundledSuite]
    signature: str
    tolerance: Tolerance


class OutputVerdict(TypedDict):
    """One output's check: whether it matched, how far off (max abs diff, mismatched elements), and why not."""

    index: int
    ok: bool
    max_abs_diff: float | None
    mismatched: int
    numel: int
    problem: str | None
    text: str


class CaseVerdict(TypedDict):
    """One test case's verdict, with the tolerance used and each output's check."""

    method: str
    index: int
    ok: bool
    rtol: float
    atol: float
    outputs: list[OutputVerdict]


class VerifyReport(TypedDict):
    """POST /etlab/api/verify: each bundled test case's verdict at the tolerance named."""

    file: str
    passed: bool
    rtol: float
    atol: float
    default_rtol: float
    default_atol: float
    cases: list[CaseVerdict]


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


class ArtifactFile(TypedDict):
    """A file the artifacts browser lists: its kind, size, time, the program it belongs to, and an error when it does
    not read."""

    path: str
    kind: Literal["pte", "etdp", "etrecord", "bpte", "ptd"]
    size: int
    mtime: float
    program: str | None
    error: str | None


class ArtifactGroup(TypedDict):
    """The artifacts of one program (a .pte with its runs, records and bundles), or of none."""

    program: str | None
    files: list[ArtifactFile]


class Artifacts(TypedDict):
    """GET /etlab/api/artifacts: the files under a folder grouped by program hash (runs join theirs)."""

    folder: str
    groups: list[ArtifactGroup]
    truncated: bool


# Every reply type, in the order the generated .d.ts lists them (the types they use come first there).
REPLIES = (Stat, ErrorReply, PteView, EtdpView, EtdpGraphs, EtrecordView, BpteView, VerifyReport, CompareView,
           Artifacts)


# --- checking a value against the contract ---------------------------------------------------------------


try:
    from etlab.errors import Error as _EtlabError

    _BASES: tuple[type, ...] = (_EtlabError, ValueError)
except ImportError:  # loaded by path by the .d.ts generator (_contract_ts.py), where etlab need not be installed
    _BASES = (ValueError,)


class ContractError(*_BASES):
    """A value that is not what the contract says; the message names where (`view.rows[3].p50`)."""


def _hints(td) -> dict:
    return typing.get_type_hints(td, include_extras=True)


def is_typeddict(tp) -> bool:
    """Whether `tp` is a TypedDict class (what the contract checker and the .d.ts generator walk into)."""
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def fields(td) -> list[tuple[str, object, bool]]:
    """A TypedDict's fields in order: (name, type, required)."""
    out = []
    for name, tp in _hints(td).items():
        required = True
        if typing.get_origin(tp) is NotRequired:
            tp, required = typing.get_args(tp)[0], False
        out.append((name, tp, required and name in td.__required_keys__))
    return out


def check(value, tp, where: str = "value") -> None:
    """Raises ContractError unless `value` (parsed JSON, or what will be sent as JSON) is of type `tp`;
    a TypedDict allows no keys it does not name."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is object:
        return
    if tp is type(None) or tp is None:
        if value is not None:
            raise ContractError(f"{where}: expected null, got {type(value).__name__}")
        return
    if origin in (Union, types.UnionType):
        errors = []
        for option in args:
            try:
                check(value, option, where)
                return
            except ContractError as e:
                errors.append(str(e))
        raise ContractError(" / ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ContractError(f"{where}: expected one of {list(args)}, got {value!r}")
        return
    if origin is list:
        if not isinstance(value, list):
            raise ContractError(f"{where}: expected a list, got {type(value).__name__}")
        for i, x in enumerate(value):
            check(x, args[0], f"{where}[{i}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        for k, x in value.items():
            check(k, args[0], f"{where} key")
            check(x, args[1], f"{where}[{k!r}]")
        return
    if is_typeddict(tp):
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected a {tp.__name__} object, got {type(value).__name__}")
        known = fields(tp)
        extra = set(value) - {name for name, _, _ in known}
        if extra:
            raise ContractError(f"{where}: keys the contract ({tp.__name__}) does not name: {sorted(extra)}")
        for name, ftp, required in known:
            if name in value:
                check(value[name], ftp, f"{where}.{name}")
            elif required:
                raise ContractError(f"{where}: no {name!r} ({tp.__name__} requires it)")
        return
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"{where}: the contract uses a type check() does not know: {tp!r}")
    if not ok:
        raise ContractError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {str(value)[:40]!r}")
