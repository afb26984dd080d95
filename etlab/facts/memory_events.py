"""Memory events in an ETDump: what each allocator name means and which instruction an event belongs to.

The one place for these facts: the runtime writes them (`etlab.runtime`, `trace_allocations=True`),
the Inspector, the views and the fleet read them. Torch-free, pure functions.

Upstream's schema has `RunData.allocators` (a list of names) and `AllocationEvent` (an index into
that list and an unsigned size in bytes); nothing more. etlab keeps to it and gives the names and
the order of events their meaning:

Allocator names (`parse_allocator` reads them back):

- `planned:<mem_id>`: a method's planned arena of that memory id (its declared size), at load;
- `shared:<mem_id>`: the program's shared state (`share_mutable_buffers`), one arena whichever
  method names it: recorded by the first load that allocates it only;
- `method`: the method allocator at load: what the load kept besides what its delegates' init kept
  (the value table, the bound and native plans: the larger of the CPU allocator's bytes the load kept
  and the process's resident growth over it; planned arenas are mapped lazily, so not in it);
- `delegate:<backend_id>:<what>`: a delegate's memory, named by its backend (`memory_names`): what its
  init kept, at load (`delegate:XnnpackBackend:packed_weights`; `...:init` for a backend that names
  nothing), and the transient memory of a call, at its DELEGATE_CALL instruction
  (`delegate:XnnpackBackend:workspace`; a backend that names nothing has it as `temp`);
- `temp`: an instruction's temporaries: the most the CPU allocator held at once during the call beyond
  what it held when the call started and what the call kept;
- `unplanned`: bytes an instruction allocated and still held when it ended (dynamic-shape or
  unplanned tensors torch sized as it ran); `unplanned:released`: bytes an instruction freed of those.
  An instruction's high-water mark above its start is its `temp` (or delegate workspace) plus its `unplanned`;
- `rss`, `rss:released`: the growth / shrinkage of the process's resident memory over a load or a run;
- `peak_rss`: the growth of the process's resident high-water mark over a load or a run (it never shrinks).

A quantity that can shrink is two allocators (`<name>` grows, `<name>:released` shrinks), since an
allocation size is unsigned; `signed_size` gives the signed bytes of an event.

Measured on the thread that runs the method (intra-op worker threads' allocations included when torch
hands them its thread-local state); not measured under torch's profiler, which owns those reports.

Which instruction: an allocation event belongs to the first profile event after it in the same run
block (upstream's runtime writes a profile event when the instruction ends, after whatever it
allocated). That event is an instruction's (its `native_call_<op>` / `OPERATOR_CALL` /
`DELEGATE_CALL` event, carrying chain and instruction ids), `Method::init` (a load: the load block
"Default" holds every load), or `Method::execute` (the run as a whole: its RSS deltas).
`owner_positions` applies the rule to a block's event kinds.

Which allocator: upstream's ETDumpGen numbers a block's allocators from 1 (`track_allocator` returns the
length of the block's list after adding the name: checked on 1.5.1's libexecutorch_etdump), so
allocator_id k names `allocators[k - 1]`; `allocator_base` / `allocator_name` read either numbering
(a block with an id 0 was written counting from 0, as etlab did before).

Where: load-time events in the block named "Default" (upstream's load block), per-run events in
each "Execute" block; each block lists only the allocators its events use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PLANNED = "planned"
SHARED = "shared"
METHOD = "method"
DELEGATE = "delegate"
TEMP = "temp"
UNPLANNED = "unplanned"
RSS = "rss"
PEAK_RSS = "peak_rss"
RELEASED = "released"  # the suffix of an allocator whose events shrink a quantity

# Owner kinds, in the order summaries list them.
OWNER_KINDS = (PLANNED, SHARED, METHOD, DELEGATE, TEMP, UNPLANNED, RSS, PEAK_RSS)

LOAD_BLOCK = "Default"
RUN_BLOCK = "Execute"


@dataclass(frozen=True)
class AllocatorName:
    """A parsed allocator name: its owner kind, memory id (planned / shared), backend and what (delegate),
    and whether its events shrink the quantity (`released`)."""

    kind: str
    mem_id: int | None = None
    backend: str | None = None
    what: str | None = None
    released: bool = False

    @property
    def sign(self) -> int:
        """+1 when the allocator's events add bytes, -1 when they release them."""
        return -1 if self.released else 1


