"""profile(): export -> compile with ETRecord -> run with ETDump + intermediates -> Inspector."""

from __future__ import annotations

import pytest
import torch

from etlab.compiler.backends import DemoPartitioner
from etlab.devtools import profile
from etlab.models import make_mlp


def _execute_block(inspector):
    (block,) = [b for b in inspector.event_blocks if b.name == "Execute"]
    return block


def test_profile_and_debug_in_one_call(tmp_path):
    module, inputs = make_mlp()
    ins = profile(module, inputs, iterations=3, workdir=tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.etrecord", "model.pte", "run.bin", "run.etdp"]
    block = _execute_block(ins)
    assert block.num_runs == 3
    addmms = [e for e in block.events if e.name == "native_call_addmm.out"]
    assert len(addmms) == 3 and all(len(e.perf_data.raw) == 3 for e in addmms)
    # The ETRecord join names the graph ops and where in the model they came from.
    assert all("aten.addmm.default" in e.op_types for e in addmms)
    assert any("fc1" in str(e.module_hierarchy) for e in addmms)
    # Intermediates were recorded, and they match the eager graph (fp32, same kernels).
    assert all(isinstance(e.debug_data[0], torch.Tensor) for e in addmms)
    gap = ins.calculate_numeric_gap("MSE")
    assert len(gap) == 5 and all(max(g) < 1e-10 for g in gap["gap"])
    with torch.no_grad():
        assert torch.allclose(block.run_output[0], module(*inputs))


def test_profile_delegated_without_intermediates(tmp_path):
    module, inputs = make_mlp()
    ins = profile(module, inputs, iterations=2, debug=False, partitioner=[DemoPartitioner()], workdir=tmp_path,
                  progress=False)
    assert not (tmp_path / "run.bin").exists()
    calls = [e for e in _execute_block(ins).events if e.name == "DELEGATE_CALL"]
    assert len(calls) == 3 and {e.delegate_backend_name for e in calls} == {"DemoBackend"}
    assert all(e.debug_data == [] for e in _execute_block(ins).events)


def test_profile_argument_errors():
    module, inputs = make_mlp()
    with pytest.raises(ValueError, match="iterations must be a positive int"):
        profile(module, inputs, iterations=0)
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module or an ExportedProgram"):
        profile("model", inputs)
    with pytest.raises(TypeError, match="inputs must be a tuple or list"):
        profile(module, "x")
