"""Layered (Sugiyama) layout of a GraphModel, computed in Python once per graph structure.

Why here and not in the browser: ELK in a web worker took 3-11 s per graph on a loaded 2-core
machine, and every pane, every expand and every reload of a saved page paid it again. The layout
depends only on the graph's structure, so it is computed once (cached by a structural hash), ships
inside the graph JSON, and the browser (or `compose` here, for the static SVG) only places boxes.

The layout is hierarchical: each container (the root and every module / delegate group) is laid
out on its own, over its direct children (nodes and child groups drawn as their collapsed boxes),
plus "ports" (zero-size points on its top and bottom border where edges from outside enter and
leave). Per container: layering (longest path, sources pulled down to their first consumer),
long edges split by dummy points (one per crossed layer, so an edge never passes through a box),
crossing reduction (barycenter sweeps, the best order kept), coordinate assignment (weighted
isotonic regression per layer: each box as near its neighbours' mean as the spacing allows).

`compose(kit, expanded)` then places any set of expanded groups without laying out again: an
expanded group's box takes its own container's size, its layer grows to fit, the boxes beside it
in that layer move aside by half the growth, and later layers move down. Expanding a group costs
one linear pass (`static/graph_layout.js` is the same function for the browser).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import OrderedDict
from dataclasses import dataclass

CHAR_W = 6.6
NODE_H = 34
GROUP_H = 40
LAYER_GAP = 26
NODE_GAP = 14
DUMMY_W = 8
PAD = 10
PAD_TOP = 28
SWEEPS = 6
_CACHE: OrderedDict[str, dict] = OrderedDict()
_ENCODED: OrderedDict[str, str] = OrderedDict()
_CACHE_SIZE = 32


# --- labels and box sizes (the browser draws the same text, graph_common.js) -------------------------


def short_op(op: str) -> str:
    """"aten.addmm.default" -> "addmm": the label a node is drawn with."""
    parts = str(op).split(".")
    if parts[0] in ("aten", "dim_order_ops", "quantized_decomposed"):
        return parts[1] if len(parts) > 1 and parts[1] else op
    return op


def shape_text(node) -> str:
    """A node's second line: 'float32 [1,3,8,8]'."""
    if not node.shapes:
        return ""
    dims = " ".join("[" + ",".join(str(d) for d in sh) + "]" for sh in node.shapes)
    return (f"{node.dtypes[0]} " if node.dtypes else "") + dims


def node_label(node) -> str:
    """The text a node's box shows: the short op name for ops, the node's name otherwise; the layout sizes boxes from
    it."""
    return short_op(node.op) if node.kind in ("op", "control_flow") else node.name


def _text_width(*lines: str) -> float:
    return max(70.0, min(260.0, max(len(t) for t in lines) * CHAR_W + 18))


def node_size(node) -> tuple[float, float]:
    """The (width, height) of a node's box in layout units, from its label and shape text, so boxes fit their text and
    the layout leaves room for it."""
    return _text_width(node_label(node), shape_text(node)), float(NODE_H)


def collapsed_size(group, ops: int) -> tuple[float, float]:
    """Room for '▸ label' and 'N ops · 12.34 ms' (an overlay's total)."""
    return _text_width("▸ " + group.label, f"{ops} ops · 0.0000e+00 ms"), float(GROUP_H)


# --- one container ----------------------------------------------------------------------------------


@dataclass
class _Box:
    w: float
    h: float
    key: float  # topological rank: the smallest node id inside (ports: before / after everything)


