"""Numeric debugging of quantized programs: per-layer join, local vs inherited error, the fix loop."""

from __future__ import annotations

import math
import operator

import pytest
import torch

pytest.importorskip("torchao")

from torchao.testing.pt2e._xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)

from etlab.devtools import (
    QuantReport,
    quantization_report,
    requantize_excluding,
    sensitivity_table,
)
from etlab.devtools._quant_debug import capture_values, dequantized_output, error_metrics, float_graph_of
from etlab.devtools._quant_debug_fix import quantize_pt2e
from etlab.models.zoo import make_cnn, make_mlp, make_transformer


def _quantizer():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


@pytest.fixture(scope="module")
def cnn():
    model, inputs = make_cnn()
    float_gm = float_graph_of(model, inputs)
    quantized = quantize_pt2e(float_gm, _quantizer(), [inputs])
    return model, inputs, float_gm, quantized


def _plant_bad_scale(quantized, layer: str, factor: float) -> None:
    """Multiplies the output scale of `layer`'s quantize/dequantize pair by `factor` (a coarse grid)."""
    node = next(n for n in quantized.graph.nodes if n.name == layer)
    dq, quantized_output = dequantized_output(node)
    assert quantized_output, f"{layer} has no quantized output"
    q = dq.args[0]
    for n in (q, dq):
        n.args = (n.args[0], float(n.args[1]) * factor, *n.args[2:])
    quantized.recompile()


def test_error_metrics_known_values():
    ref = torch.tensor([1.0, -2.0, 3.0, 0.0])
    assert math.isinf(error_metrics(ref, ref.clone()).sqnr)
    m = error_metrics(ref, ref + torch.tensor([0.1, 0.0, 0.0, -0.1]))
    assert m.mse == pytest.approx(0.005)
    assert m.sqnr == pytest.approx(10 * math.log10(3.5 / 0.005), rel=1e-5)
    assert m.max_abs == pytest.approx(0.1, rel=1e-5)
    assert error_metrics(ref, -ref).cosine == pytest.approx(-1.0)
    masked = torch.tensor([float("-inf"), 1.0])
    assert error_metrics(masked, torch.tensor([float("-inf"), 1.0])).sqnr == math.inf  # -inf masks match
    assert error_metrics(masked, torch.tensor([0.0, 1.0])).sqnr == -math.inf  # a mask lost is total error


def test_every_layer_joined_and_error_is_quantization_sized(cnn):
    model, inputs, float_gm, quantized = cnn
    report = quantization_report(model, quantized, inputs)
    layers = report.layers
    convs = [n.name for n in float_gm.graph.nodes if n.op == "call_function" and "conv2d" in str(n.target)]
    assert set(convs) <= set(layers["layer"])  # every conv joined through prepare/convert provenance
    conv0 = layers.set_index("layer").loc["conv2d"]
    assert conv0["folded"] == ["batch_norm"]  # BN folded into the conv: the float reference is the BN output
    assert conv0["module"] == "features.0.0" and "zoo.py" in conv0["source"]
    assert layers["quantized"].all()
    # int8 error: far from exact, far from garbage
    assert 20 < layers["sqnr"].min() and layers["sqnr"].max() < 60
    assert (layers["cosine"] > 0.99).all()
    assert (layers[["nan", "inf"]] == 0).all().all()
    assert 20 < report.output_sqnr < 60
    with torch.no_grad():
        out = quantized(*inputs)
        ref = model(*inputs)
    assert report.output[0]["sqnr"] == pytest.approx(error_metrics(ref, out).sqnr, rel=1e-4)
    stats = layers.set_index("layer").loc["hardtanh"]
    assert stats["min"] >= 0.0 and stats["max"] <= 6.0 + 1e-6  # relu6 range


