"""The event tracer: records what a program did and writes it as an ETDump (`.etdp`) upstream's Inspector reads.

Structure and names follow upstream's ETDumpGen:

- run block "Default": `Method::init` and `Program::load_method` profile events per loaded method;
- one run block "Execute" per `Method.execute`: per instruction a profile event carrying its chain
  and instruction ids (`native_call_<op>.<overload>` inside `OPERATOR_CALL` for kernels,
  `DELEGATE_CALL`, `MOVE_CALL`, `JF_CALL`, `FREE_CALL`), delegate events (profile and debug,
  identified by an int or a string delegate debug id), then `Method::execute`, then one debug
  event per program output (chain index 2**64-1, `output` set);
- each "Execute" block records the intra-op threads its kernels ran with (`RunData.threads`, an
  etlab field upstream's reader skips; `load_program(threads=...)`);
- debug levels: off, program outputs, intermediate outputs (the last arguments of every kernel,
  every argument of a delegate call). Tensor bytes go to the debug buffer, 64-byte aligned; a
  debug event holds their offset, sizes and strides. Without a `debug_buffer_size` the buffer is
  sized from the plan: it grows by what a run of the largest loaded method logs (`plan_debug_bytes`,
  from its value specs), up to AUTO_DEBUG_BUFFER_LIMIT. Values that do not fit are dropped, and a
  run that dropped any ends with a `etlab::dropped_debug_values` profile event (metadata: the count
  as ASCII digits), which the Inspector reports.

Events are kept as plain tuples laid out as `_events`' classes (or, for runs without logged values,
as bare timestamps: a `TimedRun`) while the program runs, and become schema objects only when written.
With `trace_allocations`, allocation events name their allocator (`etlab.facts.memory_events`); each
block lists the allocators its events use, in order of first use, when written, their ids counted from 1
as upstream's ETDumpGen counts them. Runs of the
native core without logged values stay entirely in C++ (`native_log`, its run blocks with their
`Method::execute` events; Python does nothing per run) and are merged in order when written.
A full event buffer or debug buffer drops events; `dropped_events` counts them and a warning says
so once.
"""

from __future__ import annotations

import enum
import threading
import warnings
from array import array

import torch

from etlab.facts.memory_events import FIRST_ALLOCATOR_ID
from etlab.runtime._events import (
    ALLOCATION,
    DEBUG,
    PROFILE,
    TIMED,
    WATCHED,
    AllocationEvent,
    DebugEvent,
    ProfileEvent,
    debug_event,
    profile_event,
    timed_run,
)
from etlab.runtime._interpreter import timed_event_count, timed_events
from etlab.runtime._native import debug_arena as native_debug_arena
from etlab.runtime._native import trace_log as native_trace_log
from etlab.schema import etdump as E
from etlab.schema import write_atomic
from etlab.schema.etdump import DROPPED_DEBUG_VALUES
from etlab.schema.scalar_type import dtype_to_scalar_type

DEBUG_ALIGNMENT = 64
PROGRAM_OUTPUT_CHAIN = (1 << 64) - 1  # upstream's unset chain id (-1) as the debug event's ulong
UNSET_CHAIN = -1
UNSET_INSTRUCTION = 0
DEFAULT_MAX_EVENTS = 1 << 20
AUTO_DEBUG_BUFFER_LIMIT = 1 << 30  # a debug buffer sized from the plan grows up to this many bytes
MAX_DEBUG_BUFFER_BYTES = 1 << 48  # the native DebugArena's bound (its offset arithmetic stays far from overflow)
MAX_DEBUG_ALIGNMENT = 4096


class DebugLevel(enum.IntEnum):
    """How much data the tracer logs besides timings (upstream's EventTracerDebugLogLevel)."""

    NO_LOGGING = 0
    PROGRAM_OUTPUTS = 1
    INTERMEDIATE_OUTPUTS = 2


