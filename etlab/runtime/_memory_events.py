"""Memory as a method loads and runs (`trace_allocations=True`), as allocation events.

What is measured, and how (the names and the order of the events: `etlab.facts.memory_events`):

- the CPU allocator's traffic on the running thread, through c10's memory-reporting hook (the native
  core's `MemoryWatch`, used by both cores): per instruction, the most it held at once beyond its start
  and what it kept (`temp`, `unplanned`, or a delegate's named allocation when its backend names them);
  over a load, what each delegate's init kept and what the load kept besides (`method`: the larger of
  the allocator's bytes and the process's resident growth, which also counts the Python and native
  structures of the value table and bound plan; planned arenas are mapped lazily, not resident yet);
- the process's resident memory and its high-water mark (`/proc/self/statm`, `getrusage`), before and
  after each load and each run.

Planned arenas are known, not measured: their declared sizes. Without the native core nothing is
measured per instruction (a warning says so once); the RSS deltas are still recorded.
"""

from __future__ import annotations

import os
import resource
import sys
import warnings

from etlab.facts import memory_events as M
from etlab.runtime._events import allocation_event
from etlab.runtime._native import memory_watch

_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
_warned = False


def process_memory() -> tuple[int, int]:
    """(resident bytes now, the process's resident high-water mark in bytes); resident is 0 when unknown.

    Resident from /proc/self/statm (Linux; kept open: a read costs about a microsecond), the high-water
    mark from getrusage (a lifetime maximum: /proc/self/clear_refs does not lower it)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_UNIT
    try:
        return int(os.pread(_statm_fd(), 256, 0).split()[1]) * _PAGE, peak
    except (OSError, IndexError, ValueError):
        return 0, peak


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm = [-1, -1]  # (pid, descriptor of /proc/self/statm): kept open, reading it again costs a tenth of opening it


def _statm_fd() -> int:
    """The open /proc/self/statm of this process (opened again after a fork: "self" was the parent)."""
    pid = os.getpid()
    if _statm[0] != pid:
        _statm[:] = [pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)]
    return _statm[1]


def new_watch():
    """A watch for a method's loads and runs, or None without the native core (warned once)."""
    global _warned
    watch = memory_watch()
    if watch is None and not _warned:
        _warned = True
        warnings.warn("trace_allocations: the native core is not built, so the temporaries, unplanned tensors and "
                      "load-time allocations of each instruction are not measured (RSS deltas still are)",
                      RuntimeWarning, stacklevel=3)
    return watch


def signed_events(name: str, nbytes: int) -> list[tuple]:
    """A signed quantity as an allocation event of `name` (growth) or `name:released` (shrinkage)."""
    if nbytes >= 0:
        return [allocation_event(name, nbytes)]
    return [allocation_event(M.released(name), -nbytes)]


def process_events(before: tuple[int, int], after: tuple[int, int]) -> list[tuple]:
    """The RSS and peak-RSS deltas between two `process_memory` readings (RSS only when known)."""
    events = signed_events(M.RSS, after[0] - before[0]) if before[0] and after[0] else []
    return [*events, allocation_event(M.PEAK_RSS, max(0, after[1] - before[1]))]


def step_memory_events(peak: int, kept: int, label: str = M.TEMP) -> list[tuple]:
    """The events of one instruction that held at most `peak` bytes above its start and kept `kept`:
    the transient part (peak less what it kept) under `label`, what it kept or freed as unplanned."""
    events = []
    transient = peak - max(kept, 0)
    if transient > 0:
        events.append(allocation_event(label, transient))
    if kept:
        events += signed_events(M.UNPLANNED, kept)
    return events