def test_planted_bad_scale_is_blamed_and_downstream_is_not(cnn):
    _, inputs, float_gm, clean = cnn
    quantized = quantize_pt2e(float_gm, _quantizer(), [inputs])
    _plant_bad_scale(quantized, "conv2d_3", 24.0)
    before = quantization_report(float_gm, clean, inputs).layers.set_index("layer")
    report = quantization_report(float_gm, quantized, inputs)
    layers = report.layers.set_index("layer")
    assert report.worst(1)["layer"].tolist() == ["conv2d_3"]
    # the layers after it inherit the error: their total SQNR collapses ...
    for downstream in ("hardtanh_2", "conv2d_4"):
        assert layers.loc[downstream, "sqnr"] < before.loc[downstream, "sqnr"] - 10
        assert layers.loc[downstream, "input_sqnr"] < before.loc[downstream, "input_sqnr"] - 10
        # ... but what they introduced themselves is unchanged in kind, and far from the planted layer's
        assert layers.loc[downstream, "local_sqnr"] > layers.loc["conv2d_3", "local_sqnr"] + 10
    # ranking by total error would not single the culprit out; by local error it does
    by_total = report.worst(3, by="sqnr")["layer"].tolist()
    assert by_total[0] != "conv2d_3" or layers["sqnr"].nsmallest(2).diff().abs().iloc[-1] < 3


def test_transformer_joins_attention_and_masks(tmp_path):
    model, inputs = make_transformer()
    float_gm = float_graph_of(model, inputs)
    report = quantization_report(float_gm, quantize_pt2e(float_gm, _quantizer(), [inputs]), inputs)
    layers = report.layers.set_index("layer")
    assert {"linear", "matmul", "layer_norm", "softmax", "masked_fill"} <= set(layers.index)
    assert layers.loc["masked_fill", "sqnr"] > 20  # the -inf causal mask matches itself
    assert math.isinf(layers.loc["softmax", "local_sqnr"])  # kept in float: introduces nothing
    assert layers.loc["linear", "local_sqnr"] < 60  # int8 weights and output: introduces error
    assert isinstance(report, QuantReport) and "output SQNR" in report.summary()


def test_requantize_excluding_keeps_layer_in_float(cnn):
    model, inputs, float_gm, _ = cnn
    quantized = requantize_excluding(model, inputs, _quantizer(), ["conv2d_3"])
    node = next(n for n in quantized.graph.nodes if n.name == "conv2d_3")
    assert not dequantized_output(node)[1]  # output no longer quantized
    weight = node.args[1]
    assert weight.op == "get_attr"  # the float weight, not a dequantize of int8
    assert quantized.get_parameter(weight.target).dtype == torch.float32
    report = quantization_report(float_gm, quantized, inputs)
    assert "conv2d_3" not in report.worst(3)["layer"].tolist()
    with pytest.raises(ValueError, match="neither a node nor a module"):
        requantize_excluding(model, inputs, _quantizer(), ["no_such_layer"])
    # a module path excludes every op traced inside it, like a quantizer's module-name config
    by_module = requantize_excluding(model, inputs, _quantizer(), ["features.2.conv.0"])
    for name in ("conv2d_3", "hardtanh_2"):
        node = next(n for n in by_module.graph.nodes if n.name == name)
        assert not dequantized_output(node)[1]
    assert dequantized_output(next(n for n in by_module.graph.nodes if n.name == "conv2d_4"))[1]


def test_fix_loop_recovers_planted_defect_and_trades_size(cnn):
    _, inputs, float_gm, _ = cnn
    bad = quantize_pt2e(float_gm, _quantizer(), [inputs])
    _plant_bad_scale(bad, "conv2d_3", 24.0)
    report = quantization_report(float_gm, bad, inputs)
    table = sensitivity_table(float_gm, inputs, _quantizer, report=report, ks=(0, 1))
    assert table["kept_in_float"].tolist() == [[], ["conv2d_3"]]
    assert table.loc[1, "worst_layer_sqnr"] > table.loc[0, "worst_layer_sqnr"] + 10  # the defect is gone
    assert table.loc[1, "constant_bytes"] > table.loc[0, "constant_bytes"]  # a float conv costs bytes
    assert (table["size_vs_float"] < 0.6).all()