class EventTracer:
    """Collects the events of one program (all its methods); safe to share between threads."""

    def __init__(self, *, debug_level: DebugLevel = DebugLevel.NO_LOGGING, debug_buffer_size: int | None = 0,
                 max_events: int = DEFAULT_MAX_EVENTS, trace_allocations: bool = False, threads: int | None = None):
        """debug_buffer_size: bytes for logged tensors, or None to size the buffer from the plan; threads: the
        intra-op threads the program's methods run with, recorded in each "Execute" block (None: torch's own
        setting, recorded as 0: not known)."""
        if (debug_buffer_size is not None and debug_buffer_size < 0) or max_events < 0:
            raise ValueError("debug_buffer_size and max_events must not be negative")
        if debug_buffer_size is not None and debug_buffer_size > MAX_DEBUG_BUFFER_BYTES:
            raise ValueError(f"debug_buffer_size {debug_buffer_size} is above {MAX_DEBUG_BUFFER_BYTES} bytes")
        self.debug_level = DebugLevel(debug_level)
        self.trace_allocations = trace_allocations
        self.threads = threads
        self.max_events = max_events
        self._dropped = 0
        self.dropped_debug_values = 0  # logged values that did not fit into the debug buffer
        self._lock = threading.Lock()
        self._load_events: list[tuple] = []
        # ("Execute", bundled input index, first event, end event, native runs before it)
        self._runs: list[tuple] = []
        self._run_events: list[tuple] = []  # the events of all runs, back to back
        self._chains: list = []  # bound chains of each traced method, by key
        # The native trace (timed runs of the native core) and the event count of both sides.
        log = native_trace_log(max_events)
        self.native_log = log if log is not None else _EventCount(max_events)
        # Offsets in the debug buffer, reserved under a lock; native traced runs share the allocator.
        self.debug_buffer_size = debug_buffer_size  # None: sized from the plan
        size, limit = (0, AUTO_DEBUG_BUFFER_LIMIT) if debug_buffer_size is None else (debug_buffer_size,) * 2
        arena = native_debug_arena(size, limit)
        self.debug_arena = arena if arena is not None else _DebugArena(size, limit)
        self._warned = False

    @property
    def dropped_events(self) -> int:
        """Events and debug values dropped for lack of room (the native log's included)."""
        return self._dropped + self.native_log.dropped

    @property
    def logs_intermediates(self) -> bool:
        """Whether every instruction's outputs are logged (DebugLevel.INTERMEDIATE_OUTPUTS): the numeric gap needs
        them."""
        return self.debug_level >= DebugLevel.INTERMEDIATE_OUTPUTS

    @property
    def logs_outputs(self) -> bool:
        """Whether the method's outputs are logged (DebugLevel.PROGRAM_OUTPUTS or above)."""
        return self.debug_level >= DebugLevel.PROGRAM_OUTPUTS

    # -- recording ---------------------------------------------------------------------------

    def register_chains(self, chains) -> int:
        """A key for the TimedRun events of a method bound to `chains`."""
        with self._lock:
            self._chains.append(chains)
            return len(self._chains) - 1

    def add_load_events(self, events: list[tuple]) -> None:
        """Appends load-time events to the Default block."""
        with self._lock:
            self._load_events.extend(self._fit(events, len(events)))

    def add_run_block(self, events: list, bundled_input_index: int = -1) -> None:
        """Adds one "Execute" block."""
        n = sum(self._timed_count(e) if e[0] == TIMED else e[3] if e[0] == WATCHED else 1 for e in events)
        with self._lock:
            first = len(self._run_events)
            self._run_events.extend(self._fit(events, n))
            self._runs.append(("Execute", bundled_input_index, first, len(self._run_events), len(self.native_log)))

    def _timed_count(self, event: tuple) -> int:
        if len(event) > 3:  # counted by the native core as it ran
            return event[3]
        chains = self._chains[event[1]]
        if not any(chain.jumps for chain in chains):  # straight-line: known without reading the record
            return sum(chain.events_per_run for chain in chains)
        return timed_event_count(chains, event[2])

    def _fit(self, events: list, n: int) -> list:
        """`events`, cut to the room left under max_events (the rest counted as dropped)."""
        room = self.native_log.fit(n)
        if n > room:
            self._drop(n - room)
            events = self._expand(events)[:room]
        return events

    def _expand(self, events) -> list[tuple]:
        out: list[tuple] = []
        for e in events:
            if e[0] == TIMED:
                out.extend(timed_events(self._chains[e[1]], e[2]))
            elif e[0] == WATCHED:  # made by the native core only
                from etlab.runtime._native._plan import watched_events

                out.extend(watched_events(self._chains[e[1]], e[2]))
            else:
                out.append(e)
        return out

    def plan_debug_bytes(self, nbytes: int) -> None:
        """A loaded method logs up to `nbytes` per run: a debug buffer sized from the plan grows by at least that."""
        if self.debug_buffer_size is None and self.logs_outputs:
            self.debug_arena.grow_by_at_least(nbytes)

    def count_dropped(self, n: int) -> None:
        """Counts `n` logged values that did not fit into the debug buffer."""
        with self._lock:
            self.dropped_debug_values += n
            self._drop(n)

    def dropped_values_event(self, n: int, time: int) -> tuple:
        """The event that ends a run which dropped `n` logged values."""
        return profile_event(DROPPED_DEBUG_VALUES, UNSET_CHAIN, UNSET_INSTRUCTION, time, time, metadata=str(n).encode())

    def _drop(self, n: int) -> None:
        self._dropped += n
        if not self._warned:
            self._warned = True
            size = "sized from the plan" if self.debug_buffer_size is None else f"{self.debug_buffer_size} bytes"
            warnings.warn(f"ETDump buffer full: dropping events (limit {self.max_events} events, debug buffer "
                          f"{size}); Program.etdump_dropped_events counts them",
                          RuntimeWarning, stacklevel=4)

    def debug_value(self, value) -> E.Value | None:
        """The debug-event value of a run-time value; tensor bytes are copied to the debug buffer.

        None when the value has no ETDump form, or when the debug buffer is full (counted as dropped).
        """
        if isinstance(value, torch.Tensor):
            tensor = self._store_tensor(value)
            return None if tensor is None else E.Value(val=E.ValueType.Tensor, tensor=tensor)
        if isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
            tensors = [self._store_tensor(v) for v in value]
            if any(t is None for t in tensors):
                return None
            return E.Value(val=E.ValueType.TensorList, tensor_list=E.TensorList(tensors=tensors))
        if isinstance(value, bool):
            return E.Value(val=E.ValueType.Bool, bool_value=E.Bool(value))
        if isinstance(value, int):
            return E.Value(val=E.ValueType.Int, int_value=E.Int(value))
        if isinstance(value, float):
            return E.Value(val=E.ValueType.Double, double_value=E.Double(value))
        return None

    def _store_tensor(self, t: torch.Tensor) -> E.Tensor | None:
        try:
            scalar_type = dtype_to_scalar_type(t.dtype)
        except ValueError:
            return None
        nbytes = t.numel() * t.element_size()
        offset, space = self.debug_arena.reserve(nbytes, DEBUG_ALIGNMENT)
        if offset < 0:
            self.count_dropped(1)
            return None
        if nbytes:
            space.view(t.dtype).view(t.shape).copy_(t)
        return _tensor_entry(scalar_type, t.shape, offset)

    def debug_event_of_record(self, chain: int, instruction: int, record) -> tuple | None:
        """The debug event of a value a native traced run logged (see `_native._core`): a tensor or
        tensor list already copied into the debug buffer (kept as its record, made into an ETDump
        value when the trace is written), a Python value, or None (nothing logged)."""
        if record is None:
            return None
        if record[0] == "V":
            return self.debug_event(chain, instruction, record[1])
        return debug_event(chain, instruction, record)

    def debug_event(self, chain: int, instruction: int, value, *, did_int: int = -1, did_str: str | None = None,
                    name: str | None = None, is_output: bool = False) -> tuple | None:
        """A debug event for a value an instruction or delegate produced, its data copied to the debug buffer; None
        when the value is not logged (or did not fit, which is counted)."""
        logged = self.debug_value(value)
        if logged is None:
            return None
        return debug_event(chain, instruction, logged, did_int=did_int, did_str=did_str, name=name, is_output=is_output)

    # -- writing -----------------------------------------------------------------------------

    def _native_block(self, run: tuple) -> tuple:
        """The run block of a native timed run (see `_core.TraceLog.runs`)."""
        key, bundled, count, kept, start, end, raw = run
        record = array("q")
        record.frombytes(raw)
        events = [timed_run(key, record, count - 1),
                  profile_event("Method::execute", UNSET_CHAIN, UNSET_INSTRUCTION, start, end)]
        if kept < count:  # a run with nothing kept has no record (_core.TraceLog.add)
            events = self._expand(events)[:kept] if kept else []
        return ("Execute", bundled, events)

    def to_etdump(self, *, allocation_events: bool = True) -> E.ETDump:
        """The trace so far; without `allocation_events`, as if traced without trace_allocations (what
        upstream 1.5.1's Inspector reads: it refuses any allocation event)."""
        with self._lock:
            native = self.native_log.runs()
            blocks = [("Default", -1, tuple(self._load_events))]
            n = 0  # native runs merged so far: each Python-recorded run knows how many came before it
            for name, bundled, first, end, native_before in self._runs:
                blocks += [self._native_block(r) for r in native[n:native_before]]
                n = max(n, native_before)
                blocks.append((name, bundled, self._run_events[first:end]))
            blocks += [self._native_block(r) for r in native[n:]]
        run_data = []
        threads = self.threads or 0  # None (torch's own setting, which may change between runs): not recorded
        for name, bundled, events in blocks:
            events = self._expand(events)
            if not allocation_events:
                events = [e for e in events if e[0] != ALLOCATION]
            allocators: dict[str, int] = {}  # name -> id, in order of first use, numbered from 1 as upstream's
            for e in events:
                if e[0] == ALLOCATION:
                    allocators.setdefault(e[1], len(allocators) + FIRST_ALLOCATOR_ID)
            run_data.append(E.RunData(
                name=name, bundled_input_index=bundled,
                allocators=[E.Allocator(a) for a in allocators] or None,
                events=[_event(e, allocators) for e in events],
                threads=threads if name == "Execute" else 0,
            ))
        return E.ETDump(version=0, run_data=run_data)

    def debug_buffer(self) -> bytes:
        """The logged values' bytes, which the ETDump's debug events point into (the .bin written beside the .etdp)."""
        return self.debug_arena.contents().numpy().tobytes()

    def write(self, etdump_path, debug_buffer_path=None, *, allocation_events: bool = True) -> None:
        """Writes the ETDump and, when values were logged, the debug buffer; warns when events were dropped because a
        buffer was full."""
        if self.dropped_events:
            warnings.warn(f"ETDump {etdump_path}: {self.dropped_events} events were dropped (buffer full)",
                          RuntimeWarning, stacklevel=3)
        # the events first: the buffer then holds every value they point to
        etdump = self.to_etdump(allocation_events=allocation_events)
        if debug_buffer_path is None:
            write_atomic(etdump_path, E.serialize_etdump(etdump))
            return
        # Two files, two atomic writes: a process stopped between them leaves a pair from two runs. The
        # ETDump records the buffer's size and SHA-256, and readers refuse a buffer that differs.
        buffer = self.debug_buffer()
        etdump.debug_buffer = E.debug_buffer_digest(buffer)
        write_atomic(etdump_path, E.serialize_etdump(etdump))
        write_atomic(debug_buffer_path, buffer)


