"""Regression tests for compile failures the corpus found (issue 15): each fails without its fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from etlab.compiler import CompileError, to_edge
from etlab.runtime import Runtime

pytestmark = pytest.mark.corpus


def _compile_and_run(module: nn.Module, inputs: tuple):
    ep = torch.export.export(module.eval(), inputs)
    et = to_edge(ep).to_executorch()
    ops = {n.target for n in et.exported_program().graph.nodes if n.op == "call_function"}
    outs = Runtime.get().load_program(et.buffer).load_method("forward").execute(list(inputs))
    return ops, list(outs)


def _eager(module, inputs) -> list[torch.Tensor]:
    with torch.no_grad():
        return [t for t in torch.utils._pytree.tree_leaves(module(*inputs)) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("make", [
    lambda: nn.LSTM(8, 16, batch_first=True),
    lambda: nn.LSTM(8, 16, num_layers=2, bidirectional=True),
    lambda: nn.GRU(8, 16, num_layers=2, bidirectional=True, batch_first=True),
], ids=["lstm", "lstm_bidir_2layer", "gru_bidir_2layer"])
def test_rnn_decomposes_to_portable_ops_not_mkldnn(make):
    """nn.LSTM used to reach the edge check as aten.mkldnn_rnn_layer (oneDNN's CPU kernel)."""
    torch.manual_seed(0)
    module, x = make().eval(), (torch.randn(2, 5, 8),)
    ops, outs = _compile_and_run(module, x)
    names = {str(op) for op in ops}
    assert not any("mkldnn" in n for n in names), names
    want = _eager(module, x)
    assert len(outs) == len(want)
    for got, ref in zip(outs, want):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_compiling_an_rnn_leaves_onednn_enabled():
    """The decomposition turns oneDNN off only while it records."""
    before = torch.backends.mkldnn.enabled
    _compile_and_run(nn.LSTM(4, 4), (torch.randn(3, 1, 4),))
    assert torch.backends.mkldnn.enabled == before


class _TriuPairs(nn.Module):
    def forward(self, x):
        i, j = torch.triu_indices(4, 4, 1)
        return x[:, i, j]


def test_tensor_free_non_core_op_is_folded_to_a_constant():
    """torch.triu_indices(4, 4, 1) is not core ATen and has no decomposition; it reads no tensor, so
    it is computed at compile time (the recommendation-tower model used to fail here)."""
    x = (torch.randn(2, 4, 4),)
    ops, outs = _compile_and_run(_TriuPairs(), x)
    assert torch.ops.aten.triu_indices.default not in ops
    torch.testing.assert_close(outs[0], _TriuPairs()(*x))


class _Antialiased(nn.Module):
    def forward(self, x):
        return F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)


def test_unsupported_op_names_the_op_and_the_users_line():
    """Antialiased resize has no portable decomposition (upstream lets it through to a runtime with
    no kernel for it); etlab refuses it at compile time, naming the op and this file's line."""
    ep = torch.export.export(_Antialiased(), (torch.randn(1, 2, 8, 8),))
    with pytest.raises(CompileError) as info:
        to_edge(ep)
    assert info.value.op == "aten._upsample_bilinear2d_aa.default"
    assert "test_regressions.py" in (info.value.source or "")
    assert "antialias=True" in str(info.value)


class _DynamicLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(x) * x.shape[1]


def test_dynamic_reshape_in_a_decomposition_is_spliced_without_a_retrace(monkeypatch):
    """linear on a (batch, seq, d) input decomposes to view(batch*seq, d) -> addmm -> view: a symbolic
    size used to force the whole program through run_decompositions (8 s for the corpus'
    dynamic_encoder); the sizes now become sym_size/mul nodes on the inputs. `* x.shape[1]` (a
    symbolic size where mul wants a tensor) used to be emitted as an Int the mul.out kernel refused
    at load; it now goes through scalar_tensor."""
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=16)
    module = _DynamicLinear().eval()
    ep = torch.export.export(module, (torch.randn(2, 3, 8),), dynamic_shapes={"x": {0: batch, 1: seq}})

    def no_retrace(*_a, **_k):
        raise AssertionError("to_edge fell back to run_decompositions")

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", no_retrace)
    program = Runtime.get().load_program(to_edge(ep).to_executorch().buffer)
    for shape in ((1, 2, 8), (5, 11, 8)):
        x = torch.randn(*shape)
        torch.testing.assert_close(program.load_method("forward").execute([x])[0], module(x).detach())


