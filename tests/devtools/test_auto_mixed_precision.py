"""auto_mixed_precision (issue 30 item 2): a planted sensitive layer is found, the budget is met on etlab's
runtime, every choice is explained, and bad budgets or options are refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from etlab.devtools import AccuracyBudget, MixedPrecisionResult, auto_mixed_precision, greedy_float_baseline

PLANTED = "linear_2"  # the third Linear's anchor node


def planted_model() -> nn.Module:
    """Four Linears; the third writes one channel that is a constant 1000 (read by nothing after it), so its
    int8 output grid is ~4 wide and every other channel of it rounds to about zero: the one layer int8
    ruins. Float (or a 16-bit grid) for that layer alone fixes the program."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32),
                      nn.Linear(32, 10)).eval()
    with torch.no_grad():
        m[4].weight[0] = 0.0
        m[4].bias[0] = 1000.0
        m[5].weight[:, 0] = 0.0
    return m


def dataset(n: int = 4, seed: int = 1) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g),) for _ in range(n)]


@pytest.fixture(scope="module")
def xnnpack_result() -> MixedPrecisionResult:
    return auto_mixed_precision(planted_model(), dataset(), budget="sqnr>=27dB", backend="xnnpack",
                                latency_runs=2)


@pytest.fixture(scope="module")
def portable_result() -> MixedPrecisionResult:
    return auto_mixed_precision(planted_model(), dataset(), budget="sqnr>=27dB", backend="portable",
                                measure_cost=False)


def test_planted_layer_is_the_one_kept_in_float_on_xnnpack(xnnpack_result):
    r = xnnpack_result
    assert r.int8_metric < 27, "the planted layer must make plain int8 miss the budget"
    assert r.float_layers == [PLANTED]
    assert r.met and r.metric >= 27 and r.budget.met(r.metric)
    assert not r.config.int16, "XNNPACK has no 16-bit activations: none may be chosen"


def test_budget_measured_on_the_runtime_program_and_cost_reported(xnnpack_result):
    from etlab.devtools._auto_mixed_precision import runtime_outputs

    r = xnnpack_result
    samples = dataset()
    ref = [planted_model()(*s) for s in samples]
    assert r.budget.measure(ref, runtime_outputs(r.program.buffer, samples)) == pytest.approx(r.metric)
    assert r.cost["pte_bytes"] == len(r.program.buffer)
    for key in ("int8_pte_bytes", "float_pte_bytes", "latency_ms", "int8_latency_ms", "float_latency_ms"):
        assert r.cost[key] > 0, key


def test_explanation_names_each_choice(xnnpack_result):
    r = xnnpack_result
    steps = r.steps
    assert steps["phase"].iloc[0] == "int8" and steps["phase"].iloc[-1] == "runtime"
    assert {"observers", "sensitivity", "prefix", "prune"} <= set(steps["phase"])
    assert steps["why"].str.len().min() > 0
    row = r.layers.set_index("layer").loc[PLANTED]
    assert row["precision"] == "float" and row["why"]
    others = r.layers[r.layers["layer"] != PLANTED]
    assert set(others["precision"]) == {"int8"}
    text = r.explain()
    assert PLANTED in text and "sqnr>=27 dB met" in text
    assert PLANTED in r._repr_html_()


def test_portable_fixes_the_planted_layer_with_16_bit_activations(portable_result):
    r = portable_result
    assert r.met and r.float_layers == []
    assert "linear_2" in r.config.int16
    assert r.layers.set_index("layer").loc[PLANTED, "activation"] == "int16"
    # the program really carries an int16 quantize (etlab's portable kernels run it)
    ops = [n for n in r.converted.graph.nodes if n.op == "call_function" and torch.int16 in n.args]
    assert ops


def test_returned_quantizer_reproduces_the_configuration(portable_result):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    samples = dataset()
    gm = torch.export.export(planted_model(), samples[0]).module()
    prepared = prepare_pt2e(gm, portable_result.quantizer())
    for s in samples:
        prepared(*s)
    converted = convert_pt2e(prepared)
    ref = [planted_model()(*s) for s in samples]
    assert portable_result.budget.met(portable_result.budget.measure(ref, [converted(*s) for s in samples]))
    assert portable_result.config.to_dict()["int16_activations"] == ["linear_2"]


def test_met_by_int8_needs_no_change():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8)).eval()
    r = auto_mixed_precision(model, dataset(2), budget="cosine>=0.9", backend="portable", measure_cost=False)
    assert r.met and r.float_layers == [] and list(r.steps["phase"]) == ["int8", "runtime"]


def test_greedy_baseline_meets_the_budget_one_layer_at_a_time():
    table = greedy_float_baseline(planted_model(), dataset(), budget="sqnr>=27dB", backend="xnnpack")
    assert list(table["k"]) == list(range(len(table)))
    assert bool(table["met"].iloc[-1]) and not table["met"].iloc[:-1].any()
    assert PLANTED in table["float_layers"].iloc[-1]
    assert table["runtime_metric"].iloc[-1] >= 27  # the program that ends the loop met it on the runtime


# --- budgets -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "metric", "threshold"), [
    ("top1>=0.99", "top1", 0.99), ("top1 >= 99%", "top1", 0.99), ("cosine>=0.999", "cosine", 0.999),
    ("sqnr>=30dB", "sqnr", 30.0), ("min_sqnr>=25", "min_sqnr", 25.0), ("mse<=1e-4", "mse", 1e-4),
    ("top1_agreement>0.5", "top1", 0.5)])
