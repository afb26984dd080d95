"""The contract's drawn graph (etlab.visualizer.GraphModel.to_json, drawn by static/graph_view.js): its nodes with
their latency overlay, its module and delegate boxes. The program, run and comparison views all carry graphs."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict


class Latency(TypedDict):
    """A node's or row's latency statistics over the runs (in the run's time unit; null when missing or not finite)."""

    p50: float | None
    p10: float | None
    p90: float | None
    avg: float | None
    min: float | None
    max: float | None
    runs: int
    events: NotRequired[list[str]]  # the events whose time it is
    shared: NotRequired[int]  # how many nodes share an event's time
    note: NotRequired[str]  # how a delegate call's time was divided among its nodes


class GraphNode(TypedDict):
    """A node of a drawn graph (etlab.visualizer.GraphNode as JSON): what it computes, its group, debug handles,
    shapes and the overlays' values."""

    id: int
    name: str
    kind: Literal["op", "input", "output", "delegate", "control_flow"]
    op: str
    group: str | None
    handles: list[int]
    shapes: list[list[int]]
    dtypes: list[str]
    bytes: int | None
    module: str
    module_type: str
    source: str
    stack_trace: str
    backend: str | None
    weights: list[str]
    latency: Latency | None
    gap: float | None


class GraphGroup(TypedDict):
    """A box of a drawn graph: an nn.Module scope or a delegated partition (etlab.visualizer.GraphGroup as JSON)."""

    id: str
    label: str
    kind: Literal["module", "delegate"]
    parent: str | None
    module_type: str
    backend: str | None


class Graph(TypedDict):
    """One graph; `layout` is placement data only graph_view.js reads (JSON text in the notebook widget,
    data here; visualizer/_layout.py documents it)."""

    title: str
    kind: Literal["aten", "edge", "runtime"]
    method: str
    nodes: list[GraphNode]
    edges: list[list[int]]
    groups: list[GraphGroup]
    backend_colors: dict[str, str]
    time_unit: str
    gap_metric: str
    latency_center: float | None
    layout: dict[str, object] | str
