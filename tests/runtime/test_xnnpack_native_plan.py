"""An XNNPACK partition run as one native loop (`backends/xnnpack/_native_plan`, `_native/xnn_plan.cpp`).

On upstream's XNNPACK programs of the zoo (float and XNNPACKQuantizer int8; the interop suite's cached exports):

- the native loop's outputs are the Python steps' bit for bit (untraced, and on both runtime cores);
- on the cnn every node of every partition is a native step (no Python per node: the point of the loop);
- a profiled run (ETDump without intermediate values) takes the timed native loop, and its delegate events are the
  Python path's: the same events, names, debug handles and node kinds in the same order, each with a real span;
- a run that logs values keeps the Python path (each node's value is logged), and so does a call the loop does not
  take (integer inputs, a smaller dynamic shape, a non-tensor argument: the Python path converts or answers);
- a mixed plan (a node the loop has no native form of) runs that node through Python inside the loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etlab.inspector import Inspector
from etlab.runtime import Runtime
from etlab.runtime._native import _core
from etlab.runtime.backends.xnnpack import _backend
from etlab.runtime.backends.xnnpack._fast import run_prepared
from tests.interop.conftest import ref_python  # noqa: F401  (the reference environment, for the exports)
from tests.interop.test_xnnpack_runtime import xnnpack_artifacts  # noqa: F401  (the cached upstream exports)

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("xnnpack_interop"),
              pytest.mark.skipif(_core is None or not hasattr(_core, "XnnPartition"), reason="native core not built")]

PROGRAMS = [(variant, model) for variant in ("float", "quantized") for model in ("cnn", "mlp", "transformer")]


@pytest.fixture(autouse=True)
def runtime_core():
    """Each test picks its cores itself."""
    return None


@pytest.fixture
def plans(monkeypatch):
    """The XNNPACK plans initialized while the fixture is active, in load order."""
    made = []
    init = _backend.XnnpackBackendRuntime.init

    def recording(self, *args, **kwargs):
        plan = init(self, *args, **kwargs)
        made.append(plan)
        return plan
    monkeypatch.setattr(_backend.XnnpackBackendRuntime, "init", recording)
    return made


def _load(d: Path, core: str = "native", **kwargs):
    program = Runtime.get(core).load_program(d / "model.pte", **kwargs)
    return program, program.load_method("forward")


def _inputs(d: Path) -> list:
    return list(torch.load(d / "inputs.pt", weights_only=True))


def _python_only(plans_: list) -> None:
    for plan in plans_:
        plan.native = plan.native_timed = None


@pytest.mark.parametrize("core", ["native", "python"])
@pytest.mark.parametrize("variant, model", PROGRAMS)
def test_native_loop_outputs_are_the_python_steps_bit_for_bit(variant, model, core, xnnpack_artifacts, plans):  # noqa: F811
    d = xnnpack_artifacts / variant / model
    _, method = _load(d, core)
    assert plans and all(p.native is not None for p in plans)
    calls = []
    for plan in plans:
        loop = plan.native

        class Counting:
            def __init__(self, loop):
                self.loop = loop

            def run(self, args, timed=False):
                result = self.loop.run(args, timed)
                calls.append(result is not None)
                return result
        plan.native = Counting(loop)
    inputs = _inputs(d)
    native = method.execute(inputs)
    float_inputs = [all(p.specs[v].quant is None for v in p.inputs) for p in plans]
    if all(float_inputs):
        assert calls and all(calls), "every delegate call took the native loop"
    else:  # a partition with integer inputs (the quantized transformer's) takes the Python path: it converts them
        assert any(calls) and not all(calls)
    _python_only(plans)
    python = method.execute(inputs)
    for a, b in zip(native, python, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), (variant, model)


@pytest.mark.parametrize("variant", ["float", "quantized"])
def test_the_cnn_runs_without_python_steps(variant, xnnpack_artifacts, plans):  # noqa: F811
    _load(xnnpack_artifacts / variant / "cnn")
    for plan in plans:
        assert "python" not in plan.native.step_kinds, plan.native.step_kinds
        assert "python" not in plan.native_timed.step_kinds, plan.native_timed.step_kinds
        assert len(plan.native_timed.step_kinds) == len(plan.nodes)  # one timed step per node
    if variant == "quantized":  # a convolution and the clamp after it: one step untraced
        assert sum(len(p.native.step_kinds) for p in plans) < sum(len(p.nodes) for p in plans)


def _delegate_events(trace: Path) -> list[tuple]:
    inspector = Inspector(etdump_path=trace, delegate_metadata_parser=lambda raw: [bytes(r).decode() for r in raw])
    return [e for e in inspector.event_blocks[-1].events if e.is_delegated_op]


def _profiled(d: Path, trace: Path, python: bool, plans_: list) -> list[torch.Tensor]:
    program, method = _load(d, enable_etdump=True)
    if python:
        _python_only(plans_)
    outputs = method.execute(_inputs(d))
    program.write_etdump_result_to_file(trace)
    plans_.clear()
    return outputs


@pytest.mark.parametrize("variant, model", [("float", "cnn"), ("quantized", "cnn"), ("float", "transformer")])
def test_profiled_runs_take_the_timed_loop_with_the_python_paths_events(variant, model, xnnpack_artifacts, plans,  # noqa: F811
                                                                       tmp_path, monkeypatch):
    d = xnnpack_artifacts / variant / model
    taken = []
    profile = _backend.native_plan.profile_events
    monkeypatch.setattr(_backend.native_plan, "profile_events",
                        lambda plan, times, context: (taken.append(len(times)), profile(plan, times, context)))
    native = _profiled(d, tmp_path / "native.etdp", False, plans)
    assert taken and all(n > 0 for n in taken), "the timed native loop ran"
    taken.clear()
    python = _profiled(d, tmp_path / "python.etdp", True, plans)
    assert not taken
    ours, theirs = _delegate_events(tmp_path / "native.etdp"), _delegate_events(tmp_path / "python.etdp")
    assert [(e.name, e.delegate_debug_identifier, e.delegate_debug_metadatas) for e in ours] == \
        [(e.name, e.delegate_debug_identifier, e.delegate_debug_metadatas) for e in theirs]
    assert all(e.perf_data is not None and min(e.perf_data.raw) >= 0 for e in ours)
    if variant == "float":  # the Python path's traced run computes as the untraced one here
        for a, b in zip(native, python, strict=True):
            assert torch.equal(a, b)
    else:  # int8 adds: on integers in the loop, on levels in the traced Python path (within one step)
        for a, b in zip(native, python, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0.1 * float(b.abs().max()))


def test_a_run_logging_values_keeps_the_python_path(xnnpack_artifacts, plans, tmp_path, monkeypatch):  # noqa: F811
    d = xnnpack_artifacts / "quantized" / "cnn"
    program, method = _load(d, enable_etdump=True, debug_buffer_size=16 << 20)
    monkeypatch.setattr(_backend.native_plan, "profile_events", lambda *a: pytest.fail("the timed loop ran"))
    for plan in plans:
        plan.native = None  # not used by a traced run either
    method.execute(_inputs(d))
    program.write_etdump_result_to_file(tmp_path / "run.etdp", tmp_path / "run.bin")
    logged = Inspector(etdump_path=tmp_path / "run.etdp", debug_buffer_path=tmp_path / "run.bin")
    assert any(e.is_delegated_op and e.debug_data for e in logged.event_blocks[-1].events)


def test_calls_the_loop_does_not_take_go_the_python_way(xnnpack_artifacts, plans):  # noqa: F811
    d = xnnpack_artifacts / "float" / "cnn"
    _load(d)
    plan = plans[0]
    x = torch.randn(plan.specs[plan.inputs[0]].shape)
    outs = [torch.empty(plan.specs[v].shape) for v in plan.outputs]
    assert plan.native.run([x, *outs]) == []
    assert plan.native.run([x.double(), *outs]) is None            # another dtype: the Python path converts/refuses
    assert plan.native.run([x[..., :-1], *outs]) is None           # a smaller (dynamic) shape
    assert plan.native.run([x] + ["not a tensor"] * len(outs)) is None  # a bad argument: the Python path names it
    assert plan.native.run([x]) is None                             # too few arguments
    want = [torch.empty_like(o) for o in outs]
    run_prepared(plan, plan.steps, [x, *want])
    plan.native.run([x, *outs])
    assert all(torch.equal(a, b) for a, b in zip(outs, want, strict=True))


def test_a_node_without_a_native_form_runs_through_python_inside_the_loop(xnnpack_artifacts, plans):  # noqa: F811
    d = xnnpack_artifacts / "float" / "cnn"
    _load(d)
    plan = plans[0]
    from etlab.runtime.backends.xnnpack import _native_plan
    original = _native_plan._add_step
    forced = []

    def python_adds(loop, step, op, slots):
        if op is not None and op[0] == "add":
            forced.append(op)
            op = None
        original(loop, step, op, slots)
    _native_plan._add_step = python_adds
    try:
        mixed = _native_plan.build(plan)
    finally:
        _native_plan._add_step = original
    assert forced and mixed.step_kinds.count("python") == len(forced)
    x = torch.randn(plan.specs[plan.inputs[0]].shape)
    got = [torch.empty(plan.specs[v].shape) for v in plan.outputs]
    want = [torch.empty_like(o) for o in got]
    assert mixed.run([x, *got]) == []
    run_prepared(plan, plan.steps, [x, *want])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
