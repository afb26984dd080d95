"""The native core checks what it uses itself, whatever the Python side checked before: jump
destinations, debug-arena sizes and alignments (no signed overflow; a refused reservation changes
nothing). The Python fallback arena behaves alike."""

from __future__ import annotations

import pytest
import torch

from etlab.runtime import _native
from etlab.runtime._event_tracer import EventTracer, _DebugArena
from etlab.runtime._interpreter import Goto


@pytest.fixture
def runtime_core() -> str:
    """These tests call the native core's classes directly: no per-core repetition."""
    return "both"


def _arenas(size: int, limit: int) -> list:
    return [_native._core.DebugArena(size, limit), _DebugArena(size, limit)]


def _plan():
    return _native._core.NativePlan(Goto, [], [-1] * 64)


def test_jump_destinations_are_checked_where_taken():
    plan = _plan()
    c = plan.add_chain(True)
    plan.add_jump(c, torch.tensor(False), 5)  # a chain of one step: 5 is past its end
    with pytest.raises(IndexError, match=r"step 0 jumps to 5: not a later step of its chain of 1"):
        plan.run()
    assert (plan.failed_chain, plan.failed_index) == (0, 0)
    back = _plan()
    c = back.add_chain(True)
    back.add_jump(c, torch.tensor(True), 2)  # taken never (the condition holds)
    back.add_jump(c, torch.tensor(False), 0)  # a loop back to the start: a run would never end
    with pytest.raises(IndexError, match=r"step 1 jumps to 0: not a later step"):
        back.run()
    with pytest.raises(IndexError, match="jump destination -1"):
        _plan().add_jump(_plan().add_chain(True), torch.tensor(False), -1)


def test_a_forward_jump_to_the_end_runs():
    plan = _plan()
    c = plan.add_chain(True)
    plan.add_jump(c, torch.tensor(False), 1)
    plan.run()


@pytest.mark.parametrize("which", [0, 1], ids=["native", "python"])
def test_debug_arena_sizes_cannot_overflow(which):
    arena = _arenas(0, 1 << 20)[which]
    assert arena.reserve(100, 64)[0] == 0
    used = arena.used
    for nbytes in (1 << 62, (1 << 63) - 1, 1 << 21):  # past the limit: refused, nothing changed
        assert arena.reserve(nbytes, 64)[0] == -1
        assert arena.used == used
    with pytest.raises(ValueError, match="alignment a power of two"):
        arena.reserve(8, 3)
    with pytest.raises(ValueError, match="alignment a power of two"):
        arena.reserve(8, 1 << 40)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        arena.reserve(-1, 64)
    assert arena.reserve(8, 64)[0] == 128
    with pytest.raises(ValueError, match=r"size and limit|size or limit"):
        _arenas(0, 1 << 60)[which]
    with pytest.raises(ValueError, match=r"debug_buffer_size .* is above"):
        EventTracer(debug_buffer_size=1 << 60)
