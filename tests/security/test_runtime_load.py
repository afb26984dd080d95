"""Tensor and memory-plan metadata of a .pte is checked at load, before any kernel sees a tensor.

The crafted programs are loaded and run in one fresh interpreter (`load_and_run_isolated`): a
native crash fails the test instead of taking pytest down.
"""

from __future__ import annotations

import pytest
import torch

from etlab.runtime import LoadError, Runtime
from etlab.schema import dtype_to_scalar_type
from etlab.schema import program as P
from tests.runtime._programs import PlanBuilder, ProgramBuilder
from tests.security._craft import load_and_run_isolated

QUANTIZED = [torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4, torch.bits16]
OUT_OF_BOUNDS_VIEWS = {"past_end": ([4, 4], [4, 1], 1), "big_stride": ([2, 2], [100, 1], 0),
                       "too_many": ([17], [1], 0), "huge_offset": ([1], [1], 1 << 40)}


def quantized_constant_program(dtype: torch.dtype) -> bytes:
    """forward(x: uint8[8]) = x + w, where the constant w is declared with a quantized/sub-byte dtype."""
    prog = ProgramBuilder()
    b = PlanBuilder()
    x = b.tensor([8], torch.uint8)
    w = b._add(P.Tensor(scalar_type=dtype_to_scalar_type(dtype), sizes=[8], dim_order=[0],
                        data_buffer_idx=prog.add_constant(torch.arange(8, dtype=torch.uint8)),
                        shape_dynamism=P.TensorShapeDynamism.STATIC))
    out = b.tensor([8], torch.uint8)
    b.kernel("aten::add.out", x, w, b.int(1), out, out)
    return prog.serialize([b.plan([x], [out])])


def strided_copy_program(sizes, strides, offset) -> bytes:
    """forward(x: [4, 4]) = x.as_strided(sizes, strides, offset).clone()."""
    b = PlanBuilder()
    x = b.tensor([4, 4])
    out = b.tensor(sizes)
    b.kernel("aten::as_strided_copy.out", x, b.int_list(sizes), b.int_list(strides), b.int(offset), out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


def two_adds_program(second_offset: int, *, arena: int | None = None) -> bytes:
    """forward(x) = (x + x) + (x + x), the second sum placed at `second_offset` of the arena."""
    b = PlanBuilder()
    x = b.tensor([4])
    a = b.tensor([4])
    c = b.tensor([4])
    b.values[c].val.allocation_info = P.AllocationDetails(memory_id=1, memory_offset_low=second_offset & 0xFFFFFFFF,
                                                          memory_offset_high=second_offset >> 32)
    out = b.tensor([4])
    b.kernel("aten::add.out", x, x, b.int(1), a, a)
    b.kernel("aten::add.out", x, x, b.int(1), c, c)
    b.kernel("aten::add.out", a, c, b.int(1), out, out)
    plan = b.plan([x], [out])
    if arena is not None:
        plan.non_const_buffer_sizes = [0, arena]
    return ProgramBuilder().serialize([plan])


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, str]:
    programs = {f"quantized_{str(d).removeprefix('torch.')}": (quantized_constant_program(d), [([8], "uint8")])
                for d in QUANTIZED}
    for name, args in OUT_OF_BOUNDS_VIEWS.items():
        programs[f"view_{name}"] = (strided_copy_program(*args), [([4, 4], "float32")])
    programs["overlap"] = (two_adds_program(24), [([4], "float32")])  # a: bytes 16..32, c: 24..40, both live
    programs["past_arena"] = (two_adds_program(1 << 40, arena=64), [([4], "float32")])
    return load_and_run_isolated(programs, tmp_path_factory.mktemp("crafted"))


@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_quantized_and_sub_byte_tensors_are_refused(verdicts, dtype):
    verdict = verdicts[f"quantized_{str(dtype).removeprefix('torch.')}"]
    assert verdict.startswith("LoadError") and "quantized, sub-byte or complex" in verdict, verdict


@pytest.mark.parametrize("name", OUT_OF_BOUNDS_VIEWS)
def test_view_past_its_storage_is_refused_at_load(verdicts, name):
    verdict = verdicts[f"view_{name}"]
    assert verdict.startswith("LoadError") and "storage holds 16" in verdict, verdict


def test_overlapping_live_planned_tensors_are_refused(verdicts):
    assert verdicts["overlap"].startswith("LoadError") and "overlap while both are live" in verdicts["overlap"]


def test_planned_offset_past_the_arena_is_refused(verdicts):
    assert verdicts["past_arena"].startswith("LoadError") and "overrun arena 1" in verdicts["past_arena"]


def test_view_inside_its_storage_runs():
    method = Runtime.get().load_program(strided_copy_program([2, 2], [4, 1], 5)).load_method("forward")
    x = torch.arange(16.0).reshape(4, 4)
    torch.testing.assert_close(method.execute([x])[0], x.as_strided([2, 2], [4, 1], 5))


def test_reusing_the_bytes_of_a_dead_tensor_is_allowed():
    """d takes a's bytes once a's last reader (the op writing c) has run: a plan may reuse memory."""
    b = PlanBuilder()
    x = b.tensor([4])
    a, c, d = b.tensor([4]), b.tensor([4]), b.tensor([4])
    b.values[d].val.allocation_info = b.values[a].val.allocation_info
    b.kernel("aten::add.out", x, x, b.int(1), a, a)
    b.kernel("aten::add.out", a, x, b.int(1), c, c)
    b.kernel("aten::add.out", c, x, b.int(1), d, d)
    method = Runtime.get().load_program(ProgramBuilder().serialize([b.plan([x], [d])])).load_method("forward")
    torch.testing.assert_close(method.execute([torch.ones(4)])[0], torch.full((4,), 4.0))


def test_sizes_whose_product_overflows_are_refused():
    b = PlanBuilder()
    x = b.tensor([4])
    huge = b._add(P.Tensor(scalar_type=6, sizes=[2**31 - 1] * 4, dim_order=[0, 1, 2, 3],
                           shape_dynamism=P.TensorShapeDynamism.STATIC))
    b.kernel("aten::add.out", x, x, b.int(1), huge, huge)
    with pytest.raises(LoadError, match="describe more than"):
        Runtime.get().load_program(ProgramBuilder().serialize([b.plan([x], [x])])).load_method("forward")


def test_kernel_cannot_grow_an_unplanned_tensor_to_a_size_the_file_asks_for():
    """Unplanned tensors get memory from the caller or a view; a kernel writing one cannot allocate."""
    from etlab.runtime import ExecutionError

    b = PlanBuilder()
    x = b.tensor([4])
    unplanned = b.tensor([1 << 20], planned=False)
    b.kernel("aten::full.out", b.int_list([1 << 20]), b.double(1.0), unplanned, unplanned)
    method = Runtime.get().load_program(ProgramBuilder().serialize([b.plan([x], [unplanned])])).load_method("forward")
    with pytest.raises(ExecutionError, match="not resizable"):
        method.execute([torch.ones(4)])


def test_arena_larger_than_memory_is_a_load_error():
    b = PlanBuilder()
    x = b.tensor([4])
    out = b.tensor([4])
    b.kernel("aten::add.out", x, x, b.int(1), out, out)
    plan = b.plan([x], [out])
    plan.non_const_buffer_sizes = [0, 1 << 52]
    with pytest.raises(LoadError, match="cannot allocate memory arena 1"):
        Runtime.get().load_program(ProgramBuilder().serialize([plan])).load_method("forward")
