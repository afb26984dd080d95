"""The native runtime core: a method's bound plan run by C++ (`_core`, built by `pip install -e .`).

The Python loops of `_interpreter` stay the reference. The native core runs the same plan,
instruction for instruction: ATen kernels through dispatcher handles resolved at load time,
with their argument stacks built at load time from the same value table (tensors are shared,
not copied: a `set_` on either side is seen by both) and their dispatch key sets resolved too,
so a run (below autograd, entered once) redispatches straight to the CPU kernel unless a
dispatch mode or RecordFunction callback (the profiler) is active; Move, Free and JumpFalse on tensors; and,
through a call back into Python, every step that needs Python (custom `register_kernel`
kernels, primitive operators on Python scalars, delegates, and anything the native core cannot
bind). On small tensors the core computes some kernels itself (`small.cpp`: copies of views, one-row
addmm/mm, sigmoid, tanh, add/sub/mul/div), where ATen's call costs more than the work: an unrolled
LSTM step is a dozen such calls. The GIL is released while native steps run. Tracing records the same timestamps and
debug values as the Python tracer, so both cores write the same ETDump; a run traced with
timings only is kept in a native `TraceLog` (its run block and Method::execute event) as raw
time-stamp-counter ticks, one counter read and one store per step, which are converted to
nanoseconds and read by Python only when the ETDump is written.

`choose_core(requested)` picks the core a program uses: `"python"`, `"native"`, or None for the
default (ETLAB_RUNTIME_CORE if set, else native when built, else Python with a warning).
"""

from __future__ import annotations

import os
import warnings

CORES = ("native", "python")
BUILD_HINT = "build it with `pip install --no-build-isolation -e .` (what `make setup` does)"

try:
    from etlab.runtime._native import _core
except ImportError as e:  # not built (or built for another torch): the Python core runs instead
    _core = None
    _IMPORT_ERROR = str(e)
else:
    _IMPORT_ERROR = ""

_warned = False


def available() -> bool:
    """Whether the native core (the compiled _core extension) imports in this process."""
    return _core is not None


def unavailable_reason() -> str:
    """Why the native core cannot be used (its import error), or '' when it can: what a fallback warning says."""
    return "" if _core is not None else f"etlab.runtime._native._core cannot be imported ({_IMPORT_ERROR})"


def choose_core(requested: str | None) -> str:
    """The core to run with: the one asked for, else the default; fails for an unknown or unbuilt one."""
    global _warned
    explicit = requested is not None
    if requested is None:
        requested = os.environ.get("ETLAB_RUNTIME_CORE") or ("native" if _core is not None else None)
    if requested is None:
        if not _warned:
            _warned = True
            warnings.warn(f"etlab's native runtime core is not built: {unavailable_reason()}; running the Python "
                          f"core, which is several times slower on small operators ({BUILD_HINT})",
                          RuntimeWarning, stacklevel=3)
        return "python"
    if requested not in CORES:
        raise ValueError(f"unknown runtime core {requested!r} (choose one of {', '.join(CORES)})")
    if requested == "native" and _core is None:
        how = "asked for" if explicit else "asked for by ETLAB_RUNTIME_CORE"
        raise RuntimeError(f"the native runtime core was {how}, but {unavailable_reason()}; {BUILD_HINT}")
    return requested


def debug_arena(size: int, limit: int):
    """The native debug-buffer allocator (shared with native traced runs): `size` bytes, growing up to
    `limit`; or None."""
    return _core.DebugArena(size, limit) if _core is not None else None


def trace_log(max_events: int):
    """The native trace of a program's timed runs (and its event count under `max_events`), or None."""
    return _core.TraceLog(max_events) if _core is not None else None


def memory_watch():
    """A watch on the CPU allocator's traffic of the thread that starts it (`_core.MemoryWatch`: `start()`
    -> bool, `stop()`, `mark()`, `take()` -> (most held above the mark, held above it)), or None."""
    return _core.MemoryWatch() if _core is not None else None
