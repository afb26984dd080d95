"""Issue 5's proof, end to end with no shortcuts: export -> compile with an ETRecord file -> run on
our runtime with ETDump and every intermediate -> Inspector from the files on disk."""

from __future__ import annotations

import pytest
import torch

from etlab.compiler import to_edge
from etlab.inspector import Inspector
from etlab.models import make_cnn, make_mlp
from etlab.runtime import Runtime, register_kernel, unregister_kernel

pytestmark = pytest.mark.xdist_group("end_to_end")


def compile_run_inspect(tmp_path, model, inputs, runs: int = 3) -> Inspector:
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.write_to_file(tmp_path / "model.pte")
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(tmp_path / "model.etrecord")
    program = Runtime.get().load_program(tmp_path / "model.pte", enable_etdump=True, debug_buffer_size=8 << 20)
    method = program.load_method("forward")
    for _ in range(runs):
        method.execute(list(inputs))
    program.write_etdump_result_to_file(tmp_path / "run.etdp", tmp_path / "run.bin")
    return Inspector(etdump_path=tmp_path / "run.etdp", etrecord=tmp_path / "model.etrecord",
                     debug_buffer_path=tmp_path / "run.bin")


def test_rows_name_ops_modules_and_source_lines(tmp_path):
    ins = compile_run_inspect(tmp_path, *make_cnn())
    df = ins.to_dataframe()
    convs = df[df.event_name == "native_call_convolution.out"]
    assert len(convs) > 0 and all(ops == ["aten.convolution.default"] for ops in convs.op_types)
    # every conv knows the nn.Module it came from and the user's source line
    paths = [path for h in convs.module_hierarchy for stack in h.values() for path, _type in stack.values()]
    assert "features.0.0" in paths
    assert all(any("conv.py" in t for t in st.values()) for st in convs.stack_traces)
    residual = df[df.op_types.apply(lambda ops: ops == ["aten.add.Tensor"])]
    assert any("zoo.py" in t and "use_residual" in t for st in residual.stack_traces for t in st.values())
    # find_total_for_module adds up the module's events (OPERATOR_CALL excluded)
    in_block = df[df.event_name != "OPERATOR_CALL"]
    expected = sum(avg for avg, h in zip(in_block["avg (ms)"], in_block.module_hierarchy)
                   if any(path == "features.1" or path.startswith("features.1.")
                          for stack in h.values() for path, _type in stack.values()))
    assert expected > 0 and ins.find_total_for_module("features.1") == pytest.approx(expected)


def test_numeric_gap_is_zero_in_fp32_and_points_at_a_perturbed_kernel(tmp_path):
    model, inputs = make_mlp()
    clean = compile_run_inspect(tmp_path / "clean", model, inputs)
    gap = clean.calculate_numeric_gap("MSE")
    assert len(gap) >= 5 and max(g for gaps in gap["gap"] for g in gaps) < 1e-12

    def off_by_a_bit(x, out, *_ret):  # a relu kernel with a bug
        torch.clamp(x, min=0, out=out)
        out.add_(0.25)

    register_kernel("aten::relu.out", off_by_a_bit)
    try:
        broken = compile_run_inspect(tmp_path / "broken", model, inputs)
    finally:
        unregister_kernel("aten::relu.out")
    gap = broken.calculate_numeric_gap("MSE")
    worst = max(range(len(gap)), key=lambda i: max(gap["gap"].iloc[i]))
    assert max(gap["gap"].iloc[worst]) > 1e-3
    assert gap["runtime_ops"].iloc[worst] == ["native_call_relu.out"]  # the first relu: where it goes wrong
    first_bad = next(i for i in range(len(gap)) if max(gap["gap"].iloc[i]) > 1e-6)
    assert gap["aot_ops"].iloc[first_bad] == ["relu"]
