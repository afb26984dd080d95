"""Dynamic shapes on the native core (`_native/dynamic.cpp`): sizes computed while running (sym_size,
executorch_prim's arithmetic) are run-time ints of the core, and the views, expands, copies and convolutions
reading them run natively, with the Python core's results bit for bit; a size past the plan's memory is a clean
error on both cores, never a crash or a write past it."""

from __future__ import annotations

import pytest
import torch

from etlab.runtime import ExecutionError, Runtime
from tests.runtime._programs import PlanBuilder, ProgramBuilder


@pytest.fixture
def runtime_core() -> str:
    """This module compares the cores itself: no per-core repetition."""
    return "both"


def _methods(data: bytes):
    return [Runtime.get(core=core).load_program(data).load_method("forward") for core in ("native", "python")]


def _same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert g.shape == w.shape and torch.equal(g, w)
        else:
            assert type(g) is type(w) and g == w


def _int_program(offset: int) -> bytes:
    """forward(x: <=[8, 6]) -> (n, k, (n - offset) // 3, (n - offset) % 3, -k, max(n, k), n < k, x expanded
    to [2, n, k] and viewed as [2 * n * k], x's first n - 1 rows through slice_copy): Python's int semantics,
    int and bool outputs, patched kernel arguments."""
    b = PlanBuilder()
    x = b.tensor([8, 6], dynamic=True)
    n, k, d, q, r, neg, big, less, nk, two_nk, m1 = (b.int(0) for _ in range(11))
    less = b.bool(False)
    b.kernel("aten::sym_size.int", x, b.int(0), n)
    b.kernel("aten::sym_size.int", x, b.int(-1), k)
    b.kernel("executorch_prim::sub.Scalar", n, b.int(offset), d)
    b.kernel("executorch_prim::floordiv.int", d, b.int(3), q)
    b.kernel("executorch_prim::mod.int", d, b.int(3), r)
    b.kernel("executorch_prim::neg.Scalar", k, neg)
    b.kernel("executorch_prim::sym_max.Scalar", n, k, big)
    b.kernel("executorch_prim::lt.Scalar", n, k, less)
    b.kernel("executorch_prim::mul.Scalar", n, k, nk)
    b.kernel("executorch_prim::mul.Scalar", nk, b.int(2), two_nk)
    b.kernel("executorch_prim::sub.Scalar", n, b.int(1), m1)
    expanded = b.tensor([2, 8, 6], dynamic=True)
    b.kernel("aten::expand_copy.out", x, b.int_list([2, ("v", n), ("v", k)]), b.bool(False), expanded, expanded)
    flat = b.tensor([96], dynamic=True, planned=False)
    b.kernel("executorch_prim::et_view.default", expanded, b.int_list([("v", two_nk)]), flat)
    rows = b.tensor([8, 6], dynamic=True)
    b.kernel("aten::slice_copy.Tensor_out", x, b.int(0), b.int(0), m1, b.int(1), rows, rows)
    return ProgramBuilder().serialize([b.plan([x], [n, k, q, r, neg, big, less, flat, rows])])


@pytest.mark.parametrize("offset", [0, 10, 100])
def test_run_time_ints_match_python_for_every_size(offset):
    native, python = _methods(_int_program(offset))
    assert native._core.python_steps == {}  # every step native
    for rows, cols in [(1, 6), (5, 2), (8, 6), (3, 1), (8, 1)]:  # (8, 6): the upper bound
        x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * 7 + cols))
        got, want = native.execute([x]), python.execute([x])
        _same(got, want)
        assert got[2] == (rows - offset) // 3 and got[3] == (rows - offset) % 3 and got[6] is (rows < cols)
        assert torch.equal(got[7], x.expand(2, rows, cols).reshape(-1)) and torch.equal(got[8], x[: rows - 1])


