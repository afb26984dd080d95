"""Observers chosen per activation from the data (issue 30 item 3): PercentileObserver, the per-value
choice by grid error, and a gap that only an observer change closes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etlab.compiler import ACTIVATION_OBSERVERS, EtlabQuantizer, PercentileObserver, activation_observer
from etlab.devtools import auto_mixed_precision
from etlab.devtools._amp_config import choose_observers, probe
from etlab.devtools._quant_debug import float_graph_of


def test_percentile_observer_ignores_a_rare_spike():
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    x[123] = 1000.0
    obs = activation_observer("percentile")(dtype=torch.int8, quant_min=-128, quant_max=127)
    obs(x)
    assert 3.0 < float(obs.max_val) < 5.0 and -5.0 < float(obs.min_val) < -3.0
    scale, _ = obs.calculate_qparams()
    assert float(scale) < 10.0 / 255
    minmax = activation_observer("minmax")(dtype=torch.int8, quant_min=-128, quant_max=127)
    minmax(x)
    assert float(minmax.max_val) == 1000.0


def test_percentile_observer_averages_batches_and_checks_its_argument():
    obs = PercentileObserver(percentile=100.0)
    obs(torch.tensor([0.0, 1.0]))
    obs(torch.tensor([0.0, 3.0]))
    assert float(obs.max_val) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="percentile must be in"):
        PercentileObserver(percentile=40.0)
    with pytest.raises(ValueError, match="activation observer must be one of"):
        activation_observer("kl")
    assert {"minmax", "histogram", "percentile"} <= set(ACTIVATION_OBSERVERS)


def test_percentile_config_runs_through_prepare_and_convert():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from etlab.compiler import int8_static_config

    model = nn.Sequential(nn.Linear(8, 4)).eval()
    x = torch.randn(20_000, 8, generator=torch.Generator().manual_seed(0))
    x[0, 0] = 500.0
    gm = torch.export.export(model, (x,)).module()
    prepared = prepare_pt2e(gm, EtlabQuantizer(int8_static_config(activation_observer=PercentileObserver)))
    prepared(x)
    converted = convert_pt2e(prepared)
    scales = [float(n.args[1]) for n in converted.graph.nodes
              if n.op == "call_function" and "quantize_per_tensor" in str(n.target) and n.args[0].op == "placeholder"]
    assert scales and max(scales) < 100.0 / 255  # the 500 spike did not set the input's grid


def dead_spike_model() -> nn.Module:
    """Hidden channel 0 fires in under 1% of rows and then ~40x above the other channels, and the last
    layer does not read it: min-max stretches the hidden grid for a value nothing uses."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    with torch.no_grad():
        m[0].weight[0] = torch.full((16,), 50.0)
        m[0].bias[0] = -500.0
        m[2].weight[:, 0] = 0.0
    return m


def spike_data() -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(256, 16, generator=g),) for _ in range(4)]


def test_choose_observers_picks_the_lowest_error_grid_per_value():
    model, data = dead_spike_model(), spike_data()
    p = probe(float_graph_of(model, data[0]), EtlabQuantizer())
    names = ["minmax", "histogram", "percentile", "percentile_99.9"]
    chosen, mse, ranges = choose_observers(p, data, names)
    assert set(chosen) == set(p.values) and "relu" in chosen
    for value, errors in mse.items():
        assert errors[chosen[value]] == min(errors.values())
    relu = ranges["relu"]
    assert relu["minmax"][1] > 50 and relu["percentile_99.9"][1] < 0.1 * relu["minmax"][1]


def test_an_observer_alone_closes_the_gap():
    r = auto_mixed_precision(dead_spike_model(), spike_data(), budget="top1>=0.98", backend="xnnpack",
                             measure_cost=False)
    assert r.int8_metric < 0.9 and r.met and r.float_layers == []
    assert r.config.observer_of.get("relu", "").startswith("percentile")
    row = r.steps[(r.steps["phase"] == "observers") & r.steps["kept"]]
    assert len(row) >= 1 and "relu" in ", ".join(row["layers"])
    assert "outlier" in " ".join(row["why"])
