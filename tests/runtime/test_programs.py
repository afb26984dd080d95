"""Instruction kinds and value kinds on hand-built programs: control flow, mutable buffers, dynamic
shapes with symbolic sizes, external data, unplanned inputs and FreeCall, dim orders."""

from __future__ import annotations

import pytest
import torch

from etlab.runtime import ExecutionError, LoadError, Runtime
from etlab.schema import flat_tensor as F
from etlab.schema import serialize_ptd
from tests.runtime._programs import (
    PlanBuilder,
    ProgramBuilder,
    accumulator_program,
    branch_program,
    dynamic_view_program,
)


@pytest.fixture(scope="module")
def rt():
    return Runtime.get()


def test_jump_and_move_follow_the_condition(rt):
    method = rt.load_program(branch_program()).load_method("forward")
    x = torch.tensor([1.0, 2.0, 3.0])
    for _ in range(2):  # both branches, twice: moves re-point the output each run
        torch.testing.assert_close(method.execute([x, torch.tensor(True)])[0], x + x)
        torch.testing.assert_close(method.execute([x, torch.tensor(False)])[0], x * x)


def test_jump_destination_outside_the_chain_fails_at_load(rt):
    b = PlanBuilder()
    x = b.tensor([1])
    b.jump_false(b.bool(False), 5)
    program = rt.load_program(ProgramBuilder().serialize([b.plan([x], [x])]))
    with pytest.raises(LoadError, match="jump destination 5 is outside the chain"):
        program.load_method("forward")


@pytest.mark.parametrize("initial", [None, torch.tensor([10.0, 20.0, 30.0])])
def test_mutable_buffers_persist_across_calls_per_method(rt, initial):
    program = rt.load_program(accumulator_program(initial))
    m1, m2 = program.load_method("forward"), program.load_method("forward")
    start = torch.zeros(3) if initial is None else initial
    x = torch.tensor([1.0, 2.0, 3.0])
    for k in range(1, 4):
        torch.testing.assert_close(m1.execute([x])[0], start + k * x)
    torch.testing.assert_close(m2.execute([x])[0], start + x)  # a second Method has its own state


def test_dynamic_shapes_within_bounds_resize_and_beyond_fail(rt):
    method = rt.load_program(dynamic_view_program()).load_method("forward")
    assert method.metadata.input_tensor_meta(0).is_dynamic
    for rows in (2, 8, 5, 1):
        x = torch.randn(rows, 4)
        (out,) = method.execute([x])
        torch.testing.assert_close(out, torch.relu(x.reshape(-1)))
    with pytest.raises(ExecutionError, match=r"dimension 0 exceeds its upper bound 8: expected float32 <=\[8, 4\]"):
        method.execute([torch.randn(9, 4)])
    torch.testing.assert_close(method.execute([torch.ones(3, 4)])[0], torch.ones(12))


def test_kernel_growing_a_planned_tensor_past_its_size_fails(rt):
    """A (malformed) plan whose kernel output needs more memory than planned: error, no overwrite."""
    b = PlanBuilder()
    x = b.tensor([4])
    out = b.tensor([2])
    b.kernel("aten::relu.out", x, out, out)
    method = rt.load_program(ProgramBuilder().serialize([b.plan([x], [out])])).load_method("forward")
    with pytest.raises(ExecutionError, match="not resizable"):
        method.execute([torch.ones(4)])


def test_external_tensors_come_from_ptd_files(rt, tmp_path):
    w = torch.tensor([1.0, -2.0, 3.0])
    b = PlanBuilder()
    x = b.tensor([3])
    wv = b.tensor([3], external="layer.weight")
    out = b.tensor([3])
    b.kernel("aten::mul.out", x, wv, out, out)
    pte = ProgramBuilder().serialize([b.plan([x], [out])])
    ptd = serialize_ptd(F.FlatTensor(named_data=[F.NamedData("layer.weight", 0, F.TensorLayout(6, [3], [0]))]),
                        [w.numpy().tobytes()])
    (tmp_path / "w.ptd").write_bytes(ptd)
    with pytest.raises(LoadError, match=r"external tensor 'layer\.weight' is in none of the data files"):
        rt.load_program(pte).load_method("forward")
    for kwargs in ({"data_files": [tmp_path / "w.ptd"]}, {"data_path": str(tmp_path / "w.ptd")}, {"data_files": [ptd]}):
        method = rt.load_program(pte, **kwargs).load_method("forward")
        torch.testing.assert_close(method.execute([torch.ones(3)])[0], w)