class _ScaledTranspose(nn.Module):
    def forward(self, x, y):
        return (x.transpose(1, 2) * 0.5) * y


def test_ops_after_a_former_view_get_contiguous_layouts():
    """transpose becomes permute_copy (a contiguous result), but the ops after it kept the transposed
    strides: the .pte gave mul's output another dim order than its inputs, which upstream's portable
    mul refuses (20 of 44 corpus models failed on upstream's runtime that way)."""
    from etlab.schema import load_pte

    ep = torch.export.export(_ScaledTranspose(), (torch.randn(2, 3, 4), torch.randn(2, 4, 3)))
    et = to_edge(ep).to_executorch()
    plan = load_pte(et.buffer).program.execution_plan[0]
    orders = [list(v.val.dim_order) for v in plan.values if type(v.val).__name__ == "Tensor"]
    assert orders and all(o == sorted(o) for o in orders), orders


class _PermutedConvBN(nn.Module):
    """SegFormer's decode head: tokens permuted to NCHW, then conv, BatchNorm, ReLU, conv."""

    def __init__(self):
        super().__init__()
        self.fuse, self.bn, self.cls = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8), nn.Conv2d(8, 3, 1)

    def forward(self, tokens):
        x = tokens.reshape(1, 6, 6, 16).permute(0, 3, 1, 2)
        return self.cls(torch.relu(self.bn(self.fuse(x))))


def test_multi_output_ops_after_a_former_view_get_their_layouts_refreshed():
    """The layout refresh skipped batch norm (it returns a tuple), leaving its output channels-last
    between contiguous neighbours: SegFormer's output was off by 5e-3 on etlab's runtime and
    upstream's refused it."""
    torch.manual_seed(0)
    module = _PermutedConvBN().eval()
    module.bn.running_mean.uniform_(-1, 1)
    module.bn.running_var.uniform_(0.5, 2)
    x = (torch.randn(1, 36, 16),)
    _, outs = _compile_and_run(module, x)
    torch.testing.assert_close(outs[0], _eager(module, x)[0], atol=1e-5, rtol=1e-5)
    ep = torch.export.export(module, x)
    vals = [n.meta["val"] for n in to_edge(ep).exported_program().graph.nodes
            if isinstance(n.meta.get("val"), torch.Tensor)]
    assert all(v.is_contiguous() for v in vals)


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.AdaptiveAvgPool1d(3), (2, 4, 10)),
    (lambda: nn.AvgPool1d(3, 2), (2, 4, 10)),
    (lambda: nn.Fold((4, 5), (2, 2)), (1, 12, 12)),
], ids=["adaptive_avg_pool1d", "avg_pool1d", "col2im"])
def test_core_ops_without_portable_kernels_are_decomposed(make, shape):
    """adaptive_avg_pool1d (Swin), avg_pool1d and col2im are tagged core but portable runtimes have no
    kernel for them; upstream's runtime refused etlab's Swin program. They now lower to ops it has."""
    module, x = make(), (torch.randn(*shape),)
    ops, outs = _compile_and_run(module, x)
    names = " ".join(str(op) for op in ops)
    assert not any(n in names for n in ("adaptive_avg_pool1d", "avg_pool1d", "col2im")), names
    torch.testing.assert_close(outs[0], _eager(module, x)[0])


class _MaskedAnd(nn.Module):
    def forward(self, x, a, b):
        return x.masked_fill(a & b, 0.0)


def test_etrecord_accepts_dunder_named_aten_ops(tmp_path):
    """transformers' attention masks export aten.__and__.Tensor; the ETRecord loader refused any
    '__' name, so the Inspector failed on 8 corpus text models."""
    from etlab.etrecord import parse_etrecord

    inputs = (torch.randn(3, 4), torch.rand(3, 4) > 0.5, torch.rand(3, 4) > 0.5)
    et = to_edge(torch.export.export(_MaskedAnd(), inputs), generate_etrecord=True).to_executorch()
    path = tmp_path / "m.etrecord"
    et.get_etrecord().save(str(path))
    record = parse_etrecord(str(path))
    assert record is not None