class _EventCount:
    """The event count under max_events when the native core (and its TraceLog) is not built."""

    def __init__(self, max_events: int):
        self._room = max_events

    def fit(self, n: int) -> int:
        """How many of `n` more events fit (counted as kept); called under the tracer's lock."""
        granted = max(0, min(n, self._room))
        self._room -= granted
        return granted

    dropped = 0  # no native runs

    def __len__(self) -> int:
        return 0

    def runs(self) -> list:
        return []


class _DebugArena:
    """The debug-buffer allocator when the native core is not built (the interface and layout of its
    DebugArena: chunks of at least the growth unit while the total stays within `limit`)."""

    _MAX_UNIT = 64 << 20

    def __init__(self, size: int, limit: int):
        if not 0 <= size <= MAX_DEBUG_BUFFER_BYTES or not 0 <= limit <= MAX_DEBUG_BUFFER_BYTES:
            raise ValueError(f"DebugArena: size and limit must lie in 0..{MAX_DEBUG_BUFFER_BYTES}")
        self._chunks = [torch.empty(size, dtype=torch.uint8)]
        self._starts = [0]
        self._capacity, self._limit, self._unit = size, max(size, limit), 1 << 20
        self.used = 0
        self._lock = threading.Lock()

    def grow_by_at_least(self, nbytes: int) -> None:
        with self._lock:
            self._unit = max(self._unit, min(_round_up(max(nbytes, 0), 64), self._MAX_UNIT))

    def reserve(self, nbytes: int, alignment: int) -> tuple[int, torch.Tensor | None]:
        """Offset of `nbytes` bytes aligned to `alignment` and the bytes to copy into, or (-1, None) (the
        arena unchanged); ValueError for a negative nbytes or an alignment not a power of two up to 4096."""
        if nbytes < 0 or not 0 < alignment <= MAX_DEBUG_ALIGNMENT or alignment & (alignment - 1):
            raise ValueError(f"DebugArena.reserve: nbytes must be >= 0 and alignment a power of two up to "
                             f"{MAX_DEBUG_ALIGNMENT}")
        with self._lock:
            if nbytes > self._limit:
                return -1, None
            offset = _round_up(self.used, alignment)
            if offset + nbytes > self._capacity:
                start = _round_up(self._capacity, max(alignment, 64))
                size = max(self._unit, _round_up(nbytes, 64))
                if start + size > self._limit:
                    return -1, None
                # allocated before anything changes: a failed allocation leaves the arena as it was
                pad = torch.zeros(start - self._capacity, dtype=torch.uint8) if start > self._capacity else None
                chunk = torch.empty(size, dtype=torch.uint8)
                self._chunks[-1][self.used - self._starts[-1]:].zero_()
                if pad is not None:
                    self._chunks.append(pad)
                    self._starts.append(self._capacity)
                self._chunks.append(chunk)
                self._starts.append(start)
                self._capacity = start + size
                self.used = offset = start
            chunk, base = self._chunks[-1], self._starts[-1]
            chunk[self.used - base : offset - base].zero_()
            self.used = offset + nbytes
            return offset, chunk[offset - base : offset - base + nbytes]

    def contents(self) -> torch.Tensor:
        with self._lock:
            parts = [c[: min(c.numel(), self.used - s)] for c, s in zip(self._chunks, self._starts) if s < self.used]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def _round_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _tensor_entry(scalar_type: int, sizes, offset: int) -> E.Tensor:
    """The ETDump form of a tensor stored contiguously at `offset` of the debug buffer."""
    strides, step = [], 1
    for size in reversed(sizes):  # torch's contiguous strides: empty dimensions count as 1
        strides.append(step)
        step *= max(size, 1)
    return E.Tensor(scalar_type=scalar_type, sizes=list(sizes), strides=strides[::-1], offset=offset)