def _layers(boxes: dict[str, _Box], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layering of the non-port boxes; sources sit just above their first consumer."""
    real = sorted((b for b in boxes if not b.startswith(("in:", "out:"))), key=lambda b: boxes[b].key)
    preds: dict[str, list[str]] = {b: [] for b in boxes}
    succs: dict[str, list[str]] = {b: [] for b in boxes}
    for a, b in edges:
        succs[a].append(b)
        preds[b].append(a)
    layer: dict[str, int] = {}
    for b in real:
        layer[b] = max((layer[p] + 1 for p in preds[b] if p in layer), default=0)
    for b in reversed(real):
        below = [layer[s] for s in succs[b] if s in layer]
        if below and not any(p in layer for p in preds[b]):
            layer[b] = min(below) - 1
    has_in = any(b.startswith("in:") for b in boxes)
    low = min(layer.values(), default=0)
    for b in layer:
        layer[b] += (1 if has_in else 0) - low
    last = max(layer.values(), default=0) + 1
    for b in boxes:
        if b.startswith("in:"):
            layer[b] = 0
        elif b.startswith("out:"):
            layer[b] = last
    return layer


def _crossings(upper_pos: dict[str, int], lower: list[str], preds: dict[str, list[str]]) -> int:
    """Edge crossings between two adjacent layers (inversions of the edges' upper positions)."""
    seq = [upper_pos[p] for b in lower for p in sorted(preds[b], key=upper_pos.__getitem__)]
    if len(seq) < 2:
        return 0
    size = max(seq) + 1
    tree = [0] * (size + 1)
    count = 0
    for i, v in enumerate(seq):
        j, seen = v + 1, 0
        while j > 0:
            seen += tree[j]
            j -= j & -j
        count += i - seen
        j = v + 1
        while j <= size:
            tree[j] += 1
            j += j & -j
    return count


def _order(layers: list[list[str]], preds, succs) -> list[list[str]]:
    """Barycenter sweeps (down, then up); returns the order with the fewest crossings seen."""

    def total(ls):
        pos = [{b: i for i, b in enumerate(layer)} for layer in ls]
        return sum(_crossings(pos[i - 1], ls[i], preds) for i in range(1, len(ls)))

    best, best_count = [list(x) for x in layers], total(layers)
    current = [list(x) for x in layers]
    for sweep in range(SWEEPS):
        if best_count == 0:
            break
        down = sweep % 2 == 0
        rng = range(1, len(current)) if down else range(len(current) - 2, -1, -1)
        for i in rng:
            ref = current[i - 1] if down else current[i + 1]
            pos = {b: k for k, b in enumerate(ref)}
            nbrs = preds if down else succs
            own = {b: k for k, b in enumerate(current[i])}

            def bary(b, pos=pos, nbrs=nbrs, own=own):
                ps = [pos[n] for n in nbrs[b] if n in pos]
                return sum(ps) / len(ps) if ps else own[b] * len(pos) / max(1, len(own))

            current[i].sort(key=bary)
        count = total(current)
        if count < best_count:
            best, best_count = [list(x) for x in current], count
    return best


def _pav(desired: list[float], weights: list[float], offsets: list[float]) -> list[float]:
    """Positions x_i nearest (weighted least squares) to `desired` with x_i - x_{i-1} >= the spacing
    between them: isotonic regression on desired - offset (offsets: cumulative minimal spacing)."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count (a whole number)]
    for d, w, o in zip(desired, weights, offsets):
        blocks.append([(d - o) * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, wt, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += wt
            blocks[-1][2] += c
    out = []
    for s, w, c in blocks:
        out.extend([s / w] * int(c))
    return [y + o for y, o in zip(out, offsets)]


def _x_positions(layers: list[list[str]], boxes: dict[str, _Box], preds, succs) -> dict[str, float]:
    """Box centers: packed, then pulled towards their neighbours' mean, layer by layer, down and up."""
    x: dict[str, float] = {}
    offsets_of = []
    for layer in layers:
        offs, acc = [], 0.0
        for i, b in enumerate(layer):
            if i:
                acc += (boxes[layer[i - 1]].w + boxes[b].w) / 2 + NODE_GAP
            offs.append(acc)
        offsets_of.append(offs)
        for b, o in zip(layer, offs):
            x[b] = o
    for sweep in range(4):
        down = sweep % 2 == 0
        rng = range(1, len(layers)) if down else range(len(layers) - 2, -1, -1)
        for i in rng:
            nbrs = preds if down else succs
            desired, weights = [], []
            for b in layers[i]:
                ns = [x[n] for n in nbrs[b] if n in x]
                desired.append(sum(ns) / len(ns) if ns else x[b])
                weights.append((4.0 if b.startswith("d") else 1.0) * (1.0 if ns else 0.1))
            for b, v in zip(layers[i], _pav(desired, weights, offsets_of[i])):
                x[b] = v
    left = min((x[b] - boxes[b].w / 2 for b in x), default=0.0)
    return {b: v - left for b, v in x.items()}


def layout_container(boxes: dict[str, _Box], edges: list[tuple[str, str]]) -> dict:
    """One container's layout: {"items": {id: [layer, center x, w, h]}, "layers": [[id]], "chains":
    {"a>b": [ids from the upper to the lower end, dummies between]}}."""
    edges = list(dict.fromkeys(e for e in edges if e[0] != e[1]))
    # lay out along the topological rank: an edge against it (a module feeding back into an earlier one) is reversed
    layered = list(dict.fromkeys((a, b) if boxes[a].key < boxes[b].key else (b, a) for a, b in edges))
    layer = _layers(boxes, layered)
    nodes = dict(boxes)
    preds: dict[str, list[str]] = {b: [] for b in nodes}
    succs: dict[str, list[str]] = {b: [] for b in nodes}
    chain_of: dict[tuple[str, str], list[str]] = {}
    dummies = 0
    for a, b in layered:
        path = [a]
        for k in range(layer[a] + 1, layer[b]):
            d = f"d{dummies}"
            dummies += 1
            nodes[d] = _Box(DUMMY_W, 0.0, boxes[a].key)
            preds[d], succs[d] = [], []
            layer[d] = k
            path.append(d)
        path.append(b)
        for u, v in itertools.pairwise(path):
            succs[u].append(v)
            preds[v].append(u)
        chain_of[(a, b)] = path
    depth = max(layer.values(), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(depth)]
    for b in sorted(nodes, key=lambda b: (nodes[b].key, b)):
        layers[layer[b]].append(b)
    layers = _order(layers, preds, succs)
    x = _x_positions(layers, nodes, preds, succs)
    chains = {}
    for a, b in edges:
        forward = boxes[a].key < boxes[b].key
        chains[f"{a}>{b}"] = chain_of[(a, b) if forward else (b, a)]
    return {"items": {b: [layer[b], round(x[b], 1), round(nodes[b].w, 1), round(nodes[b].h, 1)] for b in nodes},
            "layers": layers, "chains": chains}


# --- the whole graph -----------------------------------------------------------------------------------


def _group_paths(model) -> dict[str | None, list[str]]:
    """group id -> its chain of groups, outermost first (None -> []). Iterative: a recorded module
    stack may nest deeper than Python's recursion limit."""
    parent = {g.id: g.parent for g in model.groups}
    paths: dict[str | None, list[str]] = {None: []}
    for g in model.groups:
        chain = []
        gid = g.id
        while gid not in paths and len(chain) <= len(parent):  # bounded: a parent loop cannot hang
            chain.append(gid)
            gid = parent.get(gid)
        prefix = paths.get(gid, [])
        for c in reversed(chain):
            prefix = paths[c] = [*prefix, c]
    return paths


def structure_key(model) -> str:
    """A hash of what the layout depends on: boxes' sizes, groups' nesting and the edges."""
    data = [[n.id, n.group, *node_size(n)] for n in model.nodes], \
        [[g.id, g.parent, g.label] for g in model.groups], [list(e) for e in model.edges]
    return hashlib.sha256(json.dumps(data, separators=(",", ":")).encode()).hexdigest()[:20]


def _build(model) -> dict:
    paths = _group_paths(model)
    ops: dict[str, int] = {}
    for n in model.nodes:
        for gid in paths.get(n.group, []):
            ops[gid] = ops.get(gid, 0) + 1
    by_id = {g.id: g for g in model.groups}
    containers: dict[str, dict[str, _Box]] = {"": {}}
    for g in model.groups:
        containers.setdefault(g.id, {})
    for g in model.groups:
        w, h = collapsed_size(g, ops.get(g.id, 0))
        containers[g.parent or ""][f"g:{g.id}"] = _Box(w, h, float("inf"))
    node_path = {}
    for n in model.nodes:
        node_path[n.id] = ["", *paths.get(n.group, [])]
        w, h = node_size(n)
        containers[n.group or ""][f"n{n.id}"] = _Box(w, h, float(n.id))
        for gid in paths.get(n.group, []):  # a group's rank: its first node
            box = containers[by_id[gid].parent or ""][f"g:{gid}"]
            box.key = min(box.key, float(n.id))
    edges: dict[str, list[tuple[str, str]]] = {c: [] for c in containers}

    def child(path: list[str], depth: int, nid: int) -> str:
        return f"g:{path[depth + 1]}" if depth + 1 < len(path) else f"n{nid}"

    for a, b in model.edges:
        pa, pb = node_path[a], node_path[b]
        common = 0
        while common + 1 < min(len(pa), len(pb)) and pa[common + 1] == pb[common + 1]:
            common += 1
        for depth in range(common + 1, len(pa)):  # up from a: leave each container by a bottom port
            c = child(pa, depth, a)
            containers[pa[depth]].setdefault(f"out:{c}", _Box(2.0, 0.0, float("inf")))
            edges[pa[depth]].append((c, f"out:{c}"))
        edges[pa[common]].append((child(pa, common, a), child(pb, common, b)))
        for depth in range(common + 1, len(pb)):  # down to b: enter by a top port
            c = child(pb, depth, b)
            containers[pb[depth]].setdefault(f"in:{c}", _Box(2.0, 0.0, float("-inf")))
            edges[pb[depth]].append((f"in:{c}", c))
    laid = {c: layout_container(boxes, edges[c]) for c, boxes in containers.items()}
    return {"key": structure_key(model), "containers": laid,
            "labels": {g.id: round(_text_width("▾ " + g.label) + 10, 1) for g in model.groups}}


def layout_json(model) -> str:
    """The layout as a JSON string, encoded once per structure: the widget state carries it as one
    string (ipywidgets walks every list and dict of a state; 5,000 nodes' layout is ~40,000 of them)."""
    kit = layout_kit(model)
    text = _ENCODED.get(kit["key"])
    if text is None:
        text = _ENCODED[kit["key"]] = json.dumps(kit, separators=(",", ":"))
        while len(_ENCODED) > _CACHE_SIZE:
            _ENCODED.popitem(last=False)
    return text


def layout_kit(model) -> dict:
    """The layout of a GraphModel (see module doc), cached by its structure: graphs that share their
    structure (compare panes of the same program, a re-run cell) share one computation."""
    key = structure_key(model)
    kit = _CACHE.get(key)
    if kit is None:
        kit = _build(model)
        _CACHE[key] = kit
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return kit


# --- placing a set of expanded groups (the browser's graph_layout.js does the same) -------------------------


def _place(kit: dict, expanded: set[str]) -> dict:
    """Local positions of each drawn container's items given which groups are expanded: {container:
    {"pos": {item: [x, y, w, h]}, "bands": [(top, bottom) per layer], "size": (w, h)}}. Inner
    containers first (an expanded group's box takes its content's size); no recursion."""
    order, i = [""], 0
    while i < len(order):
        order += [b[2:] for b in kit["containers"][order[i]]["items"] if b.startswith("g:") and b[2:] in expanded]
        i += 1
    out: dict = {}
    for cid in reversed(order):
        items = kit["containers"][cid]["items"]
        size = {}
        for b, (_, _, w, h) in items.items():
            if b.startswith("g:") and b[2:] in expanded:
                cw, ch = out[b[2:]]["size"]
                size[b] = (max(cw + 2 * PAD, kit["labels"].get(b[2:], 0)), ch + PAD_TOP + PAD)
            else:
                size[b] = (w, h)
        out[cid] = _place_layers(kit["containers"][cid], size)
    return out


def _place_layers(c: dict, size: dict) -> dict:
    """One container: layers stacked (each as tall as its tallest box), boxes beside a grown one
    moved aside by half its growth."""
    items = c["items"]
    local = {}
    y = 0.0
    right = 0.0
    left = float("inf")
    tops = []
    for layer in c["layers"]:
        height = max((size[b][1] for b in layer), default=0.0)
        grow = [size[b][0] - items[b][2] for b in layer]
        before, total = 0.0, sum(grow)
        for b, g in zip(layer, grow):
            # boxes left of a grown one move left by half its growth, boxes right of it right
            cx = items[b][1] + before / 2 - (total - before - g) / 2
            before += g
            w, h = size[b]
            local[b] = [cx - w / 2, y, w, h]
            left = min(left, cx - w / 2)
            right = max(right, cx + w / 2)
        tops.append((y, y + height))
        y += height + LAYER_GAP
    if left == float("inf"):
        left = right = 0.0
    for v in local.values():
        v[0] -= left
    return {"pos": local, "bands": tops, "size": (right - left, max(0.0, y - LAYER_GAP))}


def visible_path(node_path: list[str], expanded: set[str], nid: int) -> tuple[list[str], str]:
    """The containers a node is drawn inside (root first) and the item it is drawn as: itself, or
    its outermost collapsed group."""
    for i, gid in enumerate(node_path[1:], start=1):
        if gid not in expanded:
            return node_path[:i], f"g:{gid}"
    return node_path, f"n{nid}"


def compose(kit: dict, model, expanded: set[str]) -> dict:
    """Absolute boxes and edge polylines for a set of expanded groups: {"boxes": {item: [x, y, w, h]},
    "edges": [[source item, target item, [[x, y], ...]]], "size": [w, h]}."""
    placed = _place(kit, expanded)
    origin = {"": (PAD, PAD_TOP)}
    boxes: dict[str, list[float]] = {}
    ports: dict[str, list[float]] = {}  # "in:x@container": port names repeat across containers
    stack = [""]
    while stack:
        cid = stack.pop()
        ox, oy = origin[cid]
        for b, (x, y, w, h) in placed[cid]["pos"].items():
            if b.startswith(("in:", "out:")):
                ports[f"{b}@{cid}"] = [x + ox, y + oy, w, h]
                continue
            if b.startswith("d"):
                continue
            boxes[b] = [x + ox, y + oy, w, h]
            if b.startswith("g:") and b[2:] in expanded:
                cw = placed[b[2:]]["size"][0]
                origin[b[2:]] = (x + ox + (w - cw) / 2, y + oy + PAD_TOP)
                stack.append(b[2:])
    paths = _group_paths(model)

    def port_x(cid: str, port: str) -> float | None:
        box = ports.get(f"{port}@{cid}")
        return None if box is None else box[0] + box[2] / 2

    def points(cid: str, chain: list[str], start_x: float | None, end_x: float | None) -> list[list[float]]:
        ox, oy = origin[cid]
        bands = placed[cid]["bands"]
        ch = placed[cid]["size"][1]
        items = kit["containers"][cid]["items"]
        pts: list[list[float]] = []
        last = len(chain) - 1
        for k, b in enumerate(chain):
            if b.startswith(("in:", "out:")):
                x, y, w, h = ports[f"{b}@{cid}"]
            elif b.startswith("d"):
                x, y, w, h = placed[cid]["pos"][b][0] + ox, 0.0, DUMMY_W, 0.0
            else:
                x, y, w, h = boxes[b]
            top, bottom = (t + oy for t in bands[items[b][0]])
            cx = x + w / 2
            if b.startswith("in:"):
                pts += [[cx, oy - PAD_TOP], [cx, bottom]]
            elif b.startswith("out:"):
                pts += [[cx, top], [cx, oy + ch + PAD]]
            elif k == 0:
                cx = cx if start_x is None else start_x
                pts += [[cx, y + h], [cx, bottom]]
            elif k == last:
                pts.append([cx if end_x is None else end_x, top])
            else:
                pts += [[cx, top], [cx, bottom]]
        return pts

    edges = []
    seen = set()
    for a, b in model.edges:
        pa, va = visible_path(["", *paths.get(model.nodes[a].group, [])], expanded, a)
        pb, vb = visible_path(["", *paths.get(model.nodes[b].group, [])], expanded, b)
        if va == vb or (va, vb) in seen:
            continue
        seen.add((va, vb))

        def child(p, depth, v):
            return f"g:{p[depth + 1]}" if depth + 1 < len(p) else v

        common = 0
        while common + 1 < min(len(pa), len(pb)) and pa[common + 1] == pb[common + 1]:
            common += 1
        pieces: list[tuple[str, str, str]] = []
        for depth in range(len(pa) - 1, common, -1):
            c = child(pa, depth, va)
            pieces.append((pa[depth], c, f"out:{c}"))
        pieces.append((pa[common], child(pa, common, va), child(pb, common, vb)))
        for depth in range(common + 1, len(pb)):
            c = child(pb, depth, vb)
            pieces.append((pb[depth], f"in:{c}", c))
        line: list[list[float]] = []
        exit_x = None
        for i, (cid, s, t) in enumerate(pieces):
            chain = kit["containers"][cid]["chains"][f"{s}>{t}"]
            forward = chain[0] == s
            entry_x = None
            if i + 1 < len(pieces) and pieces[i + 1][1].startswith("in:"):
                entry_x = port_x(pieces[i + 1][0], pieces[i + 1][1])
            pts = points(cid, chain, exit_x if forward else None, entry_x if forward else None)
            line += pts if forward else pts[::-1]
            exit_x = port_x(cid, t) if t.startswith("out:") else None
        dedup = [p for i, p in enumerate(line) if i == 0 or p != line[i - 1]]
        edges.append([va, vb, [[round(x, 1), round(y, 1)] for x, y in dedup]])
    w, h = placed[""]["size"]
    return {"boxes": {k: [round(v, 1) for v in b] for k, b in boxes.items()},
            "edges": edges, "size": [round(w + 2 * PAD, 1), round(h + PAD_TOP + PAD, 1)]}


def initial_expanded(model, collapse_threshold: int = 400) -> set[str]:
    """The groups a view opens with expanded: all of them for graphs up to the threshold, else none."""
    return {g.id for g in model.groups} if len(model.nodes) <= collapse_threshold else set()
