"""QuantizationView: chart, table and graph of a QuantReport; its tab in the dashboard and the HTML report."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torchao")

from etlab.compiler import EtlabQuantizer
from etlab.devtools import quantization_report
from etlab.devtools._quant_debug import float_graph_of
from etlab.devtools._quant_debug_fix import quantize_pt2e
from etlab.facts import display
from etlab.models import make_cnn
from etlab.visualizer import QuantizationView, show
from etlab.visualizer._quant_view import NOISE_METRIC, PAGE_GRAPH, noise_ratio


@pytest.fixture(scope="module")
def report():
    model, inputs = make_cnn()
    float_gm = float_graph_of(model, inputs)
    return quantization_report(float_gm, quantize_pt2e(float_gm, EtlabQuantizer(), [inputs]), inputs)


def test_chart_table_and_graph_overlay(report):
    view = QuantizationView(report)
    worst = report.worst(1)["layer"].iloc[0]
    # the chart: local SQNR bars (worst in red), the accumulated SQNR line, one point per layer
    bars, line = view.figure.data
    assert list(bars.x) == list(report.layers["order"]) and len(line.y) == len(report.layers)
    colors = dict(zip([c[0] for c in bars.customdata], bars.marker.color))
    assert colors[worst] == "#e45756"
    assert len(view.table.rows) == len(report.layers)
    assert {r["focus"]["name"] for r in view.table.rows} == set(report.layers["layer"])
    # the graph: the float model's nodes, each layer colored by the noise it introduced; folded BN too
    graph = view.graph.model
    assert graph.gap_metric == NOISE_METRIC and view.graph.overlay == "gap"
    row = report.layers.set_index("layer").loc["conv2d"]
    assert graph.node_named("conv2d").gap == pytest.approx(10 ** (-row["local_sqnr"] / 10))
    assert graph.node_named("batch_norm").gap == graph.node_named("conv2d").gap
    # the details of the worst layer name its source line
    assert worst in view.details.value and "zoo.py" in view.details.value
    assert worst in view.summary_text()


def test_a_click_selects_the_layer_in_the_graph(report):
    view = QuantizationView(report)
    view.table.clicked = {"row": {"layer": "conv2d_4", "focus": {"name": "conv2d_4"}}}
    assert view.graph.focus_target["name"] == "conv2d_4"
    assert "conv2d_4" in view.details.value
    view.select("hardtanh")
    assert view.graph.focus_target["name"] == "hardtanh"


def test_noise_ratio():
    assert noise_ratio(math.inf) == 0.0
    assert noise_ratio(20.0) == pytest.approx(0.01)
    assert noise_ratio(math.nan) is None


def test_report_repr_show_and_pages(report, tmp_path, mlp_inspector):
    assert "local_sqnr" in display.html(report) and report.worst(1)["layer"].iloc[0] in report._repr_html_()
    assert isinstance(report.show(), QuantizationView)
    page = (QuantizationView(report).save_html(tmp_path / "q.html"))
    text = open(page, encoding="utf-8").read()
    assert "Quantization" in text and PAGE_GRAPH in text and "conv2d_4" in text
    dash = show(mlp_inspector, quantization=report)
    assert "quantization" in dash.views and dash.get_title(list(dash.views).index("quantization")) == "Quantization"
    html = open(dash.save_html(tmp_path / "report.html"), encoding="utf-8").read()
    assert 'data-tab="quantization"' in html and PAGE_GRAPH in html
    assert "quantization" not in show(mlp_inspector).views  # no report, no tab


def test_rejects_other_objects():
    with pytest.raises(TypeError, match="QuantReport"):
        QuantizationView(object())