def test_unplanned_input_aliases_caller_memory_and_free_call(rt):
    prog = ProgramBuilder()
    b = PlanBuilder()
    x = b.tensor([2, 2], planned=False)
    w = b.tensor([2, 2], data=torch.full((2, 2), 2.0), program=prog)
    out = b.tensor([2, 2])
    b.kernel("aten::mul.out", x, w, out, out)
    b.free(x)
    method = rt.load_program(prog.serialize([b.plan([x], [out])])).load_method("forward")
    assert not method.metadata.input_tensor_meta(0).is_memory_planned
    base = torch.arange(8.0).reshape(2, 4)
    strided = base[:, ::2]  # not contiguous: the runtime lays it out as the plan expects
    for x_in in (torch.ones(2, 2), strided):
        torch.testing.assert_close(method.execute([x_in])[0], 2 * x_in)


def test_channels_last_planned_tensors(rt):
    """dim_order [0, 2, 3, 1] tensors get channels-last strides; kernels write through them."""
    b = PlanBuilder()
    x = b.tensor([1, 3, 4, 4])
    y = b.tensor([1, 3, 4, 4], dim_order=[0, 2, 3, 1])
    b.kernel("dim_order_ops::_to_dim_order_copy.out", x, b.bool(False), b.int_list([0, 2, 3, 1]), y, y)
    out = b.tensor([1, 3, 4, 4])
    b.kernel("aten::relu.out", y, out, out)
    method = rt.load_program(ProgramBuilder().serialize([b.plan([x], [out])])).load_method("forward")
    assert method._table.values[y].is_contiguous(memory_format=torch.channels_last)
    x_in = torch.randn(1, 3, 4, 4)
    torch.testing.assert_close(method.execute([x_in])[0], torch.relu(x_in))


def test_scalar_inputs_and_outputs(rt):
    """Int inputs flow into kernels at run time; an Int output is returned as a Python int."""
    b = PlanBuilder()
    x = b.tensor([4])
    k = b.int(0)
    out = b.tensor([4])
    b.kernel("aten::mul.Scalar_out", x, k, out, out)
    n = b.int(0)
    b.kernel("executorch_prim::add.Scalar", k, b.int(1), n)
    method = rt.load_program(ProgramBuilder().serialize([b.plan([x, k], [out, n])])).load_method("forward")
    assert method.metadata.inputs[1].kind == "Int"
    for factor in (3, -2):
        res, plus_one = method.execute([torch.arange(4.0), factor])
        torch.testing.assert_close(res, torch.arange(4.0) * factor)
        assert plus_one == factor + 1
    with pytest.raises(ExecutionError, match="input 1: expected Int"):
        method.execute([torch.arange(4.0), 1.5])


def test_quantized_decomposed_out_variants(rt):
    b = PlanBuilder()
    x = b.tensor([5])
    q = b.tensor([5], torch.int8)
    dq = b.tensor([5])
    qparams = [b.double(0.05), b.int(3), b.int(-128), b.int(127), b.int(1)]  # dtype 1: int8 (ScalarType.CHAR)
    b.kernel("quantized_decomposed::quantize_per_tensor.out", x, *qparams, q, q)
    b.kernel("quantized_decomposed::dequantize_per_tensor.out", q, *qparams, b.null(), dq, dq)
    method = rt.load_program(ProgramBuilder().serialize([b.plan([x], [q, dq])])).load_method("forward")
    x_in = torch.tensor([-1.0, -0.26, 0.0, 0.31, 9.0])
    q_out, dq_out = method.execute([x_in])
    expected_q = torch.clamp(torch.round(x_in / 0.05) + 3, -128, 127).to(torch.int8)
    torch.testing.assert_close(q_out, expected_q)
    torch.testing.assert_close(dq_out, (expected_q.float() - 3) * 0.05)


