"""The native core's fused LSTM cell (`_native/_lstm_cells.py`, `_native/lstm.cpp`): Edge's twelve steps per time
step computed as one in untraced runs.

Tolerance: the fused cell computes the recurrent product with the core's own one-row kernel and the sums in the
decomposed steps' order, but its tanh is SLEEF's (the decomposed tanh step calls MKL's vmsTanh; both within ~1 ulp)
and elements past the last whole vector go through the vector sigmoid/tanh where ATen's loop uses std::exp /
std::tanh (~1 ulp apart). Gates and states lie in [-1, 1] (c a little beyond), so each step differs by ~1e-7 at
most and the recurrence does not amplify it (the gates are contractions): 1e-5 absolute leaves a margin of ~100x
over what these models show (3e-8), and is far below any real error (a wrong gate order or a missed state moves
outputs by 1e-2 and more). Timed and traced runs run the steps themselves: their outputs are the unfused plan's,
bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etlab.compiler import to_edge
from etlab.runtime import Runtime, _native
from etlab.runtime._event_tracer import DebugLevel
from etlab.runtime._native import _plan

ATOL = 1e-5

pytestmark = pytest.mark.skipif(not _native.available(), reason="the native core is not built")


@pytest.fixture(autouse=True)
def runtime_core() -> str:
    """Each test names its core (the package's fixture would run every test once per core)."""
    return "native"


class Lstm(nn.Module):
    """Two layers, a hidden size (20) that is not a whole number of vectors, (h, c) outputs as well."""

    def __init__(self, batch_first: bool = True):
        super().__init__()
        self.lstm = nn.LSTM(12, 20, num_layers=2, batch_first=batch_first)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return out, h, c


class ManualCells(nn.Module):
    """An LSTM written out by hand: a product without a bias (mm), the state read from inputs (no step folded at
    load); `leak` also returns the input gate of step 1, which the fused step would never write."""

    def __init__(self, leak: bool = False, hidden: int = 16):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4 * hidden, hidden) * 0.3)
        self.hidden, self.leak = hidden, leak

    def forward(self, xs, h, c):
        outs, leaked = [], None
        for t, x in enumerate(xs.unbind(0)):  # the steps' inputs first, as Edge's LSTM takes them
            gates = h @ self.w.t() + x
            i, f, g, o = torch.split(gates, [self.hidden] * 4, dim=-1)
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            c = f * c + i * g
            h = o * torch.tanh(c)
            outs.append(h)
            if t == 1:
                leaked = i
        result = (torch.stack(outs), c)
        return (*result, leaked) if self.leak else result


def _program(model: nn.Module, inputs: tuple) -> bytes:
    with torch.no_grad():
        return to_edge(torch.export.export(model, inputs)).to_executorch().buffer


def _load(program: bytes, fuse: bool, monkeypatch, **kwargs):
    monkeypatch.setattr(_plan, "native_lstm_cells", fuse)
    method = Runtime.get(core="native").load_program(program, threads=1, **kwargs).load_method("forward")
    monkeypatch.setattr(_plan, "native_lstm_cells", True)
    return method


