"""Delegates: initializing a plan's BackendDelegates and the context a backend's execute() receives."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from etlab.facts import memory_events as M
from etlab.runtime._errors import LoadError
from etlab.runtime._event_tracer import EventTracer
from etlab.runtime._events import profile_event
from etlab.runtime._registry import backend_available, find_backend
from etlab.schema import program as P


def _identifier(name: str | None, delegate_debug_id) -> tuple[int, str | None]:
    """(delegate_debug_id_int, delegate_debug_id_str): a delegate event is named by exactly one of the two."""
    if isinstance(delegate_debug_id, str):
        if name is not None:
            raise ValueError("give either name or delegate_debug_id, not both")
        return -1, delegate_debug_id
    if (name is None) == (delegate_debug_id == -1):
        raise ValueError("a delegate event needs exactly one identifier: a name (string) or a delegate_debug_id "
                         f"(int >= 0); got name={name!r}, delegate_debug_id={delegate_debug_id!r}")
    return (-1, name) if name is not None else (int(delegate_debug_id), None)


class NullDelegateContext:
    """The context backends get when tracing is off: every call is a no-op."""

    enabled = False
    logs_values = False  # log_output_delegate keeps nothing: a backend need not compute what it would log

    def start_profiling_delegate(self, name: str | None = None, delegate_debug_id=-1):
        """Nothing to time without tracing; returns the token end_profiling_delegate ignores."""
        return None

    def end_profiling_delegate(self, token, metadata: bytes = b"") -> None:
        """No-op: tracing is off."""
        return None

    def log_profiling_delegate(self, name, delegate_debug_id, start_ns: int, end_ns: int,
                               metadata: bytes = b"") -> None:
        """No-op: tracing is off."""
        return None

    def log_output_delegate(self, name, delegate_debug_id, value) -> None:
        """No-op: tracing is off."""
        return None


NULL_CONTEXT = NullDelegateContext()


class DelegateContext:
    """The context backends get when tracing is on: delegate events land in the current run.

    Identify each event by a string `name` or by an int `delegate_debug_id` (a string
    `delegate_debug_id` counts as a name). Times are `time.perf_counter_ns()` nanoseconds.
    """

    enabled = True

    def __init__(self, tracer: EventTracer):
        self._tracer = tracer
        self.events: list[tuple] = []  # the running execute's event list, set by the interpreter
        self.chain = 0
        self.instruction = 0

    @property
    def logs_values(self) -> bool:
        """Does log_output_delegate keep values (intermediate outputs are traced)?"""
        return self._tracer.logs_intermediates

    def start_profiling_delegate(self, name: str | None = None, delegate_debug_id=-1):
        """Starts timing a span inside the delegate (named, or by integer debug id) and returns the token to end it
        with: how a backend reports its own ops to the ETDump."""
        return (_identifier(name, delegate_debug_id), time.perf_counter_ns())

    def end_profiling_delegate(self, token, metadata: bytes = b"") -> None:
        """Ends the span `token` started and records it as a profile event of the current delegate call, with the
        backend's `metadata` bytes."""
        (did_int, did_str), start = token
        self.events.append(profile_event(None, self.chain, self.instruction, start, time.perf_counter_ns(),
                                         did_int=did_int, did_str=did_str, metadata=bytes(metadata)))

    def log_profiling_delegate(self, name, delegate_debug_id, start_ns: int, end_ns: int,
                               metadata: bytes = b"") -> None:
        """Records a span the backend timed itself (start and end in ns), e.g. from a device clock."""
        did_int, did_str = _identifier(name, delegate_debug_id)
        self.events.append(profile_event(None, self.chain, self.instruction, int(start_ns), int(end_ns),
                                         did_int=did_int, did_str=did_str, metadata=bytes(metadata)))

    def log_output_delegate(self, name, delegate_debug_id, value) -> None:
        """Logs a value the delegate computed (when intermediates are logged), so the Inspector can compare it with
        the eager model's."""
        if not self._tracer.logs_intermediates:
            return
        did_int, did_str = _identifier(name, delegate_debug_id)
        event = self._tracer.debug_event(self.chain, self.instruction, value, did_int=did_int, did_str=did_str)
        if event is not None:
            self.events.append(event)