@pytest.mark.parametrize(("op", "args", "expected"), [
    ("add", (7, 3), 10), ("sub", (7, 3), 4), ("mul", (7, 3), 21), ("floordiv", (-7, 2), -4), ("truediv", (7, 2), 3.5),
    ("mod", (-7, 3), 2), ("eq", (3, 3), True), ("gt", (3, 4), False), ("lt", (3, 4), True), ("ge", (4, 4), True),
    ("le", (5, 4), False), ("neg", (5,), -5), ("sym_max", (2, 9), 9), ("sym_min", (2, 9), 2),
    ("sym_float", (3,), 3.0), ("sym_int", (3.7,), 3), ("ceil", (2.1,), 3), ("round", (2.5,), 2),
    ("trunc", (-2.7,), -2), ("sym_not", (True,), False), ("sym_ite", (False, 1, 2), 2),
])
def test_executorch_prim_scalar_operators(rt, op, args, expected):
    """Each operator computes on values known only at run time (method inputs) into a result slot."""
    b = PlanBuilder()
    kinds = {bool: b.bool, int: b.int, float: b.double}
    ins = [kinds[type(a)](type(a)()) for a in args]
    result = b.int(0)
    b.kernel(f"executorch_prim::{op}.Scalar", *ins, result)
    method = rt.load_program(ProgramBuilder().serialize([b.plan(ins, [result])])).load_method("forward")
    (got,) = method.execute(list(args))
    assert got == expected and type(got) is type(expected)


def test_convolution_and_batch_norm_match_torch_bit_for_bit(rt):
    """The direct-write bindings of convolution.out and batch norm give torch's own results,
    whichever convolution backend torch picks for the current thread count."""
    g = torch.Generator().manual_seed(0)
    weight, mean, var = torch.randn(16, 8, 1, 1, generator=g), torch.randn(16, generator=g), torch.rand(16) + 0.5
    gamma, beta = torch.randn(16, generator=g), torch.randn(16, generator=g)
    prog = ProgramBuilder()
    b = PlanBuilder()
    x = b.tensor([1, 8, 12, 12])
    consts = [b.tensor(t.shape, data=t, program=prog) for t in (weight, gamma, beta, mean, var)]
    conv = b.tensor([1, 16, 12, 12])
    ones, zeros = b.int_list([1, 1]), b.int_list([0, 0])
    b.kernel("aten::convolution.out", x, consts[0], b.null(), ones, zeros, ones, b.bool(False), zeros, b.int(1),
             conv, conv)
    out, save_mean, save_invstd = b.tensor([1, 16, 12, 12]), b.tensor([0]), b.tensor([0])
    b.kernel("aten::_native_batch_norm_legit_no_training.out", conv, consts[1], consts[2], consts[3], consts[4],
             b.double(0.1), b.double(1e-5), out, save_mean, save_invstd, b.tensor_list([out, save_mean, save_invstd]))
    method = rt.load_program(prog.serialize([b.plan([x], [conv, out])])).load_method("forward")
    x_in = torch.randn(1, 8, 12, 12, generator=g)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got_conv, got = method.execute([x_in])
            want_conv = torch.nn.functional.conv2d(x_in, weight)
            assert torch.equal(got_conv, want_conv)
            assert torch.equal(got, torch.nn.functional.batch_norm(want_conv, mean, var, gamma, beta, eps=1e-5))
    finally:
        torch.set_num_threads(threads)


def test_empty_dim_order_and_in_place_operator(rt):
    b = PlanBuilder()
    x = b.tensor([2, 3])
    buf = b.tensor([2, 3])
    b.kernel("dim_order_ops::_empty_dim_order.out", b.int_list([2, 3]), b.int_list([0, 1]), buf, buf)
    b.kernel("aten::fill_.Scalar", buf, b.double(1.5), buf)
    out = b.tensor([2, 3])
    b.kernel("aten::add.out", x, buf, b.int(1), out, out)
    method = rt.load_program(ProgramBuilder().serialize([b.plan([x], [out])])).load_method("forward")
    torch.testing.assert_close(method.execute([torch.ones(2, 3)])[0], torch.full((2, 3), 2.5))
