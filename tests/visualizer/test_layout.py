"""The Python graph layout (etlab/visualizer/_layout.py): boxes never overlap, groups hold their members,
edges never pass through a box, the layout is cached by structure, and the browser's placement
(graph_layout.js) draws exactly what `compose` computes."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from etlab.visualizer import GraphView
from etlab.visualizer._graph_model import build_graph_model
from etlab.visualizer._graph_svg import graph_svg
from etlab.visualizer._graph_view import graphs_json
from etlab.visualizer._layout import compose, layout_kit, structure_key
from etlab.visualizer._synthetic import synthetic_graph_model


def _overlap(a, b, margin=0.5) -> bool:
    return a[0] + margin < b[0] + b[2] and b[0] + margin < a[0] + a[2] and \
        a[1] + margin < b[1] + b[3] and b[1] + margin < a[1] + a[3]


def _crosses(p, q, box, margin=1.0) -> bool:
    """Whether segment p-q passes through the inside of box (shrunk by margin): Liang-Barsky clipping."""
    x0, y0, x1, y1 = box[0] + margin, box[1] + margin, box[0] + box[2] - margin, box[1] + box[3] - margin
    if x1 <= x0 or y1 <= y0:
        return False
    dx, dy = q[0] - p[0], q[1] - p[1]
    lo, hi = 0.0, 1.0
    for d, start, a, b in ((dx, p[0], x0, x1), (dy, p[1], y0, y1)):
        if d == 0:
            if not a < start < b:
                return False
            continue
        t0, t1 = sorted(((a - start) / d, (b - start) / d))
        lo, hi = max(lo, t0), min(hi, t1)
    return lo < hi


def check_layout(model, expanded: set[str]) -> dict:
    laid = compose(layout_kit(model), model, expanded)
    boxes = laid["boxes"]
    groups = {g.id: g for g in model.groups}
    leaves = {k: b for k, b in boxes.items() if k.startswith("n") or k[2:] not in expanded}
    items = sorted(leaves.items(), key=lambda kv: kv[1][0])
    for i, (a, ba) in enumerate(items):  # sweep on x: no two drawn boxes overlap
        for b, bb in items[i + 1:]:
            if bb[0] >= ba[0] + ba[2]:
                break
            assert not _overlap(ba, bb), (a, ba, b, bb)
    for k, b in boxes.items():  # every box lies inside its expanded parent group's box
        parent = model.nodes[int(k[1:])].group if k.startswith("n") else groups[k[2:]].parent
        if parent is not None and parent in expanded:
            outer = boxes[f"g:{parent}"]
            assert outer[0] <= b[0] and b[0] + b[2] <= outer[0] + outer[2] + 0.2, (k, b, parent, outer)
            assert outer[1] < b[1] and b[1] + b[3] <= outer[1] + outer[3] + 0.2, (k, b, parent, outer)
    for src, dst, pts in laid["edges"]:  # edges pass through no box but their own ends
        assert len(pts) >= 2
        for p, q in itertools.pairwise(pts):
            for k, b in leaves.items():
                if k not in (src, dst):
                    assert not _crosses(p, q, b), (src, dst, p, q, k, b)
    return laid


def test_synthetic_graph_collapsed_expanded_and_partly_expanded():
    model = synthetic_graph_model(600, block_size=60)
    everything = {g.id for g in model.groups}
    check_layout(model, set())
    laid = check_layout(model, everything)
    assert sum(k.startswith("n") for k in laid["boxes"]) == 600
    rng = random.Random(7)
    for _ in range(3):
        check_layout(model, {g for g in everything if rng.random() < 0.5})


def test_program_graphs_every_kind(mlp_run):
    for kind in ("aten", "edge", "runtime"):
        program = mlp_run.manager.exported_program() if kind == "runtime" else \
            mlp_run.manager.get_etrecord().edge_dialect_program if kind == "edge" else \
            mlp_run.manager.get_etrecord().exported_program
        model = build_graph_model(program, kind)
        laid = check_layout(model, {g.id for g in model.groups})
        assert sum(k.startswith("n") for k in laid["boxes"]) == len(model.nodes)
        check_layout(model, set())


def test_layout_is_cached_by_structure_and_shared_by_panes():
    a, b = synthetic_graph_model(300, block_size=50), synthetic_graph_model(300, block_size=50)
    b.kind, b.title = "runtime", "same structure, other pane"
    assert structure_key(a) == structure_key(b) and layout_kit(a) is layout_kit(b)
    graphs = graphs_json([a, b])
    assert "containers" in json.loads(graphs[0]["layout"])
    assert graphs[1]["layout"] == {"key": structure_key(a), "same_as": 0}
    c = synthetic_graph_model(301, block_size=50)
    assert structure_key(c) != structure_key(a)


def test_static_copy_draws_the_graph(mlp_run):
    view = GraphView(mlp_run.manager, "edge")
    svg = graph_svg(view.model)
    assert svg.startswith("<svg") and svg.count("<rect") >= len(view.model.nodes)
    assert "data-role=\"graph-image\"" in view.static_html()
    big = synthetic_graph_model(5000)
    assert len(graph_svg(big)) < 60_000  # a big graph is drawn collapsed in the static copy


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_graphs(n):
    check_layout(synthetic_graph_model(n, block_size=2), set())


def test_deeply_nested_groups_do_not_recurse():
    """A recorded module stack may nest deeper than Python's recursion limit (a hostile ETRecord)."""
    from etlab.visualizer._graph_model import GraphGroup, GraphModel, GraphNode

    depth = 1500
    model = GraphModel(title="deep", kind="edge", method="forward")
    model.groups = [GraphGroup(id=f"m{i}", label=f"m{i}", kind="module", parent=f"m{i - 1}" if i else None)
                    for i in range(depth)]
    model.nodes = [GraphNode(id=0, name="a", kind="op", op="aten.relu.default", group=f"m{depth - 1}"),
                   GraphNode(id=1, name="b", kind="op", op="aten.relu.default", group=None)]
    model.edges = [(0, 1)]
    laid = compose(layout_kit(model), model, {g.id for g in model.groups})
    assert "n0" in laid["boxes"] and len(laid["edges"]) == 1
