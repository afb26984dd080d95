"""GraphView: the program's graph(s) in a notebook widget (anywidget + static/graph_*.js)."""

from __future__ import annotations

import html
import os

import anywidget
import traitlets

from etlab.inspector import numeric_gaps, op_timings, time_unit
from etlab.visualizer import _html
from etlab.visualizer._graph_model import GRAPH_KINDS, GraphModel, aten_handles_of, build_graph_model
from etlab.visualizer._graph_svg import graph_svg, overlay_fills
from etlab.visualizer._layout import layout_json
from etlab.visualizer._profile_data import annotate
from etlab.visualizer._sources import ProgramSources, resolve_sources
from etlab.visualizer._text import TextForm, wrap

OVERLAYS = ("none", "latency", "gap", "bytes")
TITLES = {"aten": "ATen", "edge": "Edge (lowered)", "runtime": "Runtime (planned)"}


def graph_models(sources: ProgramSources, kinds: list[str], *, gap_distance: str = "MSE") -> list[GraphModel]:
    """The GraphModels of the requested kinds, with timings and gaps when there is an Inspector."""
    models = []
    for kind in kinds:
        program = sources.graph(kind)
        handles_of = aten_handles_of(sources.edge) if kind == "aten" and sources.edge is not None \
            and sources.edge is not sources.aten else None
        models.append(build_graph_model(program, kind, title=TITLES[kind], method=sources.method,
                                        handles_of=handles_of))
    ins = sources.inspector
    if ins is not None:
        timings = op_timings(ins, sources.instruction_handles())
        gaps = numeric_gaps(ins, gap_distance)
        for m in models:
            annotate(m, timings, gaps, unit=time_unit(ins), gap_metric=gap_distance if gaps else "")
    return models


def graphs_json(models: list[GraphModel]) -> list[dict]:
    """The graphs' JSON for the browser, each layout as one JSON string (`layout_json`); a layout
    shared with an earlier pane (same structure) is sent once, the later pane pointing at it
    ({"key", "same_as": index})."""
    out, first = [], {}
    for i, m in enumerate(models):
        data = m.to_json()
        key = data["layout"]["key"]
        if key in first:
            data["layout"] = {"key": key, "same_as": first[key]}
        else:
            first[key] = i
            data["layout"] = layout_json(m)
        out.append(data)
    return out


