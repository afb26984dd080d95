"""What the Inspector needs from an ETRecord, and how it joins that with the ETDump's events.

The ETRecord (`etlab.etrecord`) produces a `ProgramInfo` (defined there, the lower layer, and
re-exported by etlab.inspector); the Inspector needs nothing else from it. Runtime events carry
(chain index, instruction id) and, inside delegates, a delegate debug identifier; the
ProgramInfo maps those to debug handles, and debug handles to the graph nodes (op type, stack
trace, module hierarchy) they came from.

Accepted as `Inspector(etrecord=...)`: a ProgramInfo; any object with a `program_info()` method
returning one (the ETRecord class); or a path, read with `etlab.etrecord.read_program_info` (what
`parse_etrecord(path).program_info()` gives, without importing torch until a graph or tensor is used).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo
from etlab.inspector._frames import upstream_node_keys
from etlab.schema.etdump import DELEGATE_CALL, FRAMEWORK_EVENT_NAMES

__all__ = ["DebugHandle", "DelegateInfo", "JoinedColumns", "MethodInfo", "OpInfo", "ProgramInfo", "in_module",
           "join_block", "resolve_program_info"]

log = logging.getLogger(__name__)


def _is_program_info(obj) -> bool:
    duck = hasattr(obj, "methods") and callable(getattr(obj, "method_for_block", None))
    return isinstance(obj, ProgramInfo) or duck


def resolve_program_info(etrecord) -> ProgramInfo | None:
    """The ProgramInfo of an Inspector's etrecord argument: as given, read from a path (torch imported only if a
    graph is used), or from an object's program_info(); None without one, a TypeError for anything else."""
    if etrecord is None or _is_program_info(etrecord):
        return etrecord
    if isinstance(etrecord, (str, os.PathLike)):
        try:
            from etlab.etrecord import read_program_info
        except ImportError:
            raise RuntimeError(f"{etrecord}: reading ETRecord files needs etlab.etrecord, which this "
                               "installation does not have") from None
        # parse_etrecord(path).program_info(), but torch is imported only if a graph or tensor is used
        return read_program_info(etrecord)
    if callable(getattr(etrecord, "program_info", None)):
        info = etrecord.program_info()
        if not _is_program_info(info):
            raise TypeError(f"etrecord.program_info() returned {type(info).__name__}, expected ProgramInfo")
        return info
    raise TypeError(f"etrecord must be a path, a ProgramInfo or an object with program_info(); "
                    f"got {type(etrecord).__name__}")


@dataclass
class JoinedColumns:
    """Per event of one block: what the ETRecord says about it.

    Events of one instruction (every run's, a kernel's and its OPERATOR_CALL) and instructions of
    one decomposed op (an LSTM's hundreds of nodes share a handle) say the same: the op types and
    the stack-trace / module dicts are made once per handle set (`_NodeFacts`). The Event objects'
    dicts (by graph node name) are shared by the events of a handle set: a copy per event was 40 s of
    a vocoder's numeric gap, whose 72,000 events each name the same 12,000 unrolled GRU nodes. The
    frame's (keyed as upstream's, `frame_dicts`) are new at each `to_dataframe()`, one pair per handle
    set: a cell changed in one frame changes neither the Inspector nor another frame, only the rows of
    that frame that ran the same nodes (a copy per row was a quarter of a 2-layer bidirectional LSTM's
    Inspector time: 975 rows each naming the same 546 unrolled nodes)."""

    debug_handles: list  # per event: int (a kernel's one handle, as upstream), a tuple, or None
    num_outputs: list[int]
    op_types: list[list[str]]
    backend_names: list
    # per event: the unique handles its dicts are made from (None: empty dicts)
    handle_sets: list = field(default_factory=list)
    facts: _NodeFacts | None = None
    _plain: tuple[list[dict], list[dict]] | None = None

    def _dicts(self, make, copy: bool) -> tuple[list[dict], list[dict]]:
        traces, hierarchy = [], []
        copies: dict[tuple, tuple[dict, dict]] = {}  # with `copy`: one pair per handle set, made here
        for hs in self.handle_sets:
            if hs is None:
                traces.append({})
                hierarchy.append({})
                continue
            pair = copies.get(hs) if copy else None
            if pair is None:
                pair = make(hs)
                if copy:
                    pair = copies[hs] = (pair[0].copy(), pair[1].copy())
            traces.append(pair[0])
            hierarchy.append(pair[1])
        return traces, hierarchy

    def _plain_dicts(self) -> tuple[list[dict], list[dict]]:
        if self._plain is None:
            self._plain = self._dicts(self.facts.dicts, copy=False)
        return self._plain

    @property
    def stack_traces(self) -> list[dict]:
        """Per event: {graph node name: stack trace} of the nodes it ran."""
        return self._plain_dicts()[0]

    @property
    def module_hierarchy(self) -> list[dict]:
        """Per event: {graph node name: nn_module_stack} of the nodes it ran."""
        return self._plain_dicts()[1]

    def frame_dicts(self) -> tuple[list[dict], list[dict]]:
        """stack_traces and module_hierarchy per event keyed as upstream's frames key them (graph node
        name + "_", `_frames.upstream_node_keys`): new dicts at each call, shared by the events of one
        handle set."""
        return self._dicts(self.facts.keyed, copy=True)