def _value_of_record(record: tuple) -> E.Value:
    """The ETDump value of a native debug record: ("T", scalar type, sizes, offset) or ("L", members)."""
    if record[0] == "T":
        return E.Value(val=E.ValueType.Tensor, tensor=_tensor_entry(*record[1:]))
    members = [_tensor_entry(*m) for m in record[1]]
    return E.Value(val=E.ValueType.TensorList, tensor_list=E.TensorList(tensors=members))


def _event(e: tuple, allocators: dict[str, int]) -> E.Event:
    """The schema form of an event tuple (`allocators`: its block's allocator ids by name)."""
    if e[0] == PROFILE:
        p = ProfileEvent._make(e)
        return E.Event(profile_event=E.ProfileEvent(
            name=p.name, chain_index=p.chain, instruction_id=p.instruction, delegate_debug_id_int=p.did_int,
            delegate_debug_id_str=p.did_str, delegate_debug_metadata=p.metadata, start_time=p.start,
            end_time=p.end))
    if e[0] == DEBUG:
        d = DebugEvent._make(e)
        value = _value_of_record(d.value) if isinstance(d.value, tuple) else d.value
        if d.is_output:
            value.output = E.Bool(True)
        return E.Event(debug_event=E.DebugEvent(
            chain_index=d.chain, instruction_id=d.instruction, debug_entry=value, delegate_debug_id_int=d.did_int,
            delegate_debug_id_str=d.did_str, name=d.name))
    a = AllocationEvent._make(e)
    return E.Event(allocation_event=E.AllocationEvent(allocator_id=allocators[a.allocator], allocation_size=a.size))
