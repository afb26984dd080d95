"""The runtime runs only etlab's reviewed kernel set (etlab.ops) plus kernels the user registers."""

from __future__ import annotations

import pytest
import torch

from etlab import ops
from etlab.runtime import LoadError, Runtime, register_kernel, unregister_kernel
from etlab.schema import program as P
from tests.runtime._programs import PlanBuilder, ProgramBuilder


def _string(b: PlanBuilder, text: str) -> int:
    return b._add(P.String(text))


def file_writing_program(victim) -> bytes:
    """forward(x): m = aten::from_file(victim, shared=True, size=16); m.copy_(x): writes x's bytes into victim."""
    b = PlanBuilder()
    x = b.tensor([16], torch.uint8)
    mapped = b.tensor([16], torch.uint8, planned=False)
    b.kernel("aten::from_file", _string(b, str(victim)), b.bool(True), b.int(16), b.int(0), b.null(), b.null(),
             b.null(), mapped)
    b.kernel("aten::copy_", mapped, x, b.bool(False), mapped)
    return ProgramBuilder().serialize([b.plan([x], [x])])


def test_pte_calling_from_file_and_copy_is_refused_at_load_and_writes_nothing(tmp_path):
    victim = tmp_path / "site-packages" / "evil.pth"
    victim.parent.mkdir()
    program = Runtime.get().load_program(file_writing_program(victim))
    with pytest.raises(LoadError, match=r"no kernel for operator 'aten::from_file'.*not in etlab's kernel set.*"
                                        r"register_kernel\('aten::from_file'"):
        program.load_method("forward")
    assert not victim.exists()
    assert list(tmp_path.rglob("*")) == [victim.parent]


@pytest.mark.parametrize("name", [
    "aten::from_file", "aten::rand.out", "aten::randn.out", "aten::native_dropout.out", "aten::bernoulli.out",
    "aten::set_.source_Tensor", "aten::resize_", "aten::_reshape_alias", "aten::as_strided_", "aten::normal.out",
    "aten::_local_scalar_dense.out", "aten::add.Tensor", "aten::add_.Tensor", "aten::_sparse_coo_tensor_unsafe",
    "aten::empty_strided.out", "aten::_fft_r2c.out",
])
def test_effectful_or_unchecked_operators_have_no_kernel(name):
    assert not ops.allows_torch_kernel(name)
    assert name not in Runtime.get().operator_registry.operator_names


def test_every_allowlisted_torch_kernel_is_an_out_variant_or_reviewed_in_place_and_not_random():
    names = ops.runtime_torch_op_names()
    assert {"aten::add.out", "aten::convolution.out", "aten::copy_", "aten::index_put_"} <= names
    for name in names:
        _ns, base, overload = ops.split_name(name)
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        assert torch.Tag.nondeterministic_seeded not in op.tags, name
        assert ops.is_out_variant(op._schema) or base in ops.ATEN_IN_PLACE, name


def test_registered_kernel_opts_an_operator_in(tmp_path):
    """register_kernel is the documented way to run an operator outside the kernel set."""
    b = PlanBuilder()
    x = b.tensor([4])
    out = b.tensor([4])
    b.kernel("aten::rand_like.out", x, b.null(), out, out)
    data = ProgramBuilder().serialize([b.plan([x], [out])])
    with pytest.raises(LoadError, match=r"aten::rand_like\.out"):
        Runtime.get().load_program(data).load_method("forward")
    register_kernel("aten::rand_like.out", lambda x, fmt, out, _ret: out.fill_(0.5))
    try:
        method = Runtime.get().load_program(data).load_method("forward")
        assert torch.equal(method.execute([torch.ones(4)])[0], torch.full((4,), 0.5))
    finally:
        unregister_kernel("aten::rand_like.out")


def test_runtime_builtin_kernels_are_all_on_the_allowlist():
    """One source of truth: etlab's own kernels are listed in etlab.ops too."""
    from etlab.runtime._prim_kernels import BUILTIN_KERNELS

    assert BUILTIN_KERNELS and all(ops.allows_runtime(name) for name in BUILTIN_KERNELS)


def test_compiler_dtype_check_reads_the_allowlist():
    assert "not supported" in ops.dtype_problem("add", torch.complex64)
    assert "floating point only" in ops.dtype_problem("convolution", torch.int32)
    assert ops.dtype_problem("add", torch.int32) is None
