"""ETDumps with planted allocation events, in the conventions of etlab.facts.memory_events (and one in
upstream's layout), with the numbers a reader must find in them: shared by the inspector, visualizer and
fleet memory tests."""

from __future__ import annotations

from dataclasses import dataclass

from etlab.facts import memory_events as me
from etlab.schema import etdump as s


@dataclass(frozen=True)
class Planted:
    """What `memory_dump` plants (bytes)."""

    arena: int = 1024          # planned:1 at load
    method: int = 512          # method allocator at load
    packed: int = 65_536       # delegate:XnnpackBackend:packed_weights at load
    temp: int = 4096           # a kernel's temporary at instruction 0
    workspace: int = 8192      # the delegate's workspace at instruction 2
    unplanned: tuple[int, ...] = (256, 3000, 1024)  # per run, allocated at instruction 1, released at 3
    load_rss: int = 200_000
    load_peak_rss: int = 250_000
    run_rss: int = 4096

    @property
    def held(self) -> int:
        return self.arena + self.method + self.packed

    def run_bytes(self, run: int) -> dict[int, int]:
        """Tracked bytes at each instruction of run `run`."""
        u = self.unplanned[run % len(self.unplanned)]
        return {0: self.held + self.temp, 1: self.held + u, 2: self.held + u + self.workspace, 3: self.held}

    def peak(self, runs: int) -> tuple[int, int, int]:
        """(bytes, run, instruction) of the tracked peak over `runs` runs."""
        return max(((b, -r, -i) for r in range(runs) for i, b in self.run_bytes(r).items()))


def _p(name, chain, instr, start, dur, did=-1):
    return s.Event(profile_event=s.ProfileEvent(name=name, chain_index=chain, instruction_id=instr,
                                                delegate_debug_id_int=did, start_time=start, end_time=start + dur))


def _a(allocators: list[str], name: str, size: int, base: int) -> s.Event:
    return s.Event(allocation_event=s.AllocationEvent(allocator_id=allocators.index(name) + base,
                                                      allocation_size=size))


def memory_dump(runs: int = 3, planted: Planted = Planted(), *, base: int = me.FIRST_ALLOCATOR_ID) -> s.ETDump:
    """A load block and `runs` run blocks of a 4-instruction method: a kernel with a temporary (instruction
    0), one that allocates an unplanned tensor (1), a delegate call with a workspace (2), one that frees the
    unplanned tensor (3); RSS growth at load and in the first run. Allocator ids count from `base`."""
    load_alloc = [me.planned(1), me.METHOD, me.delegate("XnnpackBackend", "packed_weights"), me.RSS, me.PEAK_RSS]
    load = s.RunData(name=me.LOAD_BLOCK, allocators=[s.Allocator(n) for n in load_alloc], events=[
        _a(load_alloc, me.planned(1), planted.arena, base), _a(load_alloc, me.METHOD, planted.method, base),
        _a(load_alloc, load_alloc[2], planted.packed, base),
        _p(s.METHOD_INIT, -1, 0, 100, 50),
        _a(load_alloc, me.RSS, planted.load_rss, base), _a(load_alloc, me.PEAK_RSS, planted.load_peak_rss, base),
        _p(s.LOAD_METHOD, -1, 0, 90, 80),
    ])
    run_alloc = [me.TEMP, me.UNPLANNED, me.released(me.UNPLANNED), me.delegate("XnnpackBackend", "workspace"),
                 me.RSS, me.PEAK_RSS]
    blocks = [load]
    t = 1000
    for r in range(runs):
        u = planted.unplanned[r % len(planted.unplanned)]
        ev = [_a(run_alloc, me.TEMP, planted.temp, base), _p("native_call_convolution.out", 0, 0, t, 10),
              _p(s.OPERATOR_CALL, 0, 0, t, 12),
              _a(run_alloc, me.UNPLANNED, u, base), _p("native_call_nonzero.out", 0, 1, t + 20, 10),
              _p(s.OPERATOR_CALL, 0, 1, t + 20, 12),
              _a(run_alloc, run_alloc[3], planted.workspace, base), _p("xnn_conv", 0, 2, t + 40, 5, did=0),
              _p(s.DELEGATE_CALL, 0, 2, t + 38, 10),
              _a(run_alloc, run_alloc[2], u, base), _p("native_call_add.out", 0, 3, t + 60, 10),
              _p(s.OPERATOR_CALL, 0, 3, t + 60, 12)]
        if r == 0:
            ev += [_a(run_alloc, me.RSS, planted.run_rss, base), _a(run_alloc, me.PEAK_RSS, planted.run_rss, base)]
        ev.append(_p(s.METHOD_EXECUTE, -1, 0, t, 80))
        blocks.append(s.RunData(name=me.RUN_BLOCK, allocators=[s.Allocator(n) for n in run_alloc], events=ev))
        t += 1000
    return s.ETDump(version=0, run_data=blocks)
