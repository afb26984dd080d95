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


def test_profile_joins_the_record_in_memory_as_the_saved_file_reads(tmp_path, monkeypatch):
    """profile() hands the Inspector the ETRecord it built (nothing parsed back), and that join is the
    one a later session gets from the saved model.etrecord."""
    import etlab.etrecord
    from etlab.inspector import Inspector

    module, inputs = make_mlp()

    def parsed(*a, **k):
        raise AssertionError("profile() parsed the ETRecord back")

    with monkeypatch.context() as m:
        m.setattr(etlab.etrecord, "read_program_info", parsed)
        m.setattr(etlab.etrecord, "parse_etrecord", parsed)
        ins = profile(module, inputs, iterations=2, workdir=tmp_path, progress=False)
        live = ins.to_dataframe()
        live_gap = ins.calculate_numeric_gap("MSE")
    later = Inspector(etdump_path=tmp_path / "run.etdp", etrecord=str(tmp_path / "model.etrecord"),
                      debug_buffer_path=tmp_path / "run.bin")
    cols = ["event_block_name", "event_name", "op_types", "stack_traces", "module_hierarchy", "is_delegated_op"]
    assert live[cols].astype(str).equals(later.to_dataframe()[cols].astype(str))
    assert any("addmm" in str(t) for t in live["op_types"])  # the join happened
    saved_gap = later.calculate_numeric_gap("MSE")
    assert len(live_gap) == len(saved_gap) == 5
    assert [str(x) for x in live_gap["aot_ops"]] == [str(x) for x in saved_gap["aot_ops"]]
    assert all(abs(a - b) < 1e-12 for x, y in zip(live_gap["gap"], saved_gap["gap"]) for a, b in zip(x, y))