def test_budget_forms(text, metric, threshold):
    b = AccuracyBudget.parse(text)
    assert (b.metric, b.threshold) == (metric, pytest.approx(threshold))


@pytest.mark.parametrize(("budget", "message"), [
    ("accuracy>=0.9", "unknown metric"), ("top1<=0.99", "better when higher"), ("mse>=0.1", "better when lower"),
    ("top1>=99", "percentage"), ("cosine>=99%", "percentage applies to top1"), ("top1", "cannot read"),
    ("cosine>=1.5", "[-1.0, 1.0]"), ("top1>=0.9dB", "dB applies")])
def test_bad_budgets_are_refused_with_the_reason(budget, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        AccuracyBudget.parse(budget)


def test_bad_budget_types_and_options():
    model, data = planted_model(), dataset(1)
    with pytest.raises(TypeError, match="budget must be a string"):
        auto_mixed_precision(model, data, budget=0.99)
    with pytest.raises(ValueError, match="backend must be one of"):
        auto_mixed_precision(model, data, budget="top1>=0.9", backend="cuda")
    with pytest.raises(ValueError, match="16-bit activations would leave the delegate"):
        auto_mixed_precision(model, data, budget="top1>=0.9", backend="xnnpack", allow_int16=True)
    with pytest.raises(ValueError, match="dataset is empty"):
        auto_mixed_precision(model, [], budget="top1>=0.9")
    with pytest.raises(TypeError, match=r"dataset\[0\]"):
        auto_mixed_precision(model, ["not a tensor"], budget="top1>=0.9")
    with pytest.raises(ValueError, match="observers must be"):
        auto_mixed_precision(model, data, budget="top1>=0.9", observers=["kl"])
    with pytest.raises(ValueError, match="threshold must be a number"):
        AccuracyBudget("top1", math.nan)


def test_user_metric_budget():
    def worst_abs(ref, out):  # lower is better
        return max(float((r - o).abs().max()) for r, o in zip(ref, out))

    b = AccuracyBudget(worst_abs, 0.5, higher_is_better=False)
    ref = [torch.zeros(3)]
    assert b.met(b.measure(ref, [torch.full((3,), 0.25)])) and not b.met(b.measure(ref, [torch.ones(3)]))
    assert str(b) == "worst_abs<=0.5"
    with pytest.raises(TypeError, match="returned str"):
        AccuracyBudget(lambda r, o: "x", 1.0).measure(ref, ref)


def test_named_metrics_on_known_outputs():
    ref = [torch.tensor([[1.0, 0.0], [0.0, 1.0]])]
    out = [torch.tensor([[0.9, 0.1], [0.6, 0.4]])]  # second row's argmax flips
    assert AccuracyBudget.parse("top1>=0.5").measure(ref, out) == 0.5
    noise = float(((ref[0] - out[0]) ** 2).sum())
    assert AccuracyBudget.parse("sqnr>=0").measure(ref, out) == pytest.approx(10 * math.log10(2.0 / noise))


@pytest.mark.slow
def test_a_runtime_miss_makes_the_search_run_again_for_a_stricter_target(monkeypatch):
    """When the compiled program misses a budget the converted model met in torch (the runtime's kernels
    differ), the search runs again for a target stricter by that gap, and says so."""
    import etlab.devtools._auto_mixed_precision as amp

    real = amp.runtime_outputs
    calls = []

    def noisier_once(buffer, samples):
        outs = real(buffer, samples)
        calls.append(1)
        if len(calls) == 1:  # the first program's outputs moved by 5% of their peak: ~26 dB
            return [[t + 0.05 * t.abs().max() * torch.sign(t) for t in out] for out in outs]
        return outs

    monkeypatch.setattr(amp, "runtime_outputs", noisier_once)
    r = auto_mixed_precision(planted_model(), dataset(), budget="sqnr>=27dB", backend="xnnpack", measure_cost=False)
    phases = list(r.steps["phase"])
    assert phases.count("runtime") == 2 and "retarget" in phases
    assert r.met and r.metric >= 27
    retarget = r.steps[r.steps["phase"] == "retarget"].iloc[0]
    assert "tightened" in retarget["change"]


def test_per_tensor_weights_upgraded_to_per_channel_instead_of_float():
    """With a per-tensor quantizer, one weight far above the rest (its input column is always zero, so the
    activations stay normal) flattens every other weight of that layer to zero: per-channel weights for
    that layer alone fix it, and that is chosen before float."""
    from etlab.compiler import EtlabQuantizer, int8_static_config

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    with torch.no_grad():
        model[0].weight[0, 0] = 50.0
    data = [(torch.cat([torch.zeros(8, 1), x[:, 1:]], 1),) for (x,) in dataset()]
    r = auto_mixed_precision(model, data, budget="sqnr>=20dB", backend="xnnpack", measure_cost=False,
                             quantizer_factory=lambda: EtlabQuantizer(int8_static_config(per_channel=False)))
    assert r.int8_metric < 20 and r.met and r.float_layers == []
    assert r.config.per_channel == frozenset({"linear"})
    assert r.layers.set_index("layer").loc["linear", "weights"] == "per-channel int8"
    assert (r.steps["change"] == "per-channel weights instead of float").any()