def test_mlp_and_bad_arguments():
    model, inputs = make_mlp()
    float_gm = float_graph_of(model, inputs)
    report = quantization_report(model, quantize_pt2e(float_gm, _quantizer(), [inputs]), inputs)
    assert len(report.layers) >= 3 and report.worst(2)["layer"].str.startswith("linear").any()
    with pytest.raises(TypeError, match="convert_pt2e"):
        quantization_report(model, "model.pte", inputs)
    class Scale(torch.nn.Module):  # same input, no op in common with the MLP
        def forward(self, x):
            return x * 3.0

    other = float_graph_of(Scale(), inputs)
    with pytest.raises(ValueError, match="traces back"):
        quantization_report(model, quantize_pt2e(other, _quantizer(), [inputs]), inputs)
    with pytest.raises(ValueError, match="worst"):
        report.worst(2, by="cosine")


def test_runtime_values_join_the_converted_graph():
    """runtime=True: the quantized values are etlab's runtime's (compiled .pte, ETDump debug buffer),
    joined back through Edge provenance; the planted defect is found the same way."""
    from etlab.compiler import EtlabQuantizer

    model, inputs = make_cnn()
    float_gm = float_graph_of(model, inputs)
    quantized = quantize_pt2e(float_gm, EtlabQuantizer(), [inputs])
    node = next(n for n in quantized.graph.nodes if n.name == "conv2d_2")
    assert dequantized_output(node)[1]
    _plant_bad_scale(quantized, "conv2d_2", 24.0)
    report = quantization_report(float_gm, quantized, inputs, runtime=True)
    layers = report.layers.set_index("layer")
    assert layers["from_runtime"].all()
    # etlab's quantized kernels agree with torch's run of the converted graph (within one step)
    assert (layers["runtime_vs_torch"] <= layers["max_abs"].clip(lower=1e-6)).all()
    assert report.worst(1)["layer"].tolist() == ["conv2d_2"]
    torch_only = quantization_report(float_gm, quantized, inputs).layers.set_index("layer")
    assert not torch_only["from_runtime"].any()
    assert layers.loc["conv2d_2", "local_sqnr"] == pytest.approx(torch_only.loc["conv2d_2", "local_sqnr"], abs=0.5)


class _Unbind(torch.nn.Module):
    """timm's attention in small: `q, k, v = qkv.unbind(0)` on a batch of one (issue 28: runtime=True failed on
    timm's Swin with "index 1 is out of bounds for dimension 0 with size 1")."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


def test_runtime_values_of_a_multi_output_op():
    """Edge turns unbind into slice + squeeze per output, all with unbind's provenance: no one of them is unbind's
    value (a tuple); each output goes to the getitem whose users consume it, and the report runs."""
    from etlab.compiler import EtlabQuantizer, to_edge
    from etlab.devtools._quant_debug_runtime import runtime_values, value_producers

    torch.manual_seed(0)
    model, inputs = _Unbind().eval(), (torch.randn(1, 5, 8),)
    float_gm = float_graph_of(model, inputs)
    quantized = quantize_pt2e(float_gm, EtlabQuantizer(), [inputs])
    getitems = [n.name for n in quantized.graph.nodes if n.target is operator.getitem]
    assert len(getitems) == 3
    edge = to_edge(torch.export.export(quantized, inputs)).exported_program().graph
    producers = value_producers(edge, quantized)
    assert "unbind" not in producers
    assert set(getitems) <= set(producers) and len({producers[g] for g in getitems}) == 3
    torch_values = capture_values(quantized, inputs)
    assert isinstance(torch_values["unbind"], (tuple, list))
    values = runtime_values(quantized, inputs, like=torch_values)
    # the six Edge ops share one debug handle: the runtime logs the last one's output (v), q and k keep torch's
    assert "unbind" not in values and getitems[-1] in values
    assert all(v.shape == torch_values[k].shape and v.dtype == torch_values[k].dtype for k, v in values.items())
    for g in set(getitems) & set(values):  # each output is its own slice of qkv (v is not q), as torch computed it
        assert torch.allclose(values[g], torch_values[g], atol=0.05), g
    report = quantization_report(float_gm, quantized, inputs, runtime=True)
    torch_only = quantization_report(float_gm, quantized, inputs)
    assert len(report.layers) == len(torch_only.layers)
    assert report.layers["from_runtime"].any()
    assert report.output_sqnr == pytest.approx(torch_only.output_sqnr, abs=3.0)