class _NodeFacts:
    """One method's ops, looked up per handle set and cached (see JoinedColumns)."""

    def __init__(self, method: MethodInfo):
        self.ops = method.ops
        self._types: dict[tuple, list[str]] = {}
        self._dicts: dict[tuple, tuple[dict, dict]] = {}
        self._keyed: dict[tuple, tuple[dict, dict]] = {}

    def op_types(self, occurrences: tuple) -> list[str]:
        """An op type per node per occurrence of each handle (repeats included, as upstream counts them)."""
        got = self._types.get(occurrences)
        if got is None:
            ops = self.ops
            got = self._types[occurrences] = [op.op_type for h in occurrences for op in ops.get(h, ())]
        return got

    def dicts(self, unique: tuple) -> tuple[dict, dict]:
        """{node name: stack trace}, {node name: module hierarchy}, first node of a name winning."""
        got = self._dicts.get(unique)
        if got is None:
            traces, hierarchy = {}, {}
            for h in unique:
                for op in self.ops.get(h, ()):
                    if op.name not in traces:
                        traces[op.name] = op.stack_trace
                        hierarchy[op.name] = op.module_hierarchy
            got = self._dicts[unique] = (traces, hierarchy)
        return got

    def keyed(self, unique: tuple) -> tuple[dict, dict]:
        got = self._keyed.get(unique)
        if got is None:
            traces, hierarchy = self.dicts(unique)
            got = self._keyed[unique] = (upstream_node_keys(traces), upstream_node_keys(hierarchy))
        return got


def _delegate_handles(delegate: DelegateInfo, ident):
    got = delegate.debug_handles.get(ident)
    if got is None:  # ids may have been stored as str (or int) on the other side
        alt = str(ident) if isinstance(ident, int) else (int(ident) if str(ident).lstrip("-").isdigit() else None)
        got = delegate.debug_handles.get(alt) if alt is not None else None
    return got


def _handle_as_identifier(ident, covered) -> tuple[int, ...] | None:
    """A delegate without a debug-identifier map (upstream's XNNPACK records an empty one) whose
    events are keyed by the Edge nodes' own debug handles: an integer id that is one of the
    handles the delegate call covers is that node."""
    h = ident if isinstance(ident, int) else (int(ident) if str(ident).lstrip("-").isdigit() else None)
    return (h,) if h is not None and h in {int(c) for c in covered or ()} else None


def _positions(names: list[str], chain_index, instruction_id, is_delegated, calls: dict) -> dict[int, tuple | None]:
    """Event index -> the handles of the delegate node it is (its position among its call's events,
    `_delegate_nodes`), for the calls in `calls` whose event count is a multiple of their node count."""
    by_call: dict[tuple[int, int], list[int]] = {}
    for j, (ch, ins) in enumerate(zip(chain_index.tolist(), instruction_id.tolist())):
        if is_delegated[j] and (ch, ins) in calls:
            by_call.setdefault((ch, ins), []).append(j)
    out: dict[int, tuple | None] = {}
    for key, events in by_call.items():
        nodes = calls[key]
        if nodes and len(events) % len(nodes) == 0:
            out.update((j, nodes[k % len(nodes)]) for k, j in enumerate(events))
    return out


def join_block(method: MethodInfo, names: list[str], chain_index: np.ndarray, instruction_id: np.ndarray,
               delegate_id: list, is_delegated: np.ndarray, node_calls: dict | None = None) -> JoinedColumns:
    """What the ETRecord says about each event of a block. `node_calls` ((chain, instruction) ->
    per-node handles of a delegate call, from the program's .pte: `_delegate_nodes`) places the events
    of delegates the ETRecord has no debug map for."""
    m = len(names)
    positional = _positions(names, chain_index, instruction_id, is_delegated, node_calls) if node_calls else {}
    facts = _NodeFacts(method)
    out = JoinedColumns([None] * m, [1] * m, [[] for _ in range(m)], [None] * m, [None] * m, facts)
    debug_handles = method.instruction_debug_handles
    num_outputs = method.instruction_num_outputs
    delegates = method.delegates
    all_occurrences = getattr(method, "instruction_handle_occurrences", None) or {}
    for j, (nm, ch, ins) in enumerate(zip(names, chain_index.tolist(), instruction_id.tolist())):
        if nm in FRAMEWORK_EVENT_NAMES:
            continue
        key = (ch, ins)
        handles = debug_handles.get(key)
        if handles is None:
            continue
        out.num_outputs[j] = num_outputs.get(key, 1)
        delegate = delegates.get(key)
        if delegate is not None:
            out.backend_names[j] = delegate.backend_name
        occurrences = all_occurrences.get(key)
        if is_delegated[j]:
            occurrences = None
            if delegate is None:
                log.warning("no delegate map for the delegate called by instruction %s of chain %s", ins, ch)
            else:
                covered, handles = handles, _delegate_handles(delegate, delegate_id[j])
                if handles is None and not delegate.debug_handles:
                    handles = _handle_as_identifier(delegate_id[j], covered)
                if handles is None and j in positional:
                    handles = positional[j]
        elif nm != DELEGATE_CALL:
            out.backend_names[j] = None
        if handles is None:
            continue
        handles = tuple(int(h) for h in handles)
        unique = tuple(dict.fromkeys(handles))
        # as upstream's Inspector gives them: a kernel's one handle as an int, else the sequence
        kernel = not is_delegated[j] and nm != DELEGATE_CALL
        out.debug_handles[j] = unique[0] if kernel and len(unique) == 1 else unique
        # repeats included: an op type per occurrence, as upstream counts them
        out.op_types[j] = list(facts.op_types(tuple(occurrences) if occurrences else handles))
        out.handle_sets[j] = unique
    return out


def in_module(hierarchy: dict | None, module_name: str) -> bool:
    """Whether an op's nn_module_stack names `module_name`, as a key or a module path."""
    if not hierarchy:
        return False
    for key, val in hierarchy.items():
        path = val[0] if isinstance(val, (tuple, list)) and val else val
        if module_name == key or module_name == path:
            return True
    return False
