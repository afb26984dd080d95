"""The interpreter loops: run the steps a method was bound to, in order, following jumps.

A step is a zero-argument callable made at load time (`_binding`). Whatever it returns is
ignored, except a `Goto`: the index of the next step to run (a taken JumpFalseCall).
Everything the loops touch is prepared beforehand, so this module is the part a compiled core
can replace without changing the rest.

Three loops: `run` (no tracing), `run_timed` (tracing without logged values: it only appends
timestamps, which `timed_events` turns into events when the trace is written) and `run_traced`
(events built as it goes, for logged values and delegate events). `PythonCore` bundles them for
a method; the native core (`etlab.runtime._native`) has the same interface and is the default
when built (`Runtime.get(core="python")` selects this one).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from etlab.facts.memory_events import TEMP
from etlab.runtime._events import profile_event
from etlab.runtime._memory_events import step_memory_events

Step = Callable[[], Any]
_END = -1  # closes a jump chain's part of a timed record


class Goto(int):
    """Returned by a jump step: run this step next."""


@dataclass
class StepInfo:
    """What the tracer records about a step: its kind, ids, event name and the values it logs."""

    kind: str  # "kernel", "delegate", "move", "jump", "free"
    chain: int
    instruction: int
    # "native_call_<op>" for kernels (None for primitive operators, traced by OPERATOR_CALL alone),
    # else the upstream event name (DELEGATE_CALL, MOVE_CALL, JF_CALL, FREE_CALL).
    name: str | None
    log_slots: tuple[int, ...] = ()
    operator: str = ""  # for error messages: the operator name, or the instruction kind
    # The allocator a step's transient memory is recorded under (trace_allocations): `temp`, or a
    # delegate's own name for it (`delegate:<backend_id>:workspace`, from its backend's `memory_names`).
    memory_label: str = TEMP

    def __post_init__(self):
        self.operator = self.operator or self.name or self.kind

    @property
    def event_count(self) -> int:
        """How many events the step adds when traced: two for a kernel with a native_call_ name (OPERATOR_CALL and
        its own), one otherwise."""
        return 2 if self.kind == "kernel" and self.name is not None else 1


@dataclass
class BoundChain:
    """One chain ready to run: its steps, what the tracer records for each, and whether it jumps (straight-line
    chains run with the cheapest loop)."""

    steps: list[Step]
    infos: list[StepInfo]
    jumps: bool  # False: straight-line, run with the cheapest loop

    def __post_init__(self):
        self.events_per_run = sum(info.event_count for info in self.infos)


class StepFailed(Exception):
    """A step raised; carries which one so the method can name the instruction."""

    def __init__(self, chain: int, index: int, error: BaseException):
        super().__init__(f"step {index} of chain {chain} failed: {error}")
        self.chain, self.index, self.error = chain, index, error


def _index_of(steps: list[Step], step: Step) -> int:
    return next((i for i, s in enumerate(steps) if s is step), -1)


def run(chains: list[BoundChain]) -> None:
    """Runs the chains without tracing (straight-line chains in the cheapest loop); a failure is re-raised as
    StepFailed with the chain and instruction."""
    for c, chain in enumerate(chains):
        steps = chain.steps
        if not chain.jumps:
            step = None
            try:
                for step in steps:
                    step()
            except Exception as e:
                raise StepFailed(c, _index_of(steps, step), e) from e
            continue
        pc, n = 0, len(steps)
        try:
            while pc < n:
                nxt = steps[pc]()
                pc = nxt if type(nxt) is Goto else pc + 1
        except Exception as e:
            raise StepFailed(c, pc, e) from e


def run_timed(chains: list[BoundChain], record) -> None:
    """`run`, appending one timestamp per step to `record` (its end, which is also the next step's
    start), after the chain's start time; jump chains append (step index, end) pairs and `_END`."""
    now = time.perf_counter_ns
    add = record.append
    for c, chain in enumerate(chains):
        steps = chain.steps
        add(now())
        if not chain.jumps:
            step = None
            try:
                for step in steps:
                    step()
                    add(now())
            except Exception as e:
                raise StepFailed(c, _index_of(steps, step), e) from e
            continue
        pc, n = 0, len(steps)
        try:
            while pc < n:
                nxt = steps[pc]()
                add(pc)
                add(now())
                pc = nxt if type(nxt) is Goto else pc + 1
        except Exception as e:
            raise StepFailed(c, pc, e) from e
        add(_END)


