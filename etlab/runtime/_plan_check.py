"""Load-time check of a memory plan: no two planned tensors that are live at once share bytes.

Each planned tensor already has its own storage bounded to its bytes inside its arena
(`_memory.planned_tensor`), so a bad plan cannot make a kernel write outside the arena. What a
crafted plan can still do is place two tensors that are live at the same time over the same
bytes, so one kernel's output silently overwrites another's input. This check refuses that.

Lifetimes: a planned value is live from the first to the last instruction (in chain order) that
names it, directly or through a list; method inputs from the start, outputs to the end, mutable
buffers throughout (their state outlives a run). Two tensors at exactly the same bytes (same
arena, offset and size) are taken as an alias the plan declares (upstream shares a mutable
buffer's memory that way) and are allowed.
Back-jumps (loops) do not stretch lifetimes, so a plan is never refused for a loop it got right.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from etlab.runtime._errors import LoadError
from etlab.runtime._memory import nbytes_of
from etlab.runtime._values import TENSOR, ValueTable
from etlab.schema import program as P


@dataclass(frozen=True)
class PlannedRegion:
    """Bytes [start, end) of arena `mem_id` used by value `slot` from instruction `first` to `last`."""

    slot: int
    mem_id: int
    start: int
    end: int
    first: int
    last: int


def _uses(plan: P.ExecutionPlan, table: ValueTable) -> dict[int, tuple[int, int]]:
    """Value slot -> (first, last) instruction position that names it."""
    spans: dict[int, tuple[int, int]] = {}

    def use(slot, pos: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < len(table.values):
            return
        for s in [slot, *table.list_members.get(slot, ())]:
            if s >= 0:
                first, last = spans.get(s, (pos, pos))
                spans[s] = (min(first, pos), max(last, pos))

    pos = 0
    for chain in plan.chains or []:
        for instr in chain.instructions or []:
            args = instr.instr_args
            for slot in getattr(args, "args", None) or ():
                use(slot, pos)
            for attr in ("move_from", "move_to", "cond_value_index", "value_index"):
                use(getattr(args, attr, None), pos)
            pos += 1
    end = max(pos - 1, 0)
    for slot in table.mutable_initialized:  # state kept from one run to the next
        spans[slot] = (0, end)
    for slot in plan.inputs or ():  # written before the first instruction
        if 0 <= slot < len(table.values):
            spans[slot] = (0, spans.get(slot, (0, 0))[1])
    for slot in plan.outputs or ():  # read after the last instruction
        if 0 <= slot < len(table.values):
            spans[slot] = (spans.get(slot, (end, end))[0], end)
    return spans


def planned_regions(plan: P.ExecutionPlan, table: ValueTable) -> list[PlannedRegion]:
    """The planned tensors some instruction (or the method's signature) uses, with their bytes."""
    spans = _uses(plan, table)
    regions = []
    for slot in table.planned:
        if slot not in spans or table.kinds[slot] != TENSOR:
            continue
        spec = table.specs[slot]
        info = spec.allocation_info
        t = table.values[slot]
        start = info.memory_offset
        regions.append(PlannedRegion(slot, info.memory_id, start, start + nbytes_of(list(t.shape), t.dtype),
                                     *spans[slot]))
    return regions


def check_no_live_overlap(plan: P.ExecutionPlan, table: ValueTable, what: str) -> None:
    """Raises LoadError naming two planned values that are live together over the same bytes.

    A sweep over instruction positions keeps, per arena, the byte ranges live at that point: they
    are disjoint (or identical), so a sorted list of starts answers "does this range touch a live
    one?" with one bisection; n log n overall, whatever the plan (a crafted one cannot make it slow)."""
    regions = sorted((r for r in planned_regions(plan, table) if r.end > r.start), key=lambda r: (r.first, r.slot))
    live: dict[int, _LiveRanges] = {}
    ending: list[tuple[int, int, PlannedRegion]] = []  # heap of (last, slot, region)
    for r in regions:
        while ending and ending[0][0] < r.first:
            _, _, done = heapq.heappop(ending)
            live[done.mem_id].remove(done)
        ranges = live.setdefault(r.mem_id, _LiveRanges())
        clash = ranges.clash(r)
        if clash is not None:
            raise LoadError(
                f"{what}: planned values {clash.slot} (bytes {clash.start}..{clash.end} of arena {r.mem_id}, live at "
                f"instructions {clash.first}..{clash.last}) and {r.slot} (bytes {r.start}..{r.end}, live at "
                f"{r.first}..{r.last}) overlap while both are live")
        ranges.add(r)
        heapq.heappush(ending, (r.last, r.slot, r))


class _LiveRanges:
    """Disjoint (or identical) live byte ranges of one arena, sorted by start."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.by_start: dict[int, dict[int, PlannedRegion]] = {}  # start -> slot -> region

    def clash(self, r: PlannedRegion) -> PlannedRegion | None:
        """A live region sharing bytes with `r` other than at exactly the same range, or None."""
        i = bisect.bisect_left(self.starts, r.end)
        if i == 0:
            return None
        other = next(iter(self.by_start[self.starts[i - 1]].values()))
        if other.end <= r.start or (other.start == r.start and other.end == r.end):
            return None
        return other

    def add(self, r: PlannedRegion) -> None:
        group = self.by_start.get(r.start)
        if group is None:
            bisect.insort(self.starts, r.start)
            self.by_start[r.start] = {r.slot: r}
        else:
            group[r.slot] = r

    def remove(self, r: PlannedRegion) -> None:
        group = self.by_start[r.start]
        del group[r.slot]
        if not group:
            del self.by_start[r.start]
            del self.starts[bisect.bisect_left(self.starts, r.start)]
