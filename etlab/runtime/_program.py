"""Runtime and Program: loading `.pte` (or `.bpte`) files, their external data, and their methods."""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from etlab.errors import FormatError
from etlab.facts import memory_events as M
from etlab.runtime._binding import bind, classify, dynamic_scratch
from etlab.runtime._delegate import NULL_CONTEXT, DelegateContext, init_delegates
from etlab.runtime._errors import LoadError
from etlab.runtime._event_tracer import DEFAULT_MAX_EVENTS, UNSET_CHAIN, UNSET_INSTRUCTION, DebugLevel, EventTracer
from etlab.runtime._events import allocation_event, profile_event
from etlab.runtime._lookup import OperatorRegistry
from etlab.runtime._memory import allocate_arenas
from etlab.runtime._memory_events import new_watch, process_events, process_memory
from etlab.runtime._meta import MethodMeta, method_meta
from etlab.runtime._method import Method
from etlab.runtime._native import choose_core
from etlab.runtime._plan_check import check_no_live_overlap
from etlab.runtime._registry import BackendRegistry
from etlab.runtime._shared_state import (
    SHARED_MEM_ID,
    SharedRegion,
    allocate_shared_region,
    check_shared_layout,
    declares_shared_state,
)
from etlab.runtime._threads import DEFAULT_THREADS, check_threads
from etlab.runtime._values import DataSources, build_value_table
from etlab.schema import (
    check_intact,
    deserialize_bundled_program,
    deserialize_ptd,
    deserialize_pte,
    is_mapped,
    read_bytes,
)
from etlab.schema import program as P
from etlab.schema.bundled_program import BundledProgram


class Verification(enum.Enum):
    """How much of a program is checked at load (upstream's names).

    etlab checks everything it relies on at both levels: the FlatBuffer is verified, and every
    index, offset, size and argument type is checked while methods load.
    """

    Minimal = "minimal"
    InternalConsistency = "internal_consistency"


def _source_bytes(data, what: str | None = None) -> tuple[memoryview, str]:
    if hasattr(data, "read") and not isinstance(data, (str, os.PathLike)):
        raw = data.read()
        return memoryview(raw).cast("B"), what or getattr(data, "name", f"<{len(raw)} bytes>")
    return read_bytes(data, what=what)


def _named_data(pte: P.PteFile, data_files, what: str, views: list) -> dict[str, Any]:
    """Named data of the program and of its .ptd files (whose byte views are appended to `views`)."""
    named: dict[str, Any] = {}
    for nd in pte.program.named_data or []:
        if nd.segment_index >= len(pte.segments):
            raise FormatError(f"{what}: named data {nd.key!r} refers to segment {nd.segment_index}, "
                              f"but there are {len(pte.segments)}")
        named[nd.key] = pte.segments[nd.segment_index]
    for source in data_files:
        view, name = _source_bytes(source)
        views.append(view)
        for key, (_layout, data) in deserialize_ptd(view, what=name).named().items():
            named[key] = data
    return named


