"""What the Inspector needs from an ETRecord, and how it joins that with the ETDump's events.

The ETRecord (`etlab.etrecord`) produces a `ProgramInfo` (defined there, the lower layer, and
re-exported by etlab.inspector); the Inspector needs nothing else from it. Runtime events carry
(chain index, instruction id) and, inside delegates, a delegate debug identifier; the
ProgramInfo maps those to debug handles, and debug handles to the graph nodes (op type, stack
trace, module hierarchy) they came from.

Accepted as `Inspector(etrecord=...)`: a ProgramInfo; any object with a `program_info()` method
returning one (the ETRecord class); or a path, read with `etlab.etrecord.parse_etrecord`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo
from etlab.schema.etdump import DELEGATE_CALL, FRAMEWORK_EVENT_NAMES

__all__ = ["DebugHandle", "DelegateInfo", "JoinedColumns", "MethodInfo", "OpInfo", "ProgramInfo", "in_module",
           "join_block", "resolve_program_info"]

log = logging.getLogger(__name__)


def _is_program_info(obj) -> bool:
    duck = hasattr(obj, "methods") and callable(getattr(obj, "method_for_block", None))
    return isinstance(obj, ProgramInfo) or duck


def resolve_program_info(etrecord) -> ProgramInfo | None:
    if etrecord is None or _is_program_info(etrecord):
        return etrecord
    if isinstance(etrecord, (str, os.PathLike)):
        try:
            from etlab.etrecord import parse_etrecord
        except ImportError:
            raise RuntimeError(f"{etrecord}: reading ETRecord files needs etlab.etrecord, which this "
                               "installation does not have") from None
        etrecord = parse_etrecord(etrecord)
    if callable(getattr(etrecord, "program_info", None)):
        info = etrecord.program_info()
        if not _is_program_info(info):
            raise TypeError(f"etrecord.program_info() returned {type(info).__name__}, expected ProgramInfo")
        return info
    raise TypeError(f"etrecord must be a path, a ProgramInfo or an object with program_info(); "
                    f"got {type(etrecord).__name__}")


@dataclass
class JoinedColumns:
    """Per event of one block: what the ETRecord says about it."""

    debug_handles: list  # per event: int (a kernel's one handle, as upstream), a tuple, or None
    num_outputs: list[int]
    op_types: list[list[str]]
    stack_traces: list[dict]
    module_hierarchy: list[dict]
    backend_names: list


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
    out = JoinedColumns([None] * m, [1] * m, [[] for _ in range(m)], [{} for _ in range(m)],
                        [{} for _ in range(m)], [None] * m)
    for j, (nm, ch, ins) in enumerate(zip(names, chain_index.tolist(), instruction_id.tolist())):
        if nm in FRAMEWORK_EVENT_NAMES:
            continue
        key = (ch, ins)
        handles = method.instruction_debug_handles.get(key)
        if handles is None:
            continue
        out.num_outputs[j] = method.instruction_num_outputs.get(key, 1)
        delegate = method.delegates.get(key)
        if delegate is not None:
            out.backend_names[j] = delegate.backend_name
        occurrences = getattr(method, "instruction_handle_occurrences", {}).get(key)
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
        for h in occurrences or handles:  # repeats included: an op type per occurrence, as upstream counts them
            for op in method.ops.get(h, ()):
                if op.name not in out.stack_traces[j]:
                    out.stack_traces[j][op.name] = op.stack_trace
                    out.module_hierarchy[j][op.name] = op.module_hierarchy
                out.op_types[j].append(op.op_type)
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
