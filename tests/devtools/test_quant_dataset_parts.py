"""The shortcuts the report over a dataset takes to be fast, each against the straightforward computation it
replaces: fake-quantization against the decomposed quantize/dequantize ops, a folded conv + batch norm against
the two ops, a layer's local reference taken from the converted graph against the re-run, the heap kept
between ops (no page faults for a block allocated again), convolutions on oneDNN against aten.conv2d, the
statistics of a few inputs at a time against one input's, and the garbage collector's frozen objects."""

from __future__ import annotations

import gc
import math
import resource
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("torchao")

from etlab.compiler import EtlabQuantizer
from etlab.devtools._quant_dataset_engine import Engine
from etlab.devtools._quant_dataset_fold import CONV2D, conv2d, conv_bn_pair, fold, folded_conv
from etlab.devtools._quant_dataset_plan import make_plan
from etlab.devtools._quant_dataset_run import Constants, fake_quantize, gc_frozen, heap_kept
from etlab.devtools._quant_dataset_stats import GROUP, Scratch, batch_metrics, raw_ranges
from etlab.devtools._quant_debug import float_graph_of
from etlab.devtools._quant_debug_fix import quantize_pt2e
from etlab.models import make_cnn


def _decomposed(x: torch.Tensor, scale: float, zp: int, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
    from torchao.quantization.pt2e import _affine_quantization  # noqa: F401  (registers quantized_decomposed)

    q = torch.ops.quantized_decomposed
    return q.dequantize_per_tensor(q.quantize_per_tensor(x, scale, zp, lo, hi, dtype), scale, zp, lo, hi, dtype)


@pytest.mark.parametrize("scale,zp,lo,hi,dtype", [
    (0.02, 0, -128, 127, torch.int8), (0.0371, -17, -128, 127, torch.int8), (0.05, 128, 0, 255, torch.uint8),
    (1e-3, 3, -128, 127, torch.int8)])
def test_fake_quantize_is_the_decomposed_ops_bit_for_bit(scale, zp, lo, hi, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(70000, generator=gen) * 3, (torch.arange(-300, 300) + 0.5) * scale,  # ties
                   torch.tensor([0.0, -0.0, 1e30, -1e30, 3e7, -3e7]), torch.randn(1000, generator=gen) * 1e9])
    assert torch.equal(fake_quantize(x, scale, zp, lo, hi), _decomposed(x, scale, zp, lo, hi, dtype))
    image = x[: 2 * 3 * 40 * 40].reshape(2, 3, 40, 40).contiguous(memory_format=torch.channels_last)
    got = fake_quantize(image, scale, zp, lo, hi)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, _decomposed(image, scale, zp, lo, hi, dtype))


class _ConvBN(torch.nn.Module):
    def __init__(self, groups: int, bias: bool):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=groups, bias=bias)
        self.bn = torch.nn.BatchNorm2d(8)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(8, generator=gen))
            self.bn.running_var.copy_(torch.rand(8, generator=gen) * 4 + 0.01)
            self.bn.weight.copy_(torch.randn(8, generator=gen))
            self.bn.bias.copy_(torch.randn(8, generator=gen))

    def forward(self, x):
        return self.bn(self.conv(x))


@pytest.mark.parametrize("groups,bias", [(1, False), (8, True)])
def test_folded_conv_bn_equals_the_two_ops_to_float_rounding(groups, bias):
    model = _ConvBN(groups, bias).eval()
    x = torch.randn(3, 8, 16, 16)
    gm = float_graph_of(model, (x[:1],))
    conv = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    bn = next(iter(conv.users))
    assert conv_bn_pair(conv, bn) and not conv_bn_pair(bn, conv)
    params = fold(conv, bn, lambda a: gm.get_parameter(a.target) if a.target in dict(gm.named_parameters())
                  else gm.get_buffer(a.target))
    assert params is not None
    with torch.no_grad():
        want = model(x)
    got = folded_conv(conv, x, *params)
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 1e-5 * scale
    # what that rounding does to an SQNR against a quantization-sized error: nothing visible
    quantized = want + 1e-2 * scale * torch.randn_like(want)
    sqnr = [float(10 * torch.log10(r.double().pow(2).sum() / (r.double() - quantized).pow(2).sum()))
            for r in (want, got)]
    assert abs(sqnr[0] - sqnr[1]) < 1e-3