def graph_facts(m: GraphModel) -> str:
    """What a graph holds in a sentence: nodes, module groups, delegated partitions and the most frequent ops (the
    static copy's caption and the text form)."""
    ops: dict[str, int] = {}
    for n in m.nodes:
        if n.kind == "op":
            ops[n.op] = ops.get(n.op, 0) + 1
    top = ", ".join(f"{op} ×{k}" for op, k in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
    delegates = sum(n.kind == "delegate" for n in m.nodes) + sum(g.kind == "delegate" for g in m.groups)
    return (f"{len(m.nodes)} nodes, {sum(1 for g in m.groups if g.kind == 'module')} module groups, {delegates} "
            f"delegated partitions. Ops: {top or '–'}")


def _kinds(graph) -> list[str]:
    kinds = [graph] if isinstance(graph, str) else list(graph)
    if not kinds:
        raise ValueError("graph: give at least one of " + ", ".join(GRAPH_KINDS))
    for k in kinds:
        if k not in GRAPH_KINDS:
            raise ValueError(f"graph must be one of {GRAPH_KINDS} (or a list of them for compare mode), got {k!r}")
    return kinds


def _options(kinds: list[str], height: int, collapse_threshold: int, shown: list[str] | None) -> dict:
    """The view's `options` trait (see graph_view.js)."""
    if shown is not None and (not shown or any(k not in kinds for k in shown)):
        raise ValueError(f"shown must be a non-empty list of the graphs asked for ({kinds}), got {shown!r}")
    options: dict[str, int | list[str]] = {"height": int(height), "collapse_threshold": int(collapse_threshold)}
    if shown is not None:
        options["shown"] = list(shown)
    return options


class GraphView(TextForm, anywidget.AnyWidget):
    """The graph of a program: nodes grouped by nn.Module (collapsible), delegated partitions
    outlined in their backend's color, an overlay (p50 latency, numeric gap, output bytes), a
    details panel for the clicked node, and search.

        GraphView(et_program_manager)                       # the Edge graph, delegates expanded
        GraphView(inspector, overlay="latency")              # graphs from the Inspector's ETRecord
        GraphView(manager, inspector=ins, graph=["aten", "edge", "runtime"])   # compare mode

    Compare mode (a list of graph kinds) shows the graphs side by side; selecting a node
    highlights the nodes sharing its debug handles in the others. `shown`: the kinds whose panes
    start visible (default all; a toolbar checkbox per graph toggles its pane). `selected` holds
    the last clicked node; `focus(name)` selects one from Python. `save_html(path)` writes it offline.

    >>> import os, tempfile, torch
    >>> from etlab.compiler import to_edge_transform_and_lower
    >>> from etlab.compiler.backends import DemoPartitioner
    >>> class AddMul(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return x * y + x
    >>> exported = torch.export.export(AddMul(), (torch.ones(2, 2), torch.ones(2, 2)))
    >>> view = GraphView(to_edge_transform_and_lower(exported, partitioner=[DemoPartitioner()]))
    >>> [(n.kind, n.op) for n in view.model.nodes]  # the delegate expanded: the ops it runs
    [('input', 'input'), ('input', 'input'), ('op', 'aten.mul.Tensor'), ('op', 'aten.add.Tensor'), ('output', 'output')]
    >>> [(g.kind, g.backend) for g in view.model.groups]  # outlined as the backend's partition
    [('delegate', 'DemoBackend')]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     os.path.getsize(view.save_html(os.path.join(d, "graph.html"))) > 0
    True
    """

    _esm = traitlets.Unicode(_html.graph_module_source()).tag(sync=True)
    _css = traitlets.Unicode(_html.theme_css()).tag(sync=True)
    graphs = traitlets.List(traitlets.Dict()).tag(sync=True)
    overlay = traitlets.Unicode("none").tag(sync=True)
    focus_target = traitlets.Dict(default_value={}).tag(sync=True)
    selected = traitlets.Dict(default_value={}).tag(sync=True)
    options = traitlets.Dict(default_value={}).tag(sync=True)

    def __init__(self, program_or_inspector, graph: str | list[str] = "edge", *, inspector=None,
                 method: str = "forward", overlay: str = "none", gap_distance: str = "MSE", height: int = 560,
                 collapse_threshold: int = 400, shown: list[str] | None = None, **kwargs):
        kinds = _kinds(graph)
        if overlay not in OVERLAYS:
            raise ValueError(f"overlay must be one of {OVERLAYS}, got {overlay!r}")
        options = _options(kinds, height, collapse_threshold, shown)
        sources = resolve_sources(program_or_inspector, method, inspector)
        if inspector is not None:
            sources.inspector = inspector
        self.models = graph_models(sources, kinds, gap_distance=gap_distance)
        super().__init__(graphs=graphs_json(self.models), overlay=overlay, options=options, **kwargs)

    @classmethod
    def from_models(cls, models: list[GraphModel], *, overlay: str = "none", height: int = 560,
                    collapse_threshold: int = 400, shown: list[str] | None = None) -> GraphView:
        """A view of GraphModels built elsewhere (e.g. a synthetic graph)."""
        view = cls.__new__(cls)
        view.models = list(models)
        options = _options([m.kind for m in models], height, collapse_threshold, shown)
        anywidget.AnyWidget.__init__(view, graphs=graphs_json(models), overlay=overlay, options=options)
        return view

    @property
    def model(self) -> GraphModel:
        """The (first) graph shown."""
        return self.models[0]

    def focus(self, name: str | None = None, *, handles: list[int] | None = None, kind: str | None = None) -> None:
        """Selects a node by name (or the first node with one of `handles`) and centers on it."""
        if name is None and not handles:
            raise ValueError("focus: give a node name or debug handles")
        found = any((name is not None and any(n.name == name for n in m.nodes)) or
                    (handles and any(set(handles) & set(n.handles) for n in m.nodes)) for m in self.models
                    if kind is None or m.kind == kind)
        if not found:
            raise KeyError(f"focus: no node {name!r}{f' with handles {handles}' if handles else ''} in "
                           f"{[m.kind for m in self.models]}")
        self.focus_target = {"name": name, "handles": list(handles or []), "kind": kind}

    def static_html(self) -> str:
        """What the graphs hold, per graph: nodes, module groups, delegates, the most frequent ops, and
        the graph drawn as an SVG (from the same layout as the widget)."""
        parts = []
        fills = overlay_fills(self.models, self.overlay)
        for m, fill in zip(self.models, fills):
            parts.append(f"<p><b>{html.escape(m.title)}</b>: {html.escape(graph_facts(m))}</p>")
            parts.append(f"<div class='etlab-graph-image' style='max-height:640px;overflow:auto'>"
                         f"{graph_svg(m, collapse_threshold=self.options.get('collapse_threshold', 400), fills=fill)}"
                         "</div>")
        return "".join(parts)

    def text_lines(self, width: int) -> list[str]:
        """Per graph what it holds (TextForm: a plain REPL's repr), the overlay and the selected node."""
        lines = [wrap(f"{m.title}: {graph_facts(m)}", width) for m in self.models]
        if self.overlay != "none":
            lines.append(wrap(f"overlay: {self.overlay}", width))
        if self.selected:
            lines.append(wrap(f"selected: {self.selected.get('name', self.selected)}", width))
        return lines

    def state(self) -> dict:
        """The widget traits a standalone page renders from."""
        return {"graphs": self.graphs, "overlay": self.overlay, "focus_target": self.focus_target or None,
                "selected": {}, "options": self.options}

    def html_fragment(self) -> _html.Fragment:
        """The graph as a page piece: the same view module the widget runs, with its state inlined, so the saved graph
        stays interactive offline."""
        return _html.anywidget_fragment(_html.graph_module_source(), self.state(), what="GraphView",
                                        expose="etlabGraphView")

    def save_html(self, path: str | os.PathLike, title: str | None = None) -> os.PathLike:
        """Writes the view as a standalone offline HTML file (assets inlined)."""
        title = title or " / ".join(m.title for m in self.models)
        return _html.write_page(path, _html.page(title, [self.html_fragment()]))
