"""Kernel arguments that set a call's memory are checked before the call, on both cores.

A 1 KB program asked `aten::convolution.out` for padding 2^14 on a 1x1x4x4 input: torch's out= form
computed the 32772x32772 result (4.3 GB) before failing to fit it into the planned 1x1x4x4 output.
Each crafted program here is refused (at load when its arguments are known then, before the call
when they are computed while running) with an error naming the instruction and the sizes, and the
memory-budget option bounds planned memory plus a call's temporaries.
"""

from __future__ import annotations

import json

import pytest
import torch

from etlab.runtime import ExecutionError, LoadError, Runtime
from tests.runtime._programs import PlanBuilder, ProgramBuilder
from tests.security._craft import run_isolated

CORES = ("native", "python")


def conv_program(padding: int, *, out_shape=(1, 1, 4, 4), x_shape=(1, 1, 4, 4), w_shape=(1, 1, 1, 1)) -> bytes:
    """forward(x) = convolution(x, w, padding=padding) written into a planned output of `out_shape`."""
    prog = ProgramBuilder()
    b = PlanBuilder()
    x = b.tensor(x_shape)
    w = b.tensor(w_shape, data=torch.ones(w_shape), program=prog)
    out = b.tensor(out_shape)
    b.kernel("aten::convolution.out", x, w, b.null(), b.int_list([1, 1]), b.int_list([padding, padding]),
             b.int_list([1, 1]), b.bool(False), b.int_list([0, 0]), b.int(1), out, out)
    return prog.serialize([b.plan([x], [out])])


def repeat_program(times: int) -> bytes:
    """forward(x: [2, 2]) = x.repeat(times, times) into a planned [2, 2] output."""
    b = PlanBuilder()
    x, out = b.tensor([2, 2]), b.tensor([2, 2])
    b.kernel("aten::repeat.out", x, b.int_list([times, times]), out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


def linear_program(n: int) -> bytes:
    """forward(a: [n, 1], w: [n, 1]) = linear(a, w): an n x n result for a planned [1, 1] output."""
    b = PlanBuilder()
    a, w, out = b.tensor([n, 1]), b.tensor([n, 1]), b.tensor([1, 1])
    b.kernel("aten::linear.out", a, w, b.null(), out, out)
    return ProgramBuilder().serialize([b.plan([a, w], [out])])


def run_time_pad_program(width: int) -> bytes:
    """forward(x: [4]) = constant_pad_nd(x, [p, p]) where p = width + 0 is computed while running (a prim
    op writes it), so only the call itself can be checked."""
    b = PlanBuilder()
    x, out = b.tensor([4]), b.tensor([4 + 2 * width if width < 8 else 4])
    p = b.int(0)
    b.kernel("executorch_prim::add.Scalar", b.int(width), b.int(0), p)
    b.kernel("aten::constant_pad_nd.out", x, b.int_list([("v", p), ("v", p)]), b.double(0.0), out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


@pytest.mark.parametrize("core", CORES)
def test_convolution_padding_past_the_planned_output_is_refused_at_load(core):
    with pytest.raises(LoadError, match=r"instruction 0 \(aten::convolution.out\).*argument 'out' a float32 "
                                        r"\[1, 1, 32772, 32772\] result \(4296015936 bytes\), larger than its "
                                        r"planned memory \(64 bytes\)"):
        Runtime.get(core=core).load_program(conv_program(1 << 14)).load_method("forward")


@pytest.mark.parametrize("core", CORES)
def test_the_crafted_convolution_stays_small_in_memory(core, tmp_path):
    """The reported file, loaded in a fresh interpreter: refused, and the process never grew past ~1 GB
    (it reached 4.27 GB before)."""
    path = tmp_path / "conv.pte"
    path.write_bytes(conv_program(1 << 14))
    proc = run_isolated(f"""
import json, resource, torch
from etlab.runtime import Runtime
try:
    Runtime.get(core={core!r}).load_program({str(path)!r}).load_method("forward").execute([torch.ones(1, 1, 4, 4)])
    verdict = "RAN"
except Exception as e:
    verdict = type(e).__name__
print(json.dumps([verdict, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]))
""")
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict, peak = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict == "LoadError"
    assert peak < 1 << 30, peak


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("program, pattern", [
    (lambda: repeat_program(1 << 15), r"aten::repeat.out.*\[65536, 65536\] result"),
    (lambda: linear_program(1 << 16), r"aten::linear.out.*\[65536, 65536\] result"),
], ids=["repeat", "linear"])
def test_other_composites_sized_by_their_arguments_are_refused_at_load(core, program, pattern):
    with pytest.raises(LoadError, match=pattern):
        Runtime.get(core=core).load_program(program()).load_method("forward")


@pytest.mark.parametrize("core", CORES)
def test_arguments_computed_while_running_are_checked_before_the_call(core):
    method = Runtime.get(core=core).load_program(run_time_pad_program(1 << 20)).load_method("forward")
    with pytest.raises(ExecutionError, match=r"instruction 1 \(aten::constant_pad_nd.out.*\[2097156\] result "
                                             r"\(8388624 bytes\), larger than its planned memory \(16 bytes\); "
                                             r"the call was not run"):
        method.execute([torch.ones(4)])
    small = Runtime.get(core=core).load_program(run_time_pad_program(2)).load_method("forward")
    assert torch.equal(small.execute([torch.ones(4)])[0], torch.tensor([0.0, 0, 1, 1, 1, 1, 0, 0]))


@pytest.mark.parametrize("core", CORES)
def test_memory_budget_bounds_planned_memory_and_temporaries(core):
    rt = Runtime.get(core=core)
    # A convolution whose planned output matches its padding: 4.3 GB declared by a small file.
    huge = conv_program(1 << 14, out_shape=(1, 1, 32772, 32772))
    with pytest.raises(LoadError, match=r"planned memory is 429\d+ bytes, over the memory budget of 1073741824"):
        rt.load_program(huge, memory_budget=1 << 30).load_method("forward")
    # An ordinary 3x3 convolution: about 0.5 MB planned, 2.4 MB of temporaries (result + unfolded input).
    conv = conv_program(1, x_shape=(1, 16, 64, 64), w_shape=(16, 16, 3, 3), out_shape=(1, 16, 64, 64))
    with pytest.raises(LoadError, match=r"about 2621440 bytes of temporaries besides the method's 524288 "
                                        r"planned bytes, over the memory budget of 2000000 bytes"):
        rt.load_program(conv, memory_budget=2_000_000).load_method("forward")
    method = rt.load_program(conv, memory_budget=8 << 20).load_method("forward")
    x = torch.randn(1, 16, 64, 64)
    expected = torch.nn.functional.conv2d(x, torch.ones(16, 16, 3, 3), padding=1)
    torch.testing.assert_close(method.execute([x])[0], expected)
    with pytest.raises(ValueError, match="memory_budget must be a non-negative int"):
        rt.load_program(conv, memory_budget=-1)