class Program:
    """A loaded program. Safe to share between threads; each `load_method` call returns a new Method
    with its own memory and mutable state, except the state a program compiled with
    `share_mutable_buffers` shares (memory id 2 of its three-arena plans, `_shared_state`): every
    method of the program loaded here reads and writes that one copy, as upstream's runtime does."""

    def __init__(self, pte: P.PteFile, what: str, *, data: DataSources, tracer: EventTracer | None,
                 bundled: BundledProgram | None, keepalive: Any = None, core: str | None = None,
                 memory_budget: int | None = None, threads: int | None = DEFAULT_THREADS):
        self._pte = pte
        self.memory_budget = memory_budget  # bytes one execute of a method may use (None: no budget)
        self.core = choose_core(core)  # "native" or "python": what runs this program's methods
        self.threads = check_threads(threads)  # intra-op threads its methods run with (None: torch's setting)
        self._what = what
        self._data = data
        self._tracer = tracer
        self._keepalive = keepalive
        # Large files stay memory-mapped: each use checks that they were not truncated (no SIGBUS).
        self._mapped = [v for v in keepalive or () if is_mapped(v)]
        self.bundled = bundled
        self._plans = {plan.name: plan for plan in pte.program.execution_plan or []}
        self._shared: SharedRegion | None = None
        self._shared_lock = threading.Lock()

    def check_files(self) -> None:
        """FormatError if a memory-mapped file of this program shrank since it was loaded."""
        for view in self._mapped:
            check_intact(view)

    @property
    def method_names(self) -> set[str]:
        """The names of the program's methods, what `load_method` accepts."""
        return set(self._plans)

    @property
    def pte(self) -> P.PteFile:
        """The parsed .pte the program was loaded from (segments are views of the loaded bytes)."""
        return self._pte

    def _plan(self, name: str) -> P.ExecutionPlan:
        if name not in self._plans:
            raise LoadError(f"{self._what}: no method {name!r} (methods: {sorted(self._plans)})")
        return self._plans[name]

    def metadata(self, name: str) -> MethodMeta:
        """A method's metadata without loading it; a KeyError lists the methods."""
        return method_meta(self._plan(name))

    def load_method(self, name: str) -> Method:
        """Loads method `name`: allocates its arenas, builds its values, binds every instruction.

        Fails with LoadError naming the operator or backend that is missing, or what in the plan is wrong.
        """
        load_start = time.perf_counter_ns()
        self.check_files()
        plan = self._plan(name)
        what = f"{self._what}: method {name!r}"
        init_start = time.perf_counter_ns()
        try:
            meta = method_meta(plan)
        except (ValueError, IndexError) as e:
            raise LoadError(f"{what}: {e}") from None
        delegates = []
        measuring = self._tracer is not None and self._tracer.trace_allocations
        memory = _LoadMemory(new_watch() if measuring else None, process_memory() if measuring else None)
        memory.started = memory.watch is not None and memory.watch.start()
        watch = memory.watch if memory.started else None
        try:
            memory.allocates_shared = self._shared is None
            shared = self._shared_region() if declares_shared_state(plan) else None
            arenas = allocate_arenas(list(plan.non_const_buffer_sizes or [0]), what,
                                     {SHARED_MEM_ID: (shared.tensor, shared.array)} if shared else None)
            # a buffer's initial state is copied in at load (as upstream does): not while a method runs
            _check_budget(arenas.total_bytes, self.memory_budget, what)
            with shared.lock if shared else contextlib.nullcontext():
                table = build_value_table(plan, arenas, self._data, what)
            table.memory_budget, table.planned_bytes = self.memory_budget, arenas.total_bytes
            kernels = classify(plan, table, what)
            check_no_live_overlap(plan, table, what)
            for slot in plan.outputs or []:
                table.check_slot(slot, f"{what}: output")
            delegates = init_delegates(self._pte, plan, what, self._data.named, watch)
            context = DelegateContext(self._tracer) if self._tracer is not None and delegates else None
            bound = bind(plan, table, kernels, delegates, context or NULL_CONTEXT)
            core = None
            if self.core == "native":
                from etlab.runtime._native._plan import build_native_core

                core = build_native_core(plan, table, bound.chains, kernels, context, self._tracer)
        except BaseException as e:
            for d in delegates:
                d.destroy()
            if not isinstance(e, LoadError) or str(e).startswith(self._what):
                raise
            raise LoadError(f"{self._what}: {e}") from e
        finally:
            if memory.started:
                memory.kept = watch.take()[1]
                watch.stop()
        init_end = time.perf_counter_ns()
        method = Method(self, meta, table, list(plan.inputs or []), list(plan.outputs or []), bound, arenas,
                        delegates, self._tracer, context, dynamic_scratch(plan, table), core,
                        shared.lock if shared else None)
        if self._tracer is not None:
            self._trace_load(method, load_start, init_start, init_end, memory)
        return method

    def _shared_region(self) -> SharedRegion:
        """The program's shared state, checked across all methods and allocated on first use."""
        with self._shared_lock:
            if self._shared is None:
                size = check_shared_layout(list(self._plans.values()), self._what)
                self._shared = allocate_shared_region(size, self._what)
            return self._shared

    def _trace_load(self, method: Method, load_start: int, init_start: int, init_end: int,
                    memory: _LoadMemory) -> None:
        tracer = self._tracer
        tracer.plan_debug_bytes(_debug_bytes_per_run(method))
        events = self._load_memory_events(method, memory) if tracer.trace_allocations else []
        # the load's allocation events belong to its Method::init event (they come before it)
        events += [profile_event("Method::init", UNSET_CHAIN, UNSET_INSTRUCTION, init_start, init_end),
                   profile_event("Program::load_method", UNSET_CHAIN, UNSET_INSTRUCTION, load_start,
                                 time.perf_counter_ns())]
        tracer.add_load_events(events)

    def _load_memory_events(self, method: Method, memory: _LoadMemory) -> list[tuple]:
        """A load's allocation events (`etlab.facts.memory_events`): its planned arenas (declared sizes; the
        program's shared state only by the load that allocated it), what each delegate's init kept, the
        method allocator (what the rest of the load kept), and the process's RSS deltas."""
        events = []
        shared = self._shared.tensor if self._shared is not None else None
        for mem_id, t in enumerate(method._arenas.tensors):
            if t is None:
                continue
            if t is not shared:
                events.append(allocation_event(M.planned(mem_id), t.numel()))
            elif memory.allocates_shared:
                events.append(allocation_event(M.shared(mem_id), t.numel()))
        after = process_memory()
        if memory.started:
            for d in method._delegates:
                events.append(allocation_event(d.memory_name("init"), d.init_bytes))
            delegates = sum(d.init_bytes for d in method._delegates)
            grown = after[0] - memory.before[0] if after[0] and memory.before[0] else 0
            events.append(allocation_event(M.METHOD, max(0, max(memory.kept, grown) - delegates)))
        return events + process_events(memory.before, after)

    # -- ETDump ------------------------------------------------------------------------------

    @property
    def etdump_enabled(self) -> bool:
        """Whether the program records events (it was loaded with an ETDump path or tracing on)."""
        return self._tracer is not None

    @property
    def etdump_dropped_events(self) -> int:
        """Events (or debug values) dropped because the event or debug buffer was full."""
        return self._tracer.dropped_events if self._tracer is not None else 0

    def write_etdump_result_to_file(self, etdump_path, debug_buffer_path=None, *, allocation_events: bool = True
                                    ) -> None:
        """Writes everything traced so far as an `.etdp` (and the debug buffer), atomically.

        `allocation_events=False` leaves out what trace_allocations recorded: a file for upstream 1.5.1's
        Inspector, which refuses any ETDump holding allocation events."""
        if self._tracer is None:
            raise LoadError(f"{self._what}: ETDump is off; load the program with enable_etdump=True")
        self._tracer.write(etdump_path, debug_buffer_path, allocation_events=allocation_events)


