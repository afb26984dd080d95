"""How many intra-op threads a method's kernels run with, set around each execute.

Upstream's portable runtime runs every kernel on the calling thread. torch's kernels use a pool of
one thread per core by default; on a machine shared with other work each parallel region waits for
its slowest thread, so a profile shows spikes far above the kernels' cost (a 2-core machine under
load: `Method::execute` p90 of ~500 ms against 4.8 ms on one thread). etlab therefore runs 1 thread
unless a program is loaded with `threads=N` (None: leave torch's setting alone).

torch's setting is the OpenMP thread count of the calling thread (plus MKL's): it is set when an
execute starts and restored when it ends (~0.2 us each), so code around the runtime (eager torch in
the same process, another program) keeps its own setting.
"""

from __future__ import annotations

DEFAULT_THREADS = 1


def check_threads(threads: int | None) -> int | None:
    """`threads` if it is None or a positive int, else ValueError naming the argument."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int (or None for torch's own setting), got {threads!r}")
    return threads
