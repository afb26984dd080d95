"""The views outside a notebook: in a plain Python REPL `repr(view)` was ipywidgets' repr of the widget (its
class and traits), and IPython's terminal showed that cut at 110 characters. Every view now has a short text
form (etlab.visualizer._text.TextForm, the Dashboard's mechanism): what it shows, in lines and table rows within
the terminal's width. Checked in a plain `python -c` (no IPython) as a user's script prints the views."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torchao")

# one process builds the views of a delegated MLP (compiled, run 3 times with intermediates) and its int8
# quantization (one example, and a dataset of 6 inputs without a runtime), and of a small synthetic fleet's
# build comparison, then prints each view's repr
SCRIPT = r'''
import tempfile
from pathlib import Path
import torch
from etlab import visualizer as v
from etlab.compiler import EtlabQuantizer, to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.devtools import dataset_report, quantization_report
from etlab.devtools._quant_debug import float_graph_of
from etlab.devtools._quant_debug_fix import quantize_pt2e
from etlab.fleet import FleetSpec, diff, generate_fleet, ingest
from etlab.inspector import Inspector
from etlab.models import make_mlp
from etlab.runtime import Runtime

d = Path(tempfile.mkdtemp())
model, inputs = make_mlp()
edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[DemoPartitioner()],
                                   generate_etrecord=True)
manager = edge.to_executorch()
manager.write_to_file(d / "model.pte")
program = Runtime.get().load_program(d / "model.pte", enable_etdump=True, debug_buffer_size=1 << 20)
method = program.load_method("forward")
for _ in range(3):
    method.execute(list(inputs))
program.write_etdump_result_to_file(d / "run.etdp", d / "run.bin")
record = manager.get_etrecord()
record.update_representative_inputs(list(inputs))
ins = Inspector(etdump_path=d / "run.etdp", debug_buffer_path=d / "run.bin", etrecord=record)
float_gm = float_graph_of(model, inputs)
quantized = quantize_pt2e(float_gm, EtlabQuantizer(), [inputs])
data = [(torch.randn_like(inputs[0]),) for _ in range(6)]
gap = v.NumericGapView(ins)
views = {"GraphView": v.GraphView(manager), "DelegationView": v.DelegationView(manager),
         "MemoryTimeline": v.MemoryTimeline(manager), "NumericGapView": gap, "TableView": gap.table,
         "PlotView": gap.plot, "ProfileView": v.ProfileView(ins, manager),
         "CompareView": v.CompareView(ins.compare(ins)),
         "QuantizationView": v.QuantizationView(quantization_report(float_gm, quantized, inputs)),
         "DatasetQuantizationView": v.DatasetQuantizationView(dataset_report(float_gm, quantized, data, backend=None,
                                                                             progress=False)),
         "Dashboard": v.show(ins, manager)}
fleet = generate_fleet(d / "fleet", FleetSpec(devices_per_class=1, sessions=1, runs=4, seed=5))
ingest(fleet.root, d / "store", workers=1)
views["FleetDiffView"] = v.FleetDiffView(diff(d / "store", "build=A", "build=B"))
for name, view in views.items():
    bundle = view._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["text/plain"] == repr(view) and "text/html" in data, name  # IPython's terminal: the same text
    print(f"=== {name}")
    print(repr(view))
'''


@pytest.fixture(scope="module")
def printed() -> dict[str, str]:
    env = dict(os.environ)  # etlab as installed in the venv (make setup), no path override
    env.pop("COLUMNS", None)  # stdout a pipe: the 120-column default
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    parts = p.stdout.split("=== ")[1:]
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] for part in parts}


def test_every_view_prints_a_short_text_form_within_the_width(printed):
    assert set(printed) == {"GraphView", "DelegationView", "MemoryTimeline", "NumericGapView", "TableView",
                            "PlotView", "ProfileView", "CompareView", "QuantizationView", "DatasetQuantizationView",
                            "Dashboard", "FleetDiffView"}
    for name, text in printed.items():
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= 120, (name, max(lines, key=len))
        assert len(text) < 4000, (name, len(text))  # a few lines, not the widget's state
        assert "<" not in text and "Layout(" not in text and "children=" not in text, (name, text[:300])
        assert "a notebook view: display it in Jupyter" in lines[-1], name


def test_each_view_says_what_it_shows(printed):
    graph = printed["GraphView"]
    assert graph.startswith("Edge (lowered): 10 nodes") and "delegated partitions" in graph and "addmm" in graph
    delegation = printed["DelegationView"]
    assert "6 of 8 operators delegated (75%)" in delegation and "DemoBackend" in delegation
    assert "aten_relu_default" in delegation and "operator: 2 (relu, relu_1)" in delegation
    memory = printed["MemoryTimeline"]
    assert memory.startswith("memory plan of 'forward': 6 planned tensors") and "arena_bytes" in memory
    gap = printed["NumericGapView"]
    assert gap.startswith("5 matched intermediate outputs (MSE): 5 exact") and "native_call_relu.out" in gap
    assert "Matched intermediate outputs" in printed["TableView"] and "zoo.py:" in printed["TableView"]
    plot = printed["PlotView"]
    assert plot.startswith("chart: numeric gap per op") and "scatter gap: 5 points" in plot
    profile = printed["ProfileView"]
    assert "timed events over 3 run(s)" in profile and "DELEGATE_CALL" in profile and "p50 (ms)" in profile
    assert "(columns left out: source; all: .table.rows)" in profile  # what did not fit is named
    compare = printed["CompareView"]
    assert "joined by debug_handle" in compare and "B / A" in compare and "5 rows in both" in compare
    quant = printed["QuantizationView"]
    assert "output SQNR" in quant and "smallest local SQNR (dB) first" in quant and "linear_2" in quant
    dataset = printed["DatasetQuantizationView"]
    assert "local SQNR p95 (dB)" in dataset and "output SQNR (dB)" in dataset and "linear" in dataset
    fleet = printed["FleetDiffView"]
    assert fleet.startswith("base build=A vs head build=B:") and "p50 change (%)" in fleet
    assert "convolution.out" in fleet and "largest p50 change (%) first" in fleet
    dash = printed["Dashboard"]
    assert dash.startswith("Dashboard of Inspector(") and "tabs: Summary, Graph, Memory" in dash
    assert "DELEGATE_CALL" in dash and "numeric gap:" in dash and ".save_html(" in dash
