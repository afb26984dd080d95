"""Bad input gives a CompileError naming the op and the user's source line."""

from __future__ import annotations

import pytest
import torch

from etlab.compiler import CompileError, ExecutorchBackendConfig, MemoryPlanningPass, to_edge


def _compile(module, inputs, dynamic_shapes=None):
    ep = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    return to_edge(ep).to_executorch()


class _Zeta(torch.nn.Module):
    def forward(self, x):
        return torch.special.zeta(x, x)  # not core ATen, no core decomposition


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        n = x.sum().int().item()
        torch._check(n >= 0)
        return torch.ones(n) * 2  # size known only at run time, with no upper bound


class _SizeOutput(torch.nn.Module):
    def forward(self, x):
        return x + 1, x.shape[0]


class _Complex(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.complex64) * 2


def test_unsupported_op_names_op_and_source_line():
    with pytest.raises(CompileError) as info:
        _compile(_Zeta(), (torch.rand(3) + 2,))
    err = info.value
    assert err.op == "aten.special_zeta.default"
    assert "core ATen" in err.reason
    assert err.source and "test_compiler_errors.py" in err.source and "torch.special.zeta(x, x)" in err.source
    assert isinstance(err, ValueError)


def test_unbounded_data_dependent_shape_names_op_and_source_line():
    with pytest.raises(CompileError) as info:
        _compile(_DataDependent(), (torch.ones(3),))
    assert info.value.op == "aten.full.default"
    assert "no upper bound" in info.value.reason
    assert "torch.ones(n) * 2" in info.value.source


def test_bounded_data_dependent_shape_is_planned_at_its_bound():
    class NonZero(torch.nn.Module):
        def forward(self, x):
            return x.nonzero().float() + 1

    et = _compile(NonZero(), (torch.randn(8),))
    plan = et.executorch_program.execution_plan[0]
    out = plan.values[plan.outputs[0]].val
    assert out.sizes == [8, 1] and out.shape_dynamism.name == "DYNAMIC_BOUND"


def test_non_tensor_output_is_rejected():
    with pytest.raises(CompileError, match="output 1 is a SymInt value; only tensors can be returned"):
        _compile(_SizeOutput(), (torch.randn(4, 2),), {"x": {0: torch.export.Dim("b", max=8)}})


def test_unsupported_dtype_names_op_and_dtype():
    with pytest.raises(CompileError) as info:
        _compile(_Complex(), (torch.randn(3),))
    assert "complex64" in info.value.reason
    assert "x.to(torch.complex64)" in info.value.source


def test_bad_memory_planning_options_are_rejected():
    with pytest.raises(ValueError, match="memory_planning_algo"):
        MemoryPlanningPass(memory_planning_algo="best")
    with pytest.raises(ValueError, match="power of two"):
        ExecutorchBackendConfig(segment_alignment=1000)


def test_get_etrecord_needs_generate_etrecord():
    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    et = to_edge(ep).to_executorch()
    with pytest.raises(CompileError, match="generate_etrecord=True"):
        et.get_etrecord()
    et = to_edge(ep, generate_etrecord=True).to_executorch()
    sources = et.etrecord_sources()
    assert sources.exported_program["forward"] is ep
    assert sources.debug_handle_map["forward"]
    assert type(et.get_etrecord()).__name__ == "ETRecord"  # upstream's get_etrecord().save(path) works