def step_events(info: StepInfo, start: int, end: int) -> list[tuple]:
    """The profile events of one step that ran from `start` to `end` (shared by both cores)."""
    events = []
    if info.name is not None:
        events.append(profile_event(info.name, info.chain, info.instruction, start, end))
    if info.kind == "kernel":
        events.append(profile_event("OPERATOR_CALL", info.chain, info.instruction, start, end))
    return events


def _walk_timed(chains: list[BoundChain], record):
    """(step info, start, end) per step a `run_timed` record covers."""
    pos = 0
    for chain in chains:
        start = record[pos]
        pos += 1
        if not chain.jumps:
            for info in chain.infos:
                yield info, start, record[pos]
                start = record[pos]
                pos += 1
            continue
        while record[pos] != _END:
            pc, end = record[pos], record[pos + 1]
            yield chain.infos[pc], start, end
            start = end
            pos += 2
        pos += 1


def timed_event_count(chains: list[BoundChain], record) -> int:
    """How many events a timed run's record (`run_timed`) stands for: a kernel step with a native_call_ name counts
    two."""
    return sum(info.event_count for info, _, _ in _walk_timed(chains, record))


def timed_events(chains: list[BoundChain], record) -> list[tuple]:
    """The event tuples of a `run_timed` record (made when the trace is written, not while running)."""
    return [e for info, start, end in _walk_timed(chains, record) for e in step_events(info, start, end)]


def run_traced(chains: list[BoundChain], events: list, values: list, tracer, context, watch=None) -> None:
    """`run` building profile events as it goes, plus debug events at the intermediate level.

    `context` is the method's DelegateContext (or None without delegates): the loop tells it
    which instruction is running so delegate events carry the right ids. `watch`, a started
    `MemoryWatch` (trace_allocations), adds each step's allocation events before its profile events.
    """
    now = time.perf_counter_ns
    log = tracer.logs_intermediates
    append = events.append
    for c, chain in enumerate(chains):
        steps, infos = chain.steps, chain.infos
        pc, n = 0, len(steps)
        while pc < n:
            info = infos[pc]
            if context is not None:
                context.chain, context.instruction = info.chain, info.instruction
            if watch is not None:
                watch.mark()
            start = now()
            try:
                nxt = steps[pc]()
            except Exception as e:
                raise StepFailed(c, pc, e) from e
            memory = watch.take() if watch is not None else None
            if log:
                for slot in info.log_slots:
                    event = tracer.debug_event(info.chain, info.instruction, values[slot])
                    if event is not None:
                        append(event)
            end = now()
            if memory is not None:
                events.extend(step_memory_events(*memory, info.memory_label))
            events.extend(step_events(info, start, end))
            pc = nxt if type(nxt) is Goto else pc + 1


@dataclass
class PythonCore:
    """The reference core: a method's bound chains run by the loops above."""

    chains: list[BoundChain]
    values: list
    name: str = "python"
    clock: Callable[[], int] = time.perf_counter_ns  # the clock of its trace timestamps

    def run(self) -> None:
        """One untraced execution of the method."""
        run(self.chains)

    def run_timed(self) -> tuple[tuple, None]:
        """The record (a tuple of ints: the garbage collector stops tracking it after one look); the
        number of events it stands for is left to the tracer (None)."""
        record: list[int] = []
        run_timed(self.chains, record)
        return tuple(record), None

    def run_traced(self, events: list, tracer, context, watch=None) -> None:
        """One execution recording profile (and, per the tracer's level, debug) events into `events`; delegates log
        through `context`."""
        if context is not None:
            context.events = events
        run_traced(self.chains, events, self.values, tracer, context, watch)