@pytest.fixture(scope="module")
def cnn():
    model, inputs = make_cnn()
    float_gm = float_graph_of(model, inputs)
    data = [(torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    return float_gm, quantize_pt2e(float_gm, EtlabQuantizer(), data), data


def test_local_reference_from_the_converted_graph_is_the_rerun_exactly(cnn):
    """A ReLU6 or an add computes, in the converted graph, exactly its float op on the quantized inputs: the
    report reads that value instead of re-running the op, and the local SQNR is the re-run's, bit for bit.
    Convolutions (float weights against quantized ones) are still re-run."""
    float_gm, quantized, data = cnn
    plan = make_plan(float_gm, quantized)
    layer_tasks = [t for t in plan.tasks if hasattr(t, "join")]
    computed = [t for t in layer_tasks if t.computed]
    ops = {str(t.join.chain[0].target) for t in computed}
    assert computed and ops <= {"aten.hardtanh.default", "aten.add.Tensor", "aten.mean.dim", "aten.dropout.default",
                                "aten.relu.default", "aten.adaptive_avg_pool2d.default"}, ops
    assert not any(t.computed for t in layer_tasks if "conv" in str(t.join.chain[0].target))
    fast = Engine(float_gm, quantized, plan).run(data)[0]
    for t in computed:
        t.computed = None
    slow = Engine(float_gm, quantized, plan).run(data)[0]
    names = [j.chain[0].name for j in make_plan(float_gm, quantized).joins]
    checked = {t.join.chain[0].name for t in computed}
    for name, a, b in zip(names, fast, slow):
        if name in checked:
            checked.discard(name)
            np.testing.assert_array_equal(a.local["sqnr"], b.local["sqnr"], err_msg=name)
    assert not checked


def test_converted_graph_runs_as_torch_on_one_input_and_on_onednn_on_a_batch(cnn):
    """One input: the converted graph's outputs are torch's own run of it, bit for bit (the single-input
    report's values). A batch: its convolutions on oneDNN, each input's outputs torch's to float rounding, which
    moves an output element across a quantization step here and there (at most one step of its quantizer)."""
    float_gm, quantized, data = cnn
    engine = Engine(float_gm, quantized, make_plan(float_gm, quantized))
    with torch.no_grad():
        want = [torch.utils._pytree.tree_leaves(quantized(*x)) for x in data]
    one = engine.run(data[:1])[3]
    assert not engine.qs.onednn
    assert len(one) == len(want[0]) and all(torch.equal(a, b) for a, b in zip(one, want[0]))
    batch = engine.run(data)[3]
    assert engine.qs.onednn
    outputs = [a for a in quantized.graph.find_nodes(op="output")[0].args[0]]
    assert all("dequantize_per_tensor" in str(a.target) for a in outputs)
    steps = [float(a.args[1]) for a in outputs]
    for i, x in enumerate(want):
        for a, b, step in zip(batch, x, steps):
            d = (a[i:i + 1] - b).abs()
            assert float(d.max()) <= step * 1.001 and int((d > 1e-6 * step).sum()) <= max(1, b.numel() // 10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_heap_kept_serves_blocks_again_without_page_faults():
    """A 48 MB block is above anything glibc serves from its heap by default: it is mapped afresh and faulted in
    page by page every time. While heap_kept lasts, it is served from the memory a freed 64 MB block left."""
    def faults_of(mb: int) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x = torch.empty(mb << 18)
        x.fill_(1.0)
        del x
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    with heap_kept() as applied:
        if not applied:
            pytest.skip("not glibc")
        faults_of(64)
        kept = faults_of(48)
    faults_of(64)
    default = faults_of(48)
    assert kept < 1000 < 10000 < default, (kept, default)


_WORKER_ROUNDS = """
import resource, sys
from concurrent.futures import ThreadPoolExecutor
import torch
import etlab.devtools._quant_dataset_run as run
if sys.argv[1] == "unpadded":
    run._PAD = run._TOP_PAD_DEFAULT

def block(mb):
    x = torch.empty(mb << 18)
    x.fill_(1.0)
    return x

def rounds():  # layers' outputs of a few sizes, freed out of order
    counts = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        a, b = block(30), block(30)
        del a
        c = block(30)
        del b
        d = block(12)
        del c, d
        counts.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    return counts

with run.heap_kept() as applied, ThreadPoolExecutor(1) as pool:
    print(sum(pool.submit(rounds).result()[-4:]) if applied else -1)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_heap_kept_serves_a_worker_threads_blocks_again_without_page_faults():
    """A thread allocates from its own arena, 64 MB heaps that glibc unmaps as soon as one is empty: blocks of
    tens of MB (a batch's activations), each with a heap to itself, are faulted in afresh again and again. While
    heap_kept lasts, the heaps stay and a few rounds on, the same blocks fault nothing. (Each in a new process:
    a new thread may be given the arena, and the heaps, of one that ended.)"""
    import subprocess

    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _WORKER_ROUNDS, mode], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    kept, unpadded = faults("kept"), faults("unpadded")  # unpadded: heap_kept as it was without the top pad
    if kept < 0:
        pytest.skip("not glibc")
    assert kept < 1000 < 5000 < unpadded, (kept, unpadded)


@pytest.mark.parametrize("shape,weight,args", [
    ((3, 16, 20, 20), (32, 16, 1, 1), ([1, 1], [0, 0], [1, 1], 1)),  # pointwise: torch's own GEMM at one thread
    ((3, 16, 20, 20), (16, 1, 3, 3), ([2, 2], [1, 1], [1, 1], 16)),  # depthwise, strided
    ((2, 8, 9, 9), (4, 8, 3, 3), ([1, 1], [2, 2], [2, 2], 1)),  # dilated
    ((2, 8, 9, 9), (4, 4, 3, 3), ([1], [1], [1], 2)),  # one-element lists, as aten expands them
])
def test_conv2d_on_onednn_is_aten_conv2d(shape, weight, args):
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(weight, generator=gen), torch.randn(weight[0], generator=gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for x in (torch.randn(shape, generator=gen), torch.randn(shape, generator=gen).contiguous(
                memory_format=torch.channels_last)):
            for bias in (b, None):
                want, got = CONV2D(x, w, bias, *args), conv2d(x, w, bias, *args)
                assert got.shape == want.shape and got.dtype == want.dtype
                assert got.is_contiguous(memory_format=torch.channels_last) == \
                    want.is_contiguous(memory_format=torch.channels_last)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch.backends.mkldnn.flags says it on a CPU build
def test_conv2d_leaves_what_onednn_does_not_take_to_aten():
    x, w = torch.randn(1, 4, 8, 8), torch.randn(2, 4, 3, 3)
    assert torch.equal(conv2d(x.double(), w.double(), None), CONV2D(x.double(), w.double()))  # float64
    with torch.backends.mkldnn.flags(enabled=False):  # the user turned oneDNN off
        assert torch.equal(conv2d(x, w, None, [1, 1], [1, 1]), CONV2D(x, w, None, [1, 1], [1, 1]))
    for bad in ((torch.randn(1, 4, 2, 2), w), (x, w, None, 1)):  # aten's own errors: a kernel larger than the
        with pytest.raises(RuntimeError):  # input, an int where aten.conv2d.default takes a list
            conv2d(*bad)


@pytest.mark.parametrize("shape,channels_last", [((5, 3, 4, 4), False), ((5, 64, 64, 40), True),
                                                 ((3, GROUP + 7), False), ((7, 30, 30, 3), True)])
def test_statistics_of_a_group_of_inputs_are_each_inputs_own(shape, channels_last):
    """Rows measured together (a group) give bit for bit what each row measured alone gives, whatever the group
    size; the reference's extremes taken on the way are raw_ranges'."""
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(shape, generator=gen)
    b = a + 0.01 * torch.randn(shape, generator=gen)
    a[1].view(-1)[3] = math.nan
    if channels_last:
        a, b = (t.contiguous(memory_format=torch.channels_last) for t in (a, b))
    batched = batch_metrics(a, b, scratch=Scratch(), ranges=True)
    lo, hi = raw_ranges(a)
    np.testing.assert_array_equal(batched["lo"], lo)
    np.testing.assert_array_equal(batched["hi"], hi)
    for i in range(shape[0]):
        alone = batch_metrics(a[i:i + 1], b[i:i + 1], scratch=Scratch())
        for key in ("sqnr", "cosine", "max_abs", "noise", "signal", "b_norm"):
            np.testing.assert_array_equal(batched[key][i:i + 1], alone[key], err_msg=f"{key} of input {i}")
    local = batch_metrics(a, b, scratch=Scratch(), value_norm=batched["b_norm"], extremes=False)
    np.testing.assert_array_equal(local["sqnr"], batched["sqnr"])
    assert np.isnan(np.delete(local["max_abs"], 1)).all()  # not asked for (input 1's NaN: error_metrics says)


def test_gc_frozen_freezes_for_the_report_only():
    if gc.get_freeze_count():
        pytest.skip("this process froze objects itself")
    with gc_frozen() as applied:
        assert applied and gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with gc_frozen() as applied:  # the process's own freeze is left as it is
            assert not applied
        assert gc.get_freeze_count() == count
    finally:
        gc.unfreeze()


def test_parameters_are_constants_unless_written_in_place(cnn):
    float_gm = cnn[0]
    consts = Constants.of(float_gm)
    params = {n.name for n in float_gm.graph.nodes if n.op == "get_attr"}
    assert params and params <= consts.names
