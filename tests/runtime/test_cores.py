"""The native core against the Python reference: same outputs bit for bit, same ETDump events,
errors that name the instruction, the GIL released while native steps run, and the fallback."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

from etlab.compiler import to_edge
from etlab.models import ZOO
from etlab.runtime import (
    ExecutionError,
    Runtime,
    _native,
    register_backend,
    register_kernel,
    unregister_backend,
    unregister_kernel,
)
from tests.runtime._programs import (
    PlanBuilder,
    ProgramBuilder,
    ScaleBackend,
    accumulator_program,
    add_chain,
    branch_program,
    delegate_program,
    dynamic_view_program,
)


@pytest.fixture
def runtime_core() -> str:
    """This module compares the cores itself: no per-core repetition."""
    return "both"


def _zoo_program(name: str) -> tuple[bytes, list]:
    model, inputs = ZOO[name]()
    with torch.no_grad():
        return to_edge(torch.export.export(model, tuple(inputs))).to_executorch().buffer, [list(inputs)]


def _programs() -> dict:
    chain, _ = add_chain(12, shape=(3, 5))
    x3 = torch.arange(3.0)
    return {
        "add_chain": (chain, [[torch.randn(3, 5, generator=torch.Generator().manual_seed(1))]]),
        "branch": (branch_program(), [[x3, torch.tensor(True)], [x3, torch.tensor(False)]]),
        "accumulator": (accumulator_program(None), [[x3], [x3 * 2]]),
        "dynamic_view": (dynamic_view_program(), [[torch.randn(8, 4)], [torch.randn(3, 4)]]),
        "delegate": (delegate_program(), [[torch.ones(2, 2)]]),
        "kv_cache_decoder": _zoo_program("kv_cache_decoder"),
        "cond": _zoo_program("cond"),
    }


@pytest.fixture(scope="module")
def programs() -> dict:
    register_backend("ScaleBackend", ScaleBackend())
    yield _programs()
    unregister_backend("ScaleBackend")


def _events(program) -> list:
    """Every event of the program's trace, timings and buffer offsets left out."""
    out = []
    for run in program._tracer.to_etdump().run_data:
        for e in run.events:
            if e.profile_event:
                p = e.profile_event
                out.append((run.name, "P", p.name, p.chain_index, p.instruction_id, p.delegate_debug_id_int,
                            p.delegate_debug_id_str, p.delegate_debug_metadata))
            elif e.debug_event:
                d, v = e.debug_event, e.debug_event.debug_entry
                tensors = [v.tensor] if v.tensor else (v.tensor_list.tensors if v.tensor_list else [])
                out.append((run.name, "D", d.chain_index, d.instruction_id, d.delegate_debug_id_int,
                            d.delegate_debug_id_str, int(v.val), v.int_value, v.output,
                            [(int(t.scalar_type), t.sizes, t.strides) for t in tensors]))
    return out


def _run(core: str, data: bytes, calls: list, **trace) -> tuple:
    program = Runtime.get(core=core).load_program(data, **trace)
    method = program.load_method("forward")
    assert method.core == core
    outputs = [method.execute(inputs) for inputs in calls]
    return program, outputs


@pytest.fixture
def exact_products(monkeypatch):
    """One-row float products through ATen on the native core too: its own matrix-vector kernel rounds a few
    ulps apart from MKL's (held to eager's tolerance in tests/runtime/test_small_kernels.py); every other
    native kernel gives ATen's bits."""
    from etlab.runtime._native import _plan

    monkeypatch.setattr(_plan, "native_small_products", False)


@pytest.mark.filterwarnings("ignore:ETDump buffer full:RuntimeWarning")
@pytest.mark.parametrize("trace", [
    {},
    {"enable_etdump": True},
    {"enable_etdump": True, "debug_buffer_size": 1 << 20},
    {"enable_etdump": True, "debug_buffer_size": 1 << 20, "etdump_debug_level": 1},
    {"enable_etdump": True, "debug_buffer_size": 4096},  # too small: values dropped, counted alike
], ids=["off", "timings", "intermediates", "outputs", "dropping"])
def test_both_cores_give_the_same_outputs_and_etdump(programs, trace, exact_products):
    for name, (data, calls) in programs.items():
        ref_program, expected = _run("python", data, calls, **trace)
        program, outputs = _run("native", data, calls, **trace)
        for got, want in zip(outputs, expected):
            assert len(got) == len(want), name
            for g, w in zip(got, want):
                if isinstance(w, torch.Tensor):
                    assert torch.equal(g, w), name
                else:
                    assert g == w, name
        if trace:
            assert _events(program) == _events(ref_program), name
            assert program.etdump_dropped_events == ref_program.etdump_dropped_events, name
            if trace.get("debug_buffer_size"):
                assert program._tracer.debug_buffer() == ref_program._tracer.debug_buffer(), name


