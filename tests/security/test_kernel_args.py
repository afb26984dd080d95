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
from etlab.runtime._kernel_args import RESULT_SIZES, result_shape
from etlab.schema import program as P
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


def pool_program(kind: str, n: int) -> bytes:
    """forward(x: [1, 1, 4, 4]) with a window, output size or scale of `n` (into planned outputs of 4x4 inputs)."""
    b = PlanBuilder()
    x = b.tensor([1, 1, 4, 4])
    out = b.tensor([1, 1, 5, 5] if kind == "max_pool" else [1, 1, 4, 4])
    if kind == "max_pool":  # structured: torch sizes the output before computing
        idx = b.tensor([1, 1, 5, 5], torch.int64)
        b.kernel("aten::max_pool2d_with_indices.out", x, b.int_list([n, n]), b.int_list([1, 1]),
                 b.int_list([n // 2, n // 2]), b.int_list([1, 1]), b.bool(False), out, idx, out, idx)
    elif kind == "adaptive":
        b.kernel("aten::_adaptive_avg_pool2d.out", x, b.int_list([n, n]), out, out)
    else:
        b.kernel("aten::upsample_nearest2d.vec_out", x, b.null(), b._add(P.DoubleList([float(n), float(n)])), out, out)
    return ProgramBuilder().serialize([b.plan([x], [out])])


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
    with pytest.raises(LoadError, match=r"instruction 0 \(aten::convolution.out\).*argument 'out' a "
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
import json, torch
from etlab.runtime import Runtime
try:
    Runtime.get(core={core!r}).load_program({str(path)!r}).load_method("forward").execute([torch.ones(1, 1, 4, 4)])
    verdict = "RAN"
except Exception as e:
    verdict = type(e).__name__
# VmHWM: this image's own peak (ru_maxrss carries the forking test worker's peak across exec)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps([verdict, hwm * 1024]))
""")
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict, peak = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict == "LoadError"
    assert peak < 1 << 30, peak


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("program, pattern", [
    (lambda: repeat_program(1 << 15), r"aten::repeat.out.*\[65536, 65536\] result"),
    (lambda: linear_program(1 << 16), r"aten::linear.out.*\[65536, 65536\] result"),
    (lambda: pool_program("adaptive", 1 << 15), r"aten::_adaptive_avg_pool2d.out.*\[1, 1, 32768, 32768\] result"),
    (lambda: pool_program("upsample", 1 << 12), r"aten::upsample_nearest2d.vec_out.*\[1, 1, 16384, 16384\] result"),
], ids=["repeat", "linear", "adaptive_pool", "upsample"])
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


@pytest.mark.parametrize("core", CORES)
def test_a_huge_pooling_window_costs_nothing(core):
    """max_pool2d_with_indices is structured (its output is sized before any work, and its loops are
    clipped to the input): a 32768-wide window over a 4x4 input runs at once and matches torch."""
    method = Runtime.get(core=core).load_program(pool_program("max_pool", 1 << 15)).load_method("forward")
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    want = torch.nn.functional.max_pool2d(x, 1 << 15, 1, 1 << 14)
    assert torch.equal(method.execute([x])[0], want)


def _calls():
    """(operator, positional arguments, keyword arguments) of ordinary calls: the formulas must agree with torch."""
    x4, w = torch.randn(2, 4, 9, 7), torch.randn(6, 2, 3, 2)
    return [
        ("convolution", [x4, w, None, [2, 1], [1, 3], [2, 1], False, [0, 0], 2], {}),
        ("convolution", [x4, torch.randn(4, 3, 3, 3), None, [2], [1], [1], True, [1], 1], {}),
        ("convolution", [torch.randn(1, 2, 10), torch.randn(4, 2, 3), None, [3], [0], [2], False, [0], 1], {}),
        ("constant_pad_nd", [x4, [1, -2, 3, 0], 0.5], {}),
        ("repeat", [torch.randn(3, 2), [2, 1, 3]], {}),
        ("expand_copy", [torch.randn(3, 1), [2, -1, 5]], {}),
        ("full", [[2, 3], 1.5], {}), ("zeros", [[4]], {}), ("ones", [[0, 3]], {}), ("empty", [[2, 2]], {}),
        ("arange", [7], {}), ("arange", [1.5, 4.0, 0.5], {}), ("arange", [5, 1, -2], {}),
        ("adaptive_avg_pool1d", [torch.randn(2, 3, 8), [5]], {}),
        ("_adaptive_avg_pool2d", [x4, [3, 5]], {}),
        ("_adaptive_avg_pool3d", [torch.randn(1, 2, 4, 4, 4), [2, 3, 1]], {}),
        ("upsample_nearest2d", [x4, None, [1.5, 2.25]], {}), ("upsample_bilinear2d", [x4, [5, 6], False, None], {}),
        ("unfold_copy", [x4, 2, 3, 2], {}), ("unfold_copy", [x4, -1, 7, 1], {}),
        ("grid_sampler_2d", [x4, torch.rand(2, 5, 3, 2) * 2 - 1, 0, 0, False], {}),
        ("embedding", [torch.randn(10, 4), torch.tensor([[1, 2, 3], [4, 5, 6]])], {}),
        ("embedding_dense_backward", [torch.randn(2, 3, 4), torch.tensor([[1, 2, 3], [4, 5, 6]]), 10, -1, False], {}),
        ("_cdist_forward", [torch.randn(2, 5, 3), torch.randn(2, 4, 3), 2.0, None], {}),
        ("_pdist_forward", [torch.randn(6, 3), 2.0], {}),
        ("linear", [torch.randn(2, 3, 4), torch.randn(5, 4), None], {}),
        ("linear", [torch.randn(3, 4), torch.randn(4)], {}),
        ("matmul", [torch.randn(3, 1, 2, 4), torch.randn(5, 4, 6)], {}),
        ("matmul", [torch.randn(4), torch.randn(2, 4, 3)], {}),
        ("matmul", [torch.randn(2, 4), torch.randn(4)], {}), ("matmul", [torch.randn(4), torch.randn(4)], {}),
        ("repeat_interleave", [torch.tensor([1, 2, 3])], {"output_size": 6}),
    ]


def test_the_size_formulas_agree_with_torch():
    seen = set()
    for base, args, kw in _calls():
        seen.add(base)
        want = list(getattr(torch.ops.aten, base)(*args, **kw).shape)  # the overload torch picks for these
        assert result_shape(f"aten::{base}.out", args, kw) == want, (base, args)
    assert seen >= set(RESULT_SIZES), set(RESULT_SIZES) - seen
