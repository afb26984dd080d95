"""Notebook views of a program and its runs; every view also exports to one offline HTML file.

- `GraphView(program_or_inspector, graph="edge"|"aten"|"runtime"|[kinds])`: the graph grouped by
  nn.Module (collapsible), delegates outlined by backend, overlays (p50 latency, numeric gap,
  output bytes), node details, search; a list of kinds compares graphs synced by debug handle.
- `MemoryTimeline(program_manager)`: planned tensors per memory id over instruction steps, the
  live bytes with the lower bound and the arena size.
- `DelegationView`, `NumericGapView`, `ProfileView`: tables and charts that click through to the graph.
- `CompareView(comparison)`: `Inspector.compare`'s rows, A/B latency chart, graph colored by B/A.
- `QuantizationView(quant_report)`: per-layer SQNR (local vs accumulated) linked to the float graph
  and the source line; a Quantization tab in `show(inspector, quantization=report)`.
- `DatasetQuantizationView(dataset_report)`: per-layer SQNR distributions over a dataset, calibration
  coverage (range used vs seen), the worst inputs.
- `show(inspector, program=None)` -> `Dashboard`: all of them in tabs; `.save_html(path)`.
- `inspector_html`, `event_block_html`, `delegation_info_html`, `repr_mimebundle`: rich reprs.
- `report_main(argv)`: `etlab report --etdump P --etrecord R -o report.html`.
"""

from etlab.visualizer._analysis_views import DelegationView, NumericGapView, ProfileView
from etlab.visualizer._cli import report_main
from etlab.visualizer._compare_view import CompareView, capture_warning, comparison_html
from etlab.visualizer._dashboard import Dashboard, show
from etlab.visualizer._fleet_view import FleetDiffView
from etlab.visualizer._graph_model import GraphGroup, GraphModel, GraphModelBuilder, GraphNode, build_graph_model
from etlab.visualizer._graph_view import GraphView, graph_models
from etlab.visualizer._memory_view import MemoryTimeline
from etlab.visualizer._plot_view import PlotView
from etlab.visualizer._profile_data import op_kind, runs_merged
from etlab.visualizer._quant_view import (
    DatasetQuantizationView,
    QuantizationView,
    dataset_report_html,
    quant_report_html,
)
from etlab.visualizer._reprs import (
    delegation_info_html,
    event_block_html,
    inspector_html,
    repr_mimebundle,
)
from etlab.visualizer._sources import ProgramSources, resolve_sources
from etlab.visualizer._table import TableView

__all__ = [
    "CompareView",
    "Dashboard",
    "DatasetQuantizationView",
    "DelegationView",
    "FleetDiffView",
    "GraphGroup",
    "GraphModel",
    "GraphModelBuilder",
    "GraphNode",
    "GraphView",
    "MemoryTimeline",
    "NumericGapView",
    "PlotView",
    "ProfileView",
    "ProgramSources",
    "QuantizationView",
    "TableView",
    "build_graph_model",
    "capture_warning",
    "comparison_html",
    "delegation_info_html",
    "event_block_html",
    "graph_models",
    "inspector_html",
    "op_kind",
    "report_main",
    "repr_mimebundle",
    "resolve_sources",
    "runs_merged",
    "show",
]


def _register_reprs() -> None:
    """Hands the reprs and the dashboard to etlab.facts.display, which the analysis objects ask."""
    from etlab.devtools import DelegationInfo
    from etlab.facts import display
    from etlab.inspector import Comparison, EventBlock, Inspector, MemorySummary
    from etlab.visualizer._memory_view import memory_summary_html

    display.register(Inspector, html=inspector_html, show=show)
    display.register(MemorySummary, html=memory_summary_html)
    display.register(EventBlock, html=event_block_html)
    display.register(DelegationInfo, html=delegation_info_html)
    display.register("etlab.fleet.FleetDiff", show=FleetDiffView)  # by name: fleet loads duckdb, pyarrow
    display.register(Comparison, html=comparison_html, show=CompareView)
    display.register("etlab.devtools.QuantReport", html=quant_report_html, show=QuantizationView)
    display.register("etlab.devtools.DatasetQuantReport", html=dataset_report_html, show=DatasetQuantizationView)


_register_reprs()