def planned(mem_id: int) -> str:
    """The allocator name the runtime logs planned arena `mem_id` under."""
    return f"{PLANNED}:{int(mem_id)}"


def shared(mem_id: int) -> str:
    """The allocator name the runtime logs shared (cross-method) arena `mem_id` under."""
    return f"{SHARED}:{int(mem_id)}"


def delegate(backend_id: str, what: str) -> str:
    """`delegate:<backend_id>:<what>`; the backend id may not hold a colon (what may)."""
    if not backend_id or ":" in backend_id or not what:
        raise ValueError(f"a delegate allocator needs a backend id without ':' and a what: {backend_id!r}, {what!r}")
    return f"{DELEGATE}:{backend_id}:{what}"


def released(name: str) -> str:
    """The allocator whose events shrink what `name` counts (`rss` -> `rss:released`)."""
    return f"{name}:{RELEASED}"


def parse_allocator(name: str) -> AllocatorName:
    """The parsed form of an allocator name; names of other writers (upstream's, older etlab's) parse to
    kind "other" with nothing else set, so a reader can still list them."""
    if not isinstance(name, str):
        return AllocatorName("other")
    if name.endswith(":" + RELEASED) and name.count(":") >= 1:
        inner = parse_allocator(name[: -len(RELEASED) - 1])
        if inner.kind in (UNPLANNED, RSS):
            return AllocatorName(inner.kind, released=True)
        return AllocatorName("other")
    head, _, rest = name.partition(":")
    if head in (PLANNED, SHARED):
        return AllocatorName(head, mem_id=int(rest)) if rest.isdigit() else AllocatorName("other")
    if head == DELEGATE:
        backend, _, what = rest.partition(":")
        return AllocatorName(DELEGATE, backend=backend, what=what) if backend and what else AllocatorName("other")
    if name in (METHOD, TEMP, UNPLANNED, RSS, PEAK_RSS):
        return AllocatorName(name)
    return AllocatorName("other")


def owner_kind(name: str) -> str:
    """The owner kind of an allocator name: one of OWNER_KINDS, or "other"."""
    return parse_allocator(name).kind


def signed_size(name: str, size: int) -> int:
    """The signed bytes of an allocation event of allocator `name` (negative for a `:released` allocator)."""
    return parse_allocator(name).sign * int(size)


def owner_positions(kinds: Sequence[str]) -> list[int]:
    """For each event of a block (its kind: "profile", "debug" or "allocation", in order), the index of
    the profile event an allocation event belongs to (the first profile event after it), or -1 for an
    allocation event with no profile event after it and for the other events."""
    owners = [-1] * len(kinds)
    waiting: list[int] = []
    for i, kind in enumerate(kinds):
        if kind == "allocation":
            waiting.append(i)
        elif kind == "profile":
            for w in waiting:
                owners[w] = i
            waiting.clear()
    return owners


FIRST_ALLOCATOR_ID = 1  # upstream's first allocator of a block (see the module docstring)


def allocator_base(ids: Sequence[int]) -> int:
    """The id of the first allocator in a block whose allocation events use `ids`: 1 (upstream's numbering),
    or 0 when an event uses id 0 (a block written counting from 0)."""
    return 0 if any(int(i) == 0 for i in ids) else FIRST_ALLOCATOR_ID


def allocator_name(names: Sequence[str | None] | None, allocator_id: int, base: int = FIRST_ALLOCATOR_ID
                   ) -> str | None:
    """The name allocator_id stands for in a block listing `names` (None when it names none)."""
    i = int(allocator_id) - base
    return names[i] if names is not None and 0 <= i < len(names) else None