def _python_reader_program() -> bytes:
    """forward(x: <=[4, 6]) = full([n, k], 2.5): full.out's size is checked before each call by its Python step,
    which reads the run-time ints n and k (published to the value table first)."""
    b = PlanBuilder()
    x = b.tensor([4, 6], dynamic=True)
    n, k = b.int(0), b.int(0)
    b.kernel("aten::sym_size.int", x, b.int(0), n)
    b.kernel("aten::sym_size.int", x, b.int(1), k)
    out = b.tensor([4, 6], dynamic=True)
    b.kernel("aten::full.out", b.int_list([("v", n), ("v", k)]), b.double(2.5), out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


def test_a_python_step_reads_the_run_time_ints_of_this_run():
    native, python = _methods(_python_reader_program())
    assert native._core.python_steps == {"aten::full.out": 1}
    for shape in [(1, 1), (3, 5), (4, 6), (2, 6)]:
        got = native.execute([torch.zeros(shape)])
        _same(got, python.execute([torch.zeros(shape)]))
        _same(got, [torch.full(shape, 2.5)])


@pytest.mark.parametrize("trace", [{"enable_etdump": True}, {"enable_etdump": True, "debug_buffer_size": 1 << 20}])
def test_traces_of_dynamic_steps_match_the_python_cores(trace):
    from tests.runtime.test_cores import _events

    programs = [Runtime.get(core=core).load_program(_int_program(10), **trace) for core in ("native", "python")]
    for shape in [(2, 3), (8, 6)]:
        outputs = [p.load_method("forward").execute([torch.ones(shape)]) for p in programs]
        _same(*outputs)
    assert _events(programs[0]) == _events(programs[1])
    if trace.get("debug_buffer_size"):
        assert programs[0]._tracer.debug_buffer() == programs[1]._tracer.debug_buffer()


def test_an_input_past_its_bound_is_refused_by_both_cores():
    for method in _methods(_int_program(0)):
        with pytest.raises(ExecutionError, match="exceeds its upper bound"):
            method.execute([torch.zeros(9, 6)])
        _same(method.execute([torch.ones(2, 3)])[:2], [2, 3])  # still usable


def _overflow_program(factor: int) -> bytes:
    """forward(x: <=[4, 4]) = x expanded to [n * factor, k] (planned for [4, 4]): past the plan for factor > 1."""
    b = PlanBuilder()
    x = b.tensor([4, 4], dynamic=True)
    n, k, rows = b.int(0), b.int(0), b.int(0)
    b.kernel("aten::sym_size.int", x, b.int(0), n)
    b.kernel("aten::sym_size.int", x, b.int(1), k)
    b.kernel("executorch_prim::mul.Scalar", n, b.int(factor), rows)
    one = b.tensor([1, 4], dynamic=True)
    b.kernel("aten::slice_copy.Tensor_out", x, b.int(0), b.int(0), b.int(1), b.int(1), one, one)
    out = b.tensor([4, 4], dynamic=True)
    b.kernel("aten::expand_copy.out", one, b.int_list([("v", rows), ("v", k)]), b.bool(False), out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


def test_a_size_past_the_planned_memory_is_a_clean_error_on_both_cores():
    native, python = _methods(_overflow_program(4))
    assert native._core.python_steps == {}
    x = torch.randn(1, 4)
    _same(native.execute([x]), python.execute([x]))  # 4 rows: within the plan
    for method in (native, python):
        with pytest.raises(ExecutionError, match=r"expand_copy.*\[12, 4\] result \(192 bytes\).*planned memory"):
            method.execute([torch.randn(3, 4)])  # 12 rows of a plan for 4
        _same(method.execute([x]), [x.expand(4, 4)])  # the method stays usable


def test_a_dim_order_copy_past_its_planned_memory_is_a_clean_error():
    b = PlanBuilder()
    x = b.tensor([8, 4], dynamic=True)
    out = b.tensor([2, 4], dynamic=True)  # planned for 2 rows only
    b.kernel("dim_order_ops::_clone_dim_order.out", x, b.bool(False), b.int_list([0, 1]), out, out)
    native, python = _methods(ProgramBuilder().serialize([b.plan([x], [out])]))
    assert native._core.python_steps == {}
    x = torch.randn(2, 4)
    _same(native.execute([x]), [x])
    with pytest.raises(ExecutionError, match=r"\[5, 4\] result \(80 bytes\) is larger than its output's planned"):
        native.execute([torch.randn(5, 4)])
    with pytest.raises(ExecutionError, match="_clone_dim_order"):
        python.execute([torch.randn(5, 4)])
    _same(native.execute([x]), python.execute([x]))


def _int_overflow_program() -> bytes:
    b = PlanBuilder()
    x = b.tensor([4], dynamic=True)
    n, big = b.int(0), b.int(0)
    b.kernel("aten::sym_size.int", x, b.int(0), n)
    b.kernel("executorch_prim::mul.Scalar", n, b.int(2**62), big)
    return ProgramBuilder().serialize([b.plan([x], [big])])


def test_int64_overflow_is_an_error_not_a_wrapped_size():
    native, python = _methods(_int_overflow_program())
    assert native.execute([torch.zeros(1)]) == python.execute([torch.zeros(1)]) == [2**62]
    with pytest.raises(ExecutionError, match="overflow"):
        native.execute([torch.zeros(4)])
    assert python.execute([torch.zeros(4)]) == [2**64]  # Python's ints do not overflow


@pytest.fixture(scope="module")
def corpus_programs() -> dict:
    from etlab.compiler import to_edge
    from etlab.models.corpus import CORPUS

    out = {}
    for name in ("dynamic_encoder", "dynamic_conv1d"):
        entry = CORPUS[name]
        module, methods = entry.build()
        out[name] = bytes(to_edge(entry.export((module, methods))).to_executorch().buffer)
    return out


_SIZES = {
    "dynamic_encoder": [lambda g, shape=shape: torch.randint(0, 50, shape, generator=g)
                        for shape in [(1, 2), (3, 7), (8, 32)]],
    "dynamic_conv1d": [lambda g, n=n: torch.randn(1, 4, n, generator=g) for n in (8, 41, 256)],
}
_PAST = {"dynamic_encoder": torch.zeros(8, 33, dtype=torch.long), "dynamic_conv1d": torch.zeros(1, 4, 257)}


@pytest.mark.parametrize("name", ["dynamic_encoder", "dynamic_conv1d"])
def test_corpus_dynamic_models_run_natively_with_the_python_cores_bits(corpus_programs, name, monkeypatch):
    from etlab.runtime._native import _plan

    monkeypatch.setattr(_plan, "native_small_products", False)  # ATen's products on both cores: the same bits
    native, python = _methods(corpus_programs[name])
    assert native._core.python_steps == {}, native._core.python_steps
    g = torch.Generator().manual_seed(0)
    for make in _SIZES[name]:  # the last at the upper bound
        x = make(g)
        for _ in range(2):
            _same(native.execute([x]), python.execute([x]))
    for method in (native, python):
        with pytest.raises(ExecutionError, match="upper bound"):
            method.execute([_PAST[name]])
