"""The Inspector's numbers as Model Explorer node-data overlays.

Model Explorer colours nodes from a "node data" JSON file: per graph id, a result (a number) per node
id, and a gradient or thresholds that map values to colours. Each overlay here is one such file,
keyed to the ids `to_me_graph` gives, with the values the annotated `GraphModel` already carries:
the latency the views show (a delegate's nodes split its call's time, so they sum to the call), its
share of the run, the numeric gap and the output bytes. Values are read off the model; nothing is
recomputed, so an overlay equals what the notebook's GraphView shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from etlab.model_explorer._graphs import graph_id
from etlab.visualizer import GraphModel, GraphNode

# Light to dark, readable with the node label on top (Model Explorer draws dark text by default).
WARM = ["#fff7bc", "#fec44f", "#f16913", "#b30000"]
COOL = ["#eff3ff", "#9ecae1", "#4292c6", "#08519c"]


@dataclass(frozen=True)
class Overlay:
    """One node-data overlay: its file stem, the title Model Explorer shows, how to read a node's value."""

    key: str
    title: Callable[[GraphModel], str]
    value: Callable[[GraphNode, GraphModel], float | None]
    colors: tuple[str, ...] = tuple(WARM)


def _latency(stat: str):
    def value(n: GraphNode, _m: GraphModel) -> float | None:
        return n.latency.get(stat) if n.latency else None
    return value


def _share(n: GraphNode, m: GraphModel) -> float | None:
    if not n.latency or n.latency.get("p50") is None:
        return None
    total = sum(x.latency["p50"] for x in m.nodes if x.latency and x.latency.get("p50") is not None)
    return 100.0 * n.latency["p50"] / total if total > 0 else None


OVERLAYS = (
    Overlay("latency_p50", lambda m: f"latency p50 ({m.time_unit})", _latency("p50")),
    Overlay("latency_p90", lambda m: f"latency p90 ({m.time_unit})", _latency("p90")),
    Overlay("run_share", lambda m: "share of run p50 (%)", _share),
    Overlay("numeric_gap", lambda m: f"numeric gap ({m.gap_metric or 'MSE'})", lambda n, m: n.gap),
    Overlay("output_bytes", lambda m: "output bytes", lambda n, m: float(n.bytes) if n.bytes is not None else None,
            tuple(COOL)),
)
OVERLAY_KEYS = tuple(o.key for o in OVERLAYS)


def _finite(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def graph_node_data(model: GraphModel, overlay: Overlay) -> dict | None:
    """One graph's node data for `overlay` (Model Explorer's GraphNodeData JSON), None when no node has a value."""
    results = {}
    for n in model.nodes:
        v = _finite(overlay.value(n, model))
        if v is not None:
            results[str(n.id)] = {"value": v}
    if not results:
        return None
    stops = len(overlay.colors) - 1
    return {"name": overlay.title(model), "results": results,
            "gradient": [{"stop": i / stops, "bgColor": c} for i, c in enumerate(overlay.colors)]}


def node_data(models: list[GraphModel], overlay: Overlay) -> dict:
    """Model Explorer's model-level node data (graph id -> GraphNodeData) for the graphs that have values."""
    out = {}
    for m in models:
        data = graph_node_data(m, overlay)
        if data is not None:
            out[graph_id(m)] = data
    return out


def overlay_named(key: str) -> Overlay:
    """The overlay with key `key`; a ValueError listing the keys otherwise."""
    for o in OVERLAYS:
        if o.key == key:
            return o
    raise ValueError(f"overlay must be one of {', '.join(OVERLAY_KEYS)}, got {key!r}")


# Quantization: SQNR in dB per layer of the float graph; low is bad, so the gradient runs dark to light.
QUANT_OVERLAYS = {"quant_local_sqnr": ("local_sqnr", "quantization: local SQNR (dB), the error a layer introduced"),
                  "quant_sqnr": ("sqnr", "quantization: SQNR (dB) accumulated up to the layer"),
                  "quant_input_sqnr": ("input_sqnr", "quantization: worst input's SQNR (dB), the error inherited")}


def quant_node_data(model: GraphModel, report) -> dict[str, dict]:
    """Overlays of a QuantReport (`etlab.devtools.quantization_report`) on its float graph `model`
    (built from `report.float_graph`): {overlay key: model-level node data}. A layer's value also goes
    on the ops folded into it; exact layers (+inf) and undefined ones (NaN) have none."""
    by_name: dict[str, list[GraphNode]] = {}
    for n in model.nodes:
        by_name.setdefault(n.name, []).append(n)
    out = {}
    for key, (column, title) in QUANT_OVERLAYS.items():
        results = {}
        for row in report.layers.to_dict("records"):
            v = _finite(row.get(column))
            if v is None:
                continue
            for name in [row["layer"], *(row.get("folded") or ())]:
                for n in by_name.get(name, ()):
                    results[str(n.id)] = {"value": v}
        if results:
            stops = len(WARM) - 1
            out[key] = {graph_id(model): {"name": title, "results": results, "gradient": [
                {"stop": i / stops, "bgColor": c} for i, c in enumerate(reversed(WARM))]}}
    return out