def _outputs(method, inputs) -> list[torch.Tensor]:
    return [[t.clone() for t in method.execute(list(inputs))] for _ in range(2)][-1]  # a second run: no state left


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("batch", [1, 3])
def test_lstm_cells_fused_within_tolerance_of_the_steps_and_eager(batch, monkeypatch):
    torch.manual_seed(0)
    model, x = Lstm().eval(), torch.randn(batch, 7, 12)
    program = _program(model, (x,))
    fused, steps = _load(program, True, monkeypatch), _load(program, False, monkeypatch)
    # 7 steps x 2 layers; the first step of each layer starts from zero states, its product folded at load
    assert fused._core.plan.fused_cells == 12
    assert steps._core.plan.fused_cells == 0
    with torch.no_grad():
        eager = model(x)
    got, want = _outputs(fused, (x,)), _outputs(steps, (x,))
    for g, w, e in zip(got, want, eager, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
        torch.testing.assert_close(g, e, atol=ATOL, rtol=0)
    assert not all(_bits(g, w) for g, w in zip(got, want))  # the fused step did run (SLEEF's tanh, not MKL's)


def test_the_python_core_stays_the_unfused_reference():
    torch.manual_seed(1)
    model, x = Lstm(batch_first=False).eval(), torch.randn(5, 2, 12)
    program = _program(model, (x,))
    python = Runtime.get(core="python").load_program(program, threads=1).load_method("forward")
    native = Runtime.get(core="native").load_program(program, threads=1).load_method("forward")
    assert native._core.plan.fused_cells > 0 and not hasattr(python._core, "plan")
    for g, w in zip(_outputs(native, (x,)), _outputs(python, (x,)), strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


def _timed(method, inputs) -> tuple[list[torch.Tensor], int]:
    """A timed run (`run_timed`, what an ETDump profile records) at the method's thread count: outputs, events."""
    before = torch.get_num_threads()
    torch.set_num_threads(method.threads)
    try:
        method._set_inputs(list(inputs))
        _, count = method._core.run_timed()
    finally:
        torch.set_num_threads(before)
    return [method._table.values[s].clone() for s in method._outputs], count


def test_timed_traced_and_profiled_runs_run_every_step(monkeypatch):
    """Timed runs (ETDump profiling, natively logged or not) keep one step per instruction: the event count is the
    unfused plan's and the outputs the unfused steps' bits; a run under torch's profiler makes every call through the
    dispatcher (where the profiler sees it), the unfused plan's calls."""
    torch.manual_seed(2)
    model, x = Lstm().eval(), torch.randn(1, 6, 12)
    program = _program(model, (x,))
    fused, steps = _load(program, True, monkeypatch), _load(program, False, monkeypatch)
    assert fused._core.plan.fused_cells > 0
    want = _outputs(steps, (x,))
    timed, count = _timed(fused, (x,))
    timed_steps, count_steps = _timed(steps, (x,))
    assert count == count_steps == sum(chain.events_per_run for chain in fused._bound.chains)
    assert all(_bits(g, w) for g, w in zip([*timed, *timed_steps], [*want, *want], strict=True))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):  # ATen's kernels, both plans
        profiled, profiled_steps = _outputs(fused, (x,)), _outputs(steps, (x,))
    assert all(_bits(g, w) for g, w in zip(profiled, profiled_steps, strict=True))
    assert not all(_bits(g, w) for g, w in zip(_outputs(fused, (x,)), want))  # untraced again: fused
    logged = _load(program, True, monkeypatch, enable_etdump=True)
    assert logged._core.plan.fused_cells > 0  # profiling only: the plan has the cells, its timed runs skip them
    assert all(_bits(g, w) for g, w in zip(_outputs(logged, (x,)), want, strict=True))


def test_a_method_that_logs_intermediate_outputs_is_not_fused(monkeypatch):
    torch.manual_seed(4)
    model, x = Lstm().eval(), torch.randn(1, 4, 12)
    logged = _load(_program(model, (x,)), True, monkeypatch, enable_etdump=True, debug_buffer_size=1 << 20,
                   etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    assert logged._core.plan.fused_cells == 0


def test_hand_written_cells_without_bias_fuse_and_a_leaked_gate_keeps_its_cell_unfused(monkeypatch):
    torch.manual_seed(5)
    hidden, steps_ = 16, 4
    inputs = (torch.randn(steps_, 2, 4 * hidden), torch.randn(2, hidden), torch.randn(2, hidden))
    for leak, cells in ((False, steps_), (True, steps_ - 1)):
        model = ManualCells(leak, hidden).eval()
        program = _program(model, inputs)
        fused, steps = _load(program, True, monkeypatch), _load(program, False, monkeypatch)
        assert fused._core.plan.fused_cells == cells, leak
        with torch.no_grad():
            eager = model(*inputs)
        for g, w, e in zip(_outputs(fused, inputs), _outputs(steps, inputs), eager, strict=True):
            torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
            torch.testing.assert_close(g, e, atol=ATOL, rtol=0)


def test_set_lstm_cell_refuses_what_is_not_a_cell():
    from etlab.runtime._native import _core

    t = torch.zeros(1, 8)
    plan = _core.NativePlan(object, [t], [-1] * 64)
    plan.add_chain(False)
    plan.add_nop(0, "aten::addmm.out")
    with pytest.raises(IndexError, match="not steps of the chain"):
        plan.set_lstm_cell(0, 0, 12, None, t, torch.zeros(8, 32), torch.zeros(1, 32), torch.zeros(1, 8),
                           torch.zeros(1, 8), torch.zeros(1, 8))
    with pytest.raises(ValueError, match="not a kernel"):
        plan.set_lstm_cell(0, 0, 1, None, t, torch.zeros(8, 32), torch.zeros(1, 32), torch.zeros(1, 8),
                           torch.zeros(1, 8), torch.zeros(1, 8))
