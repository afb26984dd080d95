"""The tracer's events while a program runs, one kind per class: their fields, named in one place.

Events are kept as plain tuples laid out as the NamedTuple classes below (the first field is the
kind's tag), made by the constructors here and read by name when the ETDump is written
(`ProfileEvent._make(e)`). Why not instances of the classes themselves: the garbage collector stops
tracking a plain tuple of plain values after one look, but keeps tracking every instance of a tuple
subclass (a NamedTuple is one), and building one costs about four times a tuple's. Measured on a
million profile events (CPython 3.11): a full collection 0.08 s with tuples, 0.59 s with NamedTuple
instances; building them 1.0 s against 4.1 s. A long trace must not make every later collection slower.
"""

from __future__ import annotations

from typing import Any, NamedTuple

PROFILE = "P"
DEBUG = "D"
ALLOCATION = "A"
TIMED = "T"
WATCHED = "W"


class ProfileEvent(NamedTuple):
    """A span: an instruction, a delegate's own event, or a framework event (`Method::execute`, ...)."""

    kind: str  # PROFILE
    name: str | None
    chain: int
    instruction: int
    did_int: int
    did_str: str | None
    metadata: bytes | None
    start: int
    end: int


class DebugEvent(NamedTuple):
    """A logged value: an ETDump value, or a native debug record made into one when written."""

    kind: str  # DEBUG
    chain: int
    instruction: int
    did_int: int
    did_str: str | None
    name: str | None
    value: Any
    is_output: bool


class AllocationEvent(NamedTuple):
    """Bytes taken from an allocator (named as in `etlab.facts.memory_events`); it belongs to the next
    profile event of its block."""

    kind: str  # ALLOCATION
    allocator: str
    size: int


class TimedRun(NamedTuple):
    """A whole `run_timed` run: the key of its method's bound chains and its timestamps, expanded into
    profile events when written; `count` is the number of events, when the native core counted them."""

    kind: str  # TIMED
    key: int
    record: Any
    count: int | None = None


class WatchedRun(NamedTuple):
    """A whole native run traced with allocation events and nothing else logged: the key of its method's
    bound chains and the native core's step records (`_native._plan.watched_events` expands them when
    written, as a TimedRun's timestamps are); `count` is the number of events it stands for."""

    kind: str  # WATCHED
    key: int
    steps: Any
    count: int


def profile_event(name: str | None, chain: int, instruction: int, start: int, end: int, *, did_int: int = -1,
                  did_str: str | None = None, metadata: bytes | None = None) -> tuple:
    """A ProfileEvent's fields as a plain tuple."""
    return (PROFILE, name, chain, instruction, did_int, did_str, metadata, start, end)


def debug_event(chain: int, instruction: int, value, *, did_int: int = -1, did_str: str | None = None,
                name: str | None = None, is_output: bool = False) -> tuple:
    """A DebugEvent's fields as a plain tuple."""
    return (DEBUG, chain, instruction, did_int, did_str, name, value, is_output)


def allocation_event(allocator: str, size: int) -> tuple:
    """An AllocationEvent's fields as a plain tuple."""
    return (ALLOCATION, allocator, size)


def timed_run(key: int, record, count: int | None = None) -> tuple:
    """A TimedRun's fields as a plain tuple (without a count when there is none)."""
    return (TIMED, key, record) if count is None else (TIMED, key, record, count)


def watched_run(key: int, steps, count: int) -> tuple:
    """A WatchedRun's fields as a plain tuple."""
    return (WATCHED, key, steps, count)
