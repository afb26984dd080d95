"""quantization_report on what models from libraries do (issue 28): a shifted-window attention mask
built in float with in-place writes (Swin) is never ranked, runtime=True and False rank alike, and
degenerate values (all zero, ~1e-9) are said to be so instead of printing 0 dB or inf."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

pytest.importorskip("torchao")

from torchao.testing.pt2e._xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)

from etlab.devtools import quantization_report
from etlab.devtools._quant_debug import degenerate_reason, float_graph_of, mutated_later
from etlab.devtools._quant_debug_fix import quantize_pt2e


class _MaskedAttention(nn.Module):
    """Swin's shifted-window mask: zeros, regions numbered by in-place slice writes, then a -100 mask
    added to attention scores. The mask ops stay float and are bit-exact in the quantized program."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):  # x: (B, N=8, d)
        mask = x.new_zeros(8)
        count = 0
        for s in (slice(0, 3), slice(3, 6), slice(6, None)):
            mask[s] = count
            count += 1
        pairs = mask.unsqueeze(0) - mask.unsqueeze(1)
        bias = pairs.masked_fill(pairs != 0, -100.0)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(-2, -1) + bias, dim=-1)
        return self.proj(attn @ v)


def _quantized(model, inputs):
    float_gm = float_graph_of(model, inputs)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    return float_gm, quantize_pt2e(float_gm, quantizer, [inputs])


@pytest.mark.slow
def test_float_mask_ops_are_not_ranked_and_both_paths_agree():
    torch.manual_seed(0)
    model, inputs = _MaskedAttention().eval(), (torch.randn(2, 8, 16),)
    float_gm, quantized = _quantized(model, inputs)
    assert any("new_zeros" in n for n in mutated_later(float_gm))
    names = {}
    for runtime in (False, True):
        report = quantization_report(model, quantized, inputs, runtime=runtime)
        layers = report.layers
        mask_rows = layers[layers["op"].str.contains("new_zeros|slice|masked_fill|sub")]
        assert len(mask_rows) and not mask_rows["ranked"].any()
        worst = report.worst(len(layers))
        assert len(worst) and worst["quantized"].all()
        assert not worst["local_sqnr"].isin([math.inf, -math.inf]).any(), worst[["layer", "local_sqnr"]]
        assert not (layers[layers["ranked"]]["local_sqnr"] == math.inf).any()  # bit-exact: never ranked
        names[runtime] = list(report.worst(3)["layer"])
        assert "-inf" not in report.summary()
    assert names[False] == names[True]


class _Tiny(nn.Module):
    """A randomly initialised tail whose output is ~1e-9 (or exactly zero)."""

    def __init__(self, scale: float):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        with torch.no_grad():
            self.fc.weight.mul_(scale)
            self.fc.bias.mul_(scale)

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("scale, reason", [(1e-9, "tiny"), (0.0, "all zero")])
def test_degenerate_outputs_are_named_not_scored(scale, reason):
    torch.manual_seed(0)
    model, inputs = _Tiny(scale).eval(), (torch.randn(3, 8),)
    _, quantized = _quantized(model, inputs)
    report = quantization_report(model, quantized, inputs)
    assert report.output and reason in report.output[0]["degenerate"]
    assert math.isnan(report.output_sqnr)
    assert "not meaningful" in report.summary() and reason in report.summary()
    fc = report.layers[report.layers["op"].str.contains("linear")]
    assert len(fc) and (fc["degenerate"] != "").all() and not fc["ranked"].any()


def test_degenerate_reason_values():
    ones = torch.ones(4)
    assert degenerate_reason(torch.zeros(4), ones) == "float value is all zero"
    assert "tiny" in degenerate_reason(ones * 1e-9, ones * 1e-9)
    assert "quantized value is all zero" in degenerate_reason(ones * 0.01, torch.zeros(4))
    assert degenerate_reason(ones, ones * 0.99) == ""
    assert degenerate_reason(torch.tensor([-math.inf, 0.5]), torch.tensor([-math.inf, 0.5])) == ""
