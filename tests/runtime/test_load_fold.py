"""Instructions computing only from constant data (a causal mask, a resize's sampling grid) run once at load
(`etlab.runtime._load_fold`): a run no longer computes them, and every output is the same bits as with folding
off, on every run, including where the emitter left a view of a folded result with no instruction of its own
(a resize's grids) and where planned memory is shared (an unrolled LSTM)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import etlab.runtime._load_fold as load_fold
from etlab.compiler import to_edge
from etlab.runtime import Runtime
from etlab.runtime._native import _plan
from tests.runtime._ops_seen import OpsSeen


class _CausalScores(nn.Module):
    def forward(self, x):
        t = x.shape[0]
        i = torch.arange(t)
        mask = i.view(t, 1) >= i.view(1, t)
        pos = (torch.arange(t, dtype=torch.float32) * 0.5).view(t, 1)
        return torch.softmax((x @ x.T + pos).masked_fill(~mask, float("-inf")), -1)


class _Bicubic(nn.Module):
    def forward(self, x):
        return F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=False) + 1


class _Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(6, 8, num_layers=2)

    def forward(self, x):
        return self.lstm(x)[0]


def _methods(model, x):
    program = to_edge(torch.export.export(model, (x,))).to_executorch().buffer
    loaded = {}
    for fold in (False, True):
        load_fold.enabled = fold
        # the native core's fused LSTM cells (SLEEF's tanh) off: unfolded, an LSTM's first cell would be fused
        _plan.native_lstm_cells = False
        try:
            loaded[fold] = Runtime.get().load_program(program).load_method("forward")
        finally:
            load_fold.enabled = True
            _plan.native_lstm_cells = True
    return loaded[False], loaded[True]


@pytest.mark.parametrize("model, shape", [(_CausalScores(), (5, 4)), (_Bicubic(), (1, 2, 5, 6)),
                                          (_Lstm(), (7, 1, 6))], ids=["causal", "bicubic", "lstm"])
def test_folded_methods_give_the_same_bits_on_every_run(model, shape):
    torch.manual_seed(0)
    model.eval()
    plain, folded = _methods(model, torch.randn(*shape))
    for _ in range(3):  # planned memory reused run after run: folded results stay what they were
        x = torch.randn(*shape)
        want = plain.execute([x])[0]
        assert torch.equal(folded.execute([x])[0], want)
        with torch.no_grad():
            torch.testing.assert_close(want, model(x), rtol=1e-5, atol=1e-5)


def test_the_mask_is_computed_at_load_not_per_run():
    torch.manual_seed(0)
    plain, folded = _methods(_CausalScores(), torch.randn(5, 4))
    x = torch.randn(5, 4)
    with OpsSeen() as before:
        plain.execute([x])
    with OpsSeen() as after:
        folded.execute([x])
    mask_ops = ("ge.", "bitwise_not.", "scalar_tensor.")  # (Edge itself turned the aranges into constants)
    assert all(any(n.startswith(op) for n in before.names) for op in mask_ops)  # they run without folding
    assert not any(n.startswith(mask_ops) for n in after.names)
    assert any(n.startswith("mm") for n in after.names)  # what depends on the input still runs


def test_random_and_uninitialized_operators_are_never_folded():
    for name in ("aten::rand.out", "aten::randn.out", "aten::bernoulli.float_out", "aten::normal.float_Tensor_out",
                 "aten::empty.out", "aten::native_dropout.out"):
        assert load_fold._IMPURE.search(name), name
    assert not load_fold._IMPURE.search("aten::arange.start_out")


def test_a_folded_result_read_through_views_moves_with_them():
    """Edge leaves a bicubic resize's weight rows as views of a `cat` result (tensors sharing its memory, with no
    instruction of their own): the cat folds all the same, its views moved along with its result."""
    torch.manual_seed(0)
    plain, folded = _methods(_Bicubic(), torch.randn(1, 2, 5, 6))
    x = torch.randn(1, 2, 5, 6)
    with OpsSeen() as before:
        want = plain.execute([x])[0]
    with OpsSeen() as after:
        got = folded.execute([x])[0]
    assert any(n.startswith("cat.") for n in before.names)
    assert not any(n.startswith("cat.") for n in after.names)
    assert torch.equal(got, want)
