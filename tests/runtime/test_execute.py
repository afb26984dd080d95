"""Loading and running hand-built programs: memory plan, outputs, validation, kernels, metadata."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from etlab.runtime import (
    ExecutionError,
    LoadError,
    Runtime,
    register_kernel,
    unregister_kernel,
)
from etlab.schema import program as P
from tests.runtime._programs import PlanBuilder, ProgramBuilder, add_chain


@pytest.fixture(scope="module")
def rt():
    return Runtime.get()


@pytest.mark.parametrize("inline_constants", [False, True])
def test_add_chain_matches_torch(rt, tmp_path, inline_constants):
    data, w = add_chain(5, inline_constants=inline_constants)
    path = tmp_path / "chain.pte"
    path.write_bytes(data)
    for source in (path, str(path), data, bytearray(data), io.BytesIO(data)):
        method = rt.load_program(source).load_method("forward")
        x = torch.randn(2, 3)
        (out,) = method.execute([x])
        torch.testing.assert_close(out, x + 5 * w, rtol=1e-6, atol=1e-6)


def test_planned_tensors_are_views_at_their_offsets(rt):
    data, _ = add_chain(3)
    program = rt.load_program(data)
    method = program.load_method("forward")
    arena = method._arenas.tensors[1]
    plan = program.pte.program.execution_plan[0]
    for slot, ev in enumerate(plan.values):
        if isinstance(ev.val, P.Tensor) and ev.val.allocation_info is not None:
            t = method._table.values[slot]
            assert t.data_ptr() - arena.data_ptr() == ev.val.allocation_info.memory_offset
            with pytest.raises(RuntimeError, match="not resizable"):
                t.resize_(t.numel() * 4)  # a planned tensor cannot grow into its neighbours


def test_constants_are_zero_copy_views_of_the_file(rt, tmp_path):
    data, w = add_chain(2)
    path = tmp_path / "chain.pte"
    path.write_bytes(data)
    program = rt.load_program(path)
    method = program.load_method("forward")
    seg = program.pte.segments[0]
    seg_addr = np.frombuffer(seg, dtype=np.uint8).ctypes.data
    const = next(method._table.values[s] for s in method._table.constant)
    assert seg_addr <= const.data_ptr() < seg_addr + len(seg)
    torch.testing.assert_close(const, w)


def test_outputs_do_not_alias_method_memory(rt):
    data, w = add_chain(2)
    method = rt.load_program(data).load_method("forward")
    x1, x2 = torch.zeros(2, 3), torch.ones(2, 3)
    (o1,) = method.execute([x1])
    keep = o1.clone()
    (o2,) = method.execute([x2])
    torch.testing.assert_close(o1, keep)  # the second run did not overwrite the first output
    torch.testing.assert_close(o2, x2 + 2 * w)
    arena = method._arenas.tensors[1]
    assert not (arena.data_ptr() <= o2.data_ptr() < arena.data_ptr() + arena.numel())


@pytest.mark.parametrize(("inputs", "match"), [
    ([], "expected 1 inputs, got 0"),
    ([torch.zeros(2, 3), torch.zeros(2, 3)], "expected 1 inputs, got 2"),
    ([torch.zeros(2, 3, dtype=torch.float64)], r"dtype differs: expected float32 \[2, 3\], got float64 \[2, 3\]"),
    ([torch.zeros(6)], r"rank differs .*expected float32 \[2, 3\], got float32 \[6\]"),
    ([torch.zeros(3, 2)], r"shape differs: expected float32 \[2, 3\], got float32 \[3, 2\]"),
    ([3], r"expected a tensor: expected float32 \[2, 3\], got int"),
])
def test_bad_inputs_raise_and_method_stays_usable(rt, inputs, match):
    data, w = add_chain(1)
    method = rt.load_program(data).load_method("forward")
    with pytest.raises(ExecutionError, match=match):
        method.execute(inputs)
    x = torch.randn(2, 3)
    torch.testing.assert_close(method.execute([x])[0], x + w)


def test_inputs_must_be_a_sequence(rt):
    data, _ = add_chain(1)
    method = rt.load_program(data).load_method("forward")
    with pytest.raises(ExecutionError, match="list or tuple"):
        method.execute(torch.zeros(2, 3))


def _custom_op_program() -> bytes:
    b = PlanBuilder()
    x = b.tensor([4])
    out = b.tensor([4])
    b.kernel("etlab_test::twice.out", x, out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


def test_missing_kernel_fails_at_load_naming_the_operator(rt):
    data = _custom_op_program()
    program = rt.load_program(data)
    with pytest.raises(LoadError, match=r"method 'forward', chain 0, instruction 0: no kernel for operator "
                                        r"'etlab_test::twice.out'"):
        program.load_method("forward")


def test_register_kernel_runs_custom_operator(rt):
    data = _custom_op_program()

    @register_kernel("etlab_test::twice.out")
    def twice(x, out, _ret):
        torch.mul(x, 2, out=out)

    try:
        method = rt.load_program(data).load_method("forward")
        x = torch.arange(4.0)
        torch.testing.assert_close(method.execute([x])[0], 2 * x)
        assert "etlab_test::twice.out" in rt.operator_registry.operator_names
    finally:
        unregister_kernel("etlab_test::twice.out")
    assert "etlab_test::twice.out" not in rt.operator_registry.operator_names


def test_register_kernel_rejects_bad_names():
    with pytest.raises(ValueError, match="namespace::name"):
        register_kernel("no_namespace")(lambda *a: None)


def test_kernel_failure_names_the_instruction(rt):
    data = _custom_op_program()

    def broken(x, out, _ret):
        raise ValueError("boom")

    register_kernel("etlab_test::twice.out", broken)
    try:
        method = rt.load_program(data).load_method("forward")
        with pytest.raises(ExecutionError, match=r"chain 0, instruction 0 .*twice.*ValueError: boom"):
            method.execute([torch.zeros(4)])
    finally:
        unregister_kernel("etlab_test::twice.out")


def test_argument_type_mismatch_fails_at_load(rt):
    b = PlanBuilder()
    x = b.tensor([2])
    not_a_tensor = b.int(3)
    out = b.tensor([2])
    b.kernel("aten::add.out", x, not_a_tensor, b.int(1), out, out)
    program = rt.load_program(ProgramBuilder().serialize([b.plan([x], [out])]))
    with pytest.raises(LoadError, match=r"argument 'other' expects Tensor but value \d+ is a Int"):
        program.load_method("forward")


def test_writing_into_constant_data_fails_at_load(rt):
    prog = ProgramBuilder()
    b = PlanBuilder()
    x = b.tensor([2])
    c = b.tensor([2], data=torch.ones(2), program=prog)
    b.kernel("aten::add.out", x, x, b.int(1), c, c)
    program = rt.load_program(prog.serialize([b.plan([x], [c])]))
    with pytest.raises(LoadError, match=r"writes into value \d+, which is constant data"):
        program.load_method("forward")


def test_bad_value_index_fails_at_load(rt):
    b = PlanBuilder()
    x = b.tensor([2])
    b.kernel("aten::relu.out", x, 99, 99)
    program = rt.load_program(ProgramBuilder().serialize([b.plan([x], [x])]))
    with pytest.raises(LoadError, match="refers to value 99"):
        program.load_method("forward")


def test_unknown_method_is_named(rt):
    data, _ = add_chain(1)
    with pytest.raises(LoadError, match=r"no method 'nope' \(methods: \['forward'\]\)"):
        rt.load_program(data).load_method("nope")


def test_metadata(rt):
    data, _ = add_chain(2)
    program = rt.load_program(data)
    meta = program.metadata("forward")
    assert program.method_names == {"forward"}
    assert meta.num_inputs() == 1 and meta.num_outputs() == 1
    info = meta.input_tensor_meta(0)
    assert (info.sizes, info.dtype, info.scalar_type, info.is_memory_planned, info.nbytes) == (
        (2, 3), torch.float32, 6, True, 24)
    assert not info.is_dynamic
    assert program.load_method("forward").metadata == meta
    with pytest.raises(IndexError):
        meta.output_tensor_meta(1)


def test_registries(rt):
    names = rt.operator_registry.operator_names
    for op in ("aten::add.out", "aten::convolution.out", "executorch_prim::et_view.default",
               "dim_order_ops::_to_dim_order_copy.out", "aten::sym_size.int"):
        assert op in names
    assert isinstance(rt.backend_registry.registered_backend_names, list)
    assert Runtime.get() is rt


def test_inputs_that_require_grad_are_read_not_tracked(rt):
    data, w = add_chain(1)
    method = rt.load_program(data).load_method("forward")
    x = torch.randn(2, 3, requires_grad=True)
    (out,) = method.execute([x])
    assert not out.requires_grad
    torch.testing.assert_close(out, x.detach() + w)