@dataclass
class _LoadMemory:
    """What a load with trace_allocations measures: the watch (None without the native core), whether it
    started, what the load kept from the CPU allocator, the process's memory before, whether the load
    allocated the program's shared state."""

    watch: Any
    before: tuple[int, int] | None
    started: bool = False
    kept: int = 0
    allocates_shared: bool = False


def _check_budget(planned: int, budget: int | None, what: str) -> None:
    if budget is not None and planned > budget:
        raise LoadError(f"{what}: its planned memory is {planned} bytes, over the memory budget of {budget} bytes")


def _tensor_bytes(value) -> int:
    """Debug-buffer bytes of a value as logged (each tensor 64-byte aligned); 0 for non-tensors."""
    tensors = value if isinstance(value, list) else [value]
    return sum(-(-t.numel() * t.element_size() // 64) * 64 for t in tensors if isinstance(t, torch.Tensor))


def _debug_bytes_per_run(method: Method) -> int:
    """What one run of `method` logs into the debug buffer at the tracer's level: the program outputs,
    and at the intermediate level every value each step logs, at their planned sizes (upper bounds
    for dynamic shapes; a delegate's own intermediates are not known before it runs)."""
    tracer, values = method._tracer, method._table.values
    slots = list(method._outputs) if tracer.logs_outputs else []
    if tracer.logs_intermediates:
        slots += [s for chain in method._bound.chains for info in chain.infos for s in info.log_slots]
    return sum(_tensor_bytes(values[s]) for s in slots)


class Runtime:
    """The process-wide runtime: registries and `load_program`. Get it with `Runtime.get()`.

    `Runtime.get(core="python")` (or `"native"`) returns a runtime whose programs run on that core;
    `Runtime.get()` uses the default, chosen when each program loads: ETLAB_RUNTIME_CORE if set,
    else the native core when it is built, else the Python core (with a warning).

    >>> import torch
    >>> from etlab.compiler import to_edge
    >>> class AddMul(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return x * y + x
    >>> pte = to_edge(torch.export.export(AddMul(), (torch.ones(2, 2), torch.ones(2, 2)))).to_executorch().buffer
    >>> program = Runtime.get().load_program(pte)
    >>> sorted(program.method_names)
    ['forward']
    >>> program.load_method("forward").execute((torch.ones(2, 2), torch.full((2, 2), 3.0)))
    [tensor([[4., 4.],
            [4., 4.]])]
    """

    _instances: ClassVar[dict[str | None, Runtime]] = {}
    _lock = threading.Lock()

    def __init__(self, core: str | None = None) -> None:
        self.core = core
        self.operator_registry = OperatorRegistry()
        self.backend_registry = BackendRegistry()

    @staticmethod
    def get(core: str | None = None) -> Runtime:
        """The process-wide runtime for a core ('native' or 'python'; None: chosen per program as the class doc
        says), created once with the built-in backends registered; an unknown or unbuilt core fails here, not at
        the first load."""
        if core is not None:
            choose_core(core)  # fails now for an unknown or unbuilt core
        with Runtime._lock:
            if core not in Runtime._instances:
                import etlab.runtime.backends  # noqa: F401  (built-in backends register themselves)

                Runtime._instances[core] = Runtime(core)
            return Runtime._instances[core]

    def load_program(self, data, *, verification: Verification = Verification.Minimal, enable_etdump: bool = False,
                     debug_buffer_size: int | None = None, etdump_debug_level: DebugLevel | int | None = None,
                     etdump_max_events: int = DEFAULT_MAX_EVENTS, trace_allocations: bool = False,
                     data_files=(), data_path=None, memory_budget: int | None = None,
                     threads: int | None = DEFAULT_THREADS) -> Program:
        """Loads a `.pte` (or the program inside a `.bpte`) from a path, bytes or a binary file.

        - `data_files` (or upstream's single `data_path`): `.ptd` files holding tensors the
          program keeps outside (looked up by fully-qualified name);
        - `enable_etdump`: trace loads and runs; `etdump_debug_level` says which values are logged
          (default: intermediate outputs when `debug_buffer_size` > 0 is given, else none);
          `debug_buffer_size` bytes keep logged tensors (default: sized from each loaded method's
          plan and grown with the runs, up to 1 GiB; values that do not fit are dropped and
          counted); `etdump_max_events` caps the events kept; `trace_allocations` adds
          allocation events: memory as it loaded and ran (planned arenas, method allocator, delegates'
          packed weights and workspace, each instruction's temporaries and unplanned memory, RSS deltas;
          `etlab.facts.memory_events`). Upstream's ETDump reader reads them; upstream 1.5.1's Inspector
          refuses any ETDump holding allocation events, its own runtime's included;
        - `memory_budget`: bytes one execute of a method may use: its planned arenas (checked at load)
          plus the temporaries of each kernel call whose arguments set its size (checked before the
          call, at load when its arguments are known then: `_kernel_args`). Without it those calls are
          still refused when their result would not fit their planned output;
        - `threads`: the intra-op threads (torch's) each execute runs its kernels with, set for the
          call and restored after it. 1 by default, as upstream's portable runtime: a profile on a
          busy machine stays stable (torch's default of one thread per core makes a 2-core machine
          shared with other work spike by 100x). None keeps whatever torch is set to. Recorded with
          each traced run (the ETDump run block's `threads`, an etlab field upstream's reader skips; 0 for None).
        """
        threads = check_threads(threads)
        Verification(verification)
        if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget < 0):
            raise ValueError(f"memory_budget must be a non-negative int (bytes), got {memory_budget!r}")
        view, what = _source_bytes(data)
        bundled = None
        if len(view) >= 8 and bytes(view[4:8]) == b"BP08":
            bundled = deserialize_bundled_program(view, what=what)
            pte = deserialize_pte(memoryview(bundled.program or b""), what=f"{what} (embedded program)")
        else:
            pte = deserialize_pte(view, what=what)
        files = list(data_files) + ([data_path] if data_path is not None else [])
        views = [view]
        sources = DataSources(pte, _named_data(pte, files, what, views), what)
        tracer = None
        if enable_etdump:
            level = etdump_debug_level
            if level is None:
                level = DebugLevel.INTERMEDIATE_OUTPUTS if debug_buffer_size else DebugLevel.NO_LOGGING
            level = DebugLevel(level)
            if debug_buffer_size is None and level == DebugLevel.NO_LOGGING:
                debug_buffer_size = 0
            tracer = EventTracer(debug_level=level, debug_buffer_size=debug_buffer_size,
                                 max_events=etdump_max_events, trace_allocations=trace_allocations,
                                 threads=threads)
        return Program(pte, what, data=sources, tracer=tracer, bundled=bundled, keepalive=views, core=self.core,
                       memory_budget=memory_budget, threads=threads)


def load_program(data, **kwargs) -> Program:
    """`Runtime.get().load_program(data, **kwargs)`."""
    return Runtime.get().load_program(data, **kwargs)