@dataclass
class LoadedDelegate:
    """A delegate initialized for one loaded method: its backend, the backend's handle, and what its init kept in
    memory; destroyed once when the method goes."""

    backend_id: str
    backend: Any
    handle: Any
    destroyed: bool = field(default=False)
    init_bytes: int = 0  # what its init kept from the CPU allocator (measured with trace_allocations)

    def memory_name(self, phase: str) -> str | None:
        """The allocator this delegate's memory of `phase` ("init": kept by init, "execute": transient in a
        call) is recorded under: `delegate:<backend_id>:<what>`, `what` from the backend's `memory_names`
        ({"init": "packed_weights", "execute": "workspace"}: how the backend calls them), else "init" for
        init and None for execute (a call's transient memory is then the instruction's `temp`)."""
        what = (getattr(self.backend, "memory_names", None) or {}).get(phase)
        if what is None and phase != "init":
            return None
        return M.delegate(self.backend_id.replace(":", "_") or "unnamed", what or phase)

    def destroy(self) -> None:
        """Calls the backend's destroy on the handle, once (later calls do nothing)."""
        if not self.destroyed:
            self.destroyed = True
            destroy = getattr(self.backend, "destroy", None)
            if callable(destroy):
                destroy(self.handle)


def processed_bytes(pte: P.PteFile, delegate: P.BackendDelegate, what: str) -> memoryview:
    """A delegate's processed payload, inline or from its segment, as a zero-copy view; a LoadError naming the
    delegate when the reference points nowhere."""
    ref = delegate.processed
    if ref is None:
        raise LoadError(f"{what}: delegate {delegate.id!r} has no processed data reference")
    if ref.location == P.DataLocation.INLINE:
        inline = pte.program.backend_delegate_data or []
        if ref.index >= len(inline):
            raise LoadError(f"{what}: delegate {delegate.id!r} refers to inline data {ref.index}, "
                            f"but the program has {len(inline)}")
    elif ref.index >= len(pte.segments):
        raise LoadError(f"{what}: delegate {delegate.id!r} refers to segment {ref.index}, "
                        f"but the program has {len(pte.segments)}")
    return pte.delegate_bytes(delegate)


@dataclass(frozen=True)
class BackendInitContext:
    """What `backend.init(processed, compile_specs, context)` gets when the backend sets
    `takes_init_context = True`: the program's named data (upstream's NamedDataMap; where XNNPACK
    keeps its weights) and which delegate of which method is being initialized."""

    named_data: Mapping[str, Any]
    method_name: str = ""
    delegate_index: int = 0


def program_named_data(pte: P.PteFile) -> dict[str, Any]:
    """The program's own named data, key -> segment bytes (indices were checked by the loader)."""
    return {nd.key: pte.segments[nd.segment_index] for nd in pte.program.named_data or []
            if nd.key is not None and nd.segment_index < len(pte.segments)}


def init_delegates(pte: P.PteFile, plan: P.ExecutionPlan, what: str,
                   named_data: Mapping[str, Any] | None = None, watch=None) -> list[LoadedDelegate]:
    """Runs backend.init for every delegate of the plan; an unknown or unavailable backend fails the load.

    `named_data` (key -> bytes: the program's and its .ptd files') defaults to the program's own; with a
    started `watch` (trace_allocations), each delegate's `init_bytes` is what its init kept."""
    loaded: list[LoadedDelegate] = []
    try:
        for i, delegate in enumerate(plan.delegates or []):
            backend = find_backend(delegate.id or "")
            if backend is None:
                raise LoadError(f"{what}: delegate {i} needs backend {delegate.id!r}, which is not registered "
                                f"(register it with etlab.runtime.register_backend)")
            if not backend_available(backend):
                raise LoadError(f"{what}: delegate {i} needs backend {delegate.id!r}, which is not available here")
            specs = [(s.key or "", bytes(s.value or b"")) for s in delegate.compile_specs or []]
            data = processed_bytes(pte, delegate, f"{what}: delegate {i}")
            held = watch.take()[1] if watch is not None else 0
            try:
                if getattr(backend, "takes_init_context", False):
                    if named_data is None:
                        named_data = program_named_data(pte)
                    context = BackendInitContext(named_data, plan.name or "", i)
                    handle = backend.init(data, specs, context)
                else:
                    handle = backend.init(data, specs)
            except Exception as e:
                raise LoadError(f"{what}: backend {delegate.id!r} failed to initialize delegate {i}: {e}") from e
            kept = watch.take()[1] - held if watch is not None else 0
            loaded.append(LoadedDelegate(delegate.id, backend, handle, init_bytes=max(0, kept)))
    except BaseException:
        for d in loaded:
            d.destroy()
        raise
    return loaded