def test_native_core_runs_aten_kernels_itself(programs):
    method = Runtime.get(core="native").load_program(programs["kv_cache_decoder"][0]).load_method("forward")
    counts = method._core.plan.step_counts
    assert counts["unboxed"] + counts["boxed"] > 0
    assert counts["python"] <= sum(counts.values()) // 4, counts  # only what needs Python calls back


# Kernel errors (instruction, operator, debug handle; the method stays usable) on both cores:
# tests/runtime/test_trace_buffers.py.


def test_python_kernel_errors_keep_their_type_on_the_native_core():
    def broken(x, out, _ret):
        raise KeyError("no such thing")

    register_kernel("etlab_test::broken.out", broken)
    try:
        b = PlanBuilder()
        x, out = b.tensor([2]), b.tensor([2])
        b.kernel("aten::add.out", x, x, b.int(1), out, out)
        b.kernel("etlab_test::broken.out", x, out, out)
        method = Runtime.get(core="native").load_program(ProgramBuilder().serialize([b.plan([x], [out])])) \
            .load_method("forward")
        with pytest.raises(ExecutionError,
                           match=r"instruction 1 \(etlab_test::broken.out, debug handle 1\) failed: KeyError") as e:
            method.execute([torch.ones(2)])
        assert isinstance(e.value.__cause__, KeyError)
    finally:
        unregister_kernel("etlab_test::broken.out")


def _main_thread_progress(release_gil: bool) -> int:
    """How often the main thread gets the GIL while a method's native steps run in a worker thread.

    The plan: a Python kernel (marks the start), 300 native mul.out steps, a Python kernel (marks the
    end). The main thread counts, yielding the GIL at every count (sleep(0)), while a switch interval
    of 100 s means the worker never gives the GIL up unless it releases it itself. So the count between
    the two marks is the main thread's progress during the native steps: 0 when the core holds the GIL.
    """
    counter, marks = [0], []

    def mark(x, out, _ret):  # the count before and after the copy (torch's copy_ releases the GIL itself)
        marks.append(counter[0])
        out.copy_(x)
        marks.append(counter[0])

    register_kernel("etlab_test::mark.out", mark)
    interval = sys.getswitchinterval()
    try:
        shape = (256, 256)
        b = PlanBuilder()
        x, y = b.tensor(shape), b.tensor(shape)
        b.kernel("etlab_test::mark.out", x, y, y)
        cur = y
        for _ in range(300):
            nxt = b.tensor(shape)
            b.kernel("aten::mul.out", cur, cur, nxt, nxt)
            cur = nxt
        end = b.tensor(shape)
        b.kernel("etlab_test::mark.out", cur, end, end)
        method = Runtime.get(core="native").load_program(ProgramBuilder().serialize([b.plan([x], [end])])) \
            .load_method("forward")
        method._core.plan.release_gil = release_gil
        assert method._core.python_steps["etlab_test::mark.out"] == 2
        assert method._core.plan.step_counts["unboxed"] + method._core.plan.step_counts["boxed"] == 300
        worker = threading.Thread(target=method.execute, args=([torch.ones(shape)],))
        sys.setswitchinterval(100.0)
        worker.start()
        while len(marks) < 4 and worker.is_alive():
            counter[0] += 1
            time.sleep(0)
        worker.join()
    finally:
        sys.setswitchinterval(interval)
        unregister_kernel("etlab_test::mark.out")
    assert len(marks) == 4, "the method did not run to its end"
    return marks[2] - marks[1]  # from the end of the first mark to the start of the second


def test_native_steps_run_without_the_gil():
    """A Python thread keeps running while a method's native steps do."""
    assert _main_thread_progress(release_gil=True) > 0


def test_the_gil_test_fails_when_the_core_holds_the_gil():
    """The same measure on a core made to hold the GIL (a switch of the plan, for this test only) sees
    no progress at all: the test above can fail."""
    assert _main_thread_progress(release_gil=False) == 0


def test_default_core_and_fallback(monkeypatch):
    monkeypatch.delenv("ETLAB_RUNTIME_CORE", raising=False)
    assert _native.choose_core(None) == "native"
    assert _native.choose_core("python") == "python"
    with pytest.raises(ValueError, match="unknown runtime core 'fast'"):
        Runtime.get(core="fast")
    monkeypatch.setattr(_native, "_core", None)
    monkeypatch.setattr(_native, "_warned", False)
    with pytest.warns(RuntimeWarning, match="native runtime core is not built.*running the Python core"):
        assert _native.choose_core(None) == "python"
    with pytest.raises(RuntimeError, match=r"native runtime core was asked for, but .*pip install"):
        _native.choose_core("native")
    monkeypatch.setenv("ETLAB_RUNTIME_CORE", "native")
    with pytest.raises(RuntimeError, match="asked for by ETLAB_RUNTIME_CORE"):
        _native.choose_core(None)
