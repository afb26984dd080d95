"""The program-facts helpers every layer shares: source lines, op names, module paths, lowered modules."""

from __future__ import annotations

import os

import torch

from etlab.facts.fx import op_name, op_type_of
from etlab.facts.source import module_path, module_stack, source_line, stack_frames, user_frame

TORCH_DIR = os.path.dirname(torch.__file__)


def _trace(*frames: tuple[str, int, str, str]) -> str:
    return "".join(f'  File "{f}", line {n}, in {fn}\n    {code}\n' for f, n, fn, code in frames)


def test_source_line_is_the_users_innermost_frame_not_torchs():
    trace = _trace(("/home/u/model.py", 12, "forward", "x = self.conv(x)"),
                   (f"{TORCH_DIR}/nn/modules/conv.py", 565, "forward", "return self._conv_forward(input)"))
    assert source_line(trace) == "model.py:12 in forward: x = self.conv(x)"
    assert source_line(trace, full_path=True) == "/home/u/model.py:12 in forward: x = self.conv(x)"
    assert [f.lineno for f in stack_frames(trace)] == [12, 565]  # the full stack stays available


def test_source_line_skips_etlab_frames_and_falls_back_to_the_innermost():
    import etlab

    own = os.path.dirname(etlab.__file__)
    trace = _trace(("/u/m.py", 3, "forward", "y = f(x)"), (f"{own}/models/zoo.py", 9, "f", "return x"))
    assert user_frame(trace).filename == "/u/m.py"
    zoo_only = _trace((f"{own}/models/zoo.py", 9, "forward", "x = self.conv(x)"),
                      (f"{TORCH_DIR}/nn/modules/conv.py", 565, "forward", "return f(x)"))
    assert source_line(zoo_only) == "zoo.py:9 in forward: x = self.conv(x)"  # outside torch, though in etlab
    only_torch = _trace((f"{TORCH_DIR}/nn/functional.py", 7, "relu", "return r"))
    assert source_line(only_torch) == "functional.py:7 in relu: return r"
    assert source_line(None) == "" and source_line("no frames") == ""


def test_frames_without_code_lines():
    trace = '  File "/u/a.py", line 1, in f\n  File "/u/b.py", line 2, in g\n'
    assert [(f.filename, f.code) for f in stack_frames(trace)] == [("/u/a.py", ""), ("/u/b.py", "")]
    assert source_line(trace) == "b.py:2 in g"


def test_op_names():
    import operator

    assert op_name(torch.ops.aten.add.Tensor) == "aten.add.Tensor"
    assert op_name(torch.ops.higher_order.cond) == "cond"
    assert op_name(operator.getitem) == "getitem"
    g = torch.fx.Graph()
    x = g.placeholder("x")
    node = g.call_function(torch.ops.aten.convolution.default, (x,))
    assert op_type_of(node) == "aten_convolution_default"


def test_module_paths():
    stack = {"L__self__": ("", torch.nn.Module), "L__self___fc": ("fc", "torch.nn.modules.linear.Linear")}
    assert module_stack(stack) == [("fc", "torch.nn.modules.linear.Linear")]
    assert module_path(stack) == "fc"
    assert module_path(None) == ""


def test_profile_rows_point_at_the_models_line_not_torchs(tmp_path):
    """The source column of the profile rollups names the model's line for a convolution."""
    from etlab.compiler import to_edge
    from etlab.inspector import Inspector, op_timings
    from etlab.models import make_cnn
    from etlab.runtime import Runtime

    model, inputs = make_cnn()
    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.write_to_file(tmp_path / "m.pte")
    program = Runtime.get().load_program(tmp_path / "m.pte", enable_etdump=True)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(tmp_path / "run.etdp")
    timings = op_timings(Inspector(etdump_path=tmp_path / "run.etdp", etrecord=et.get_etrecord()))
    convs = [t for t in timings if any("convolution" in o for o in t.op_types)]
    assert convs and all(t.source.startswith("zoo.py:") for t in convs), [t.source for t in convs]
