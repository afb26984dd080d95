"""etlab's graphs in Model Explorer's graph JSON.

Model Explorer (Google's `ai-edge-model-explorer`) draws a graph from plain JSON: nodes with an id,
a label, a namespace path ("a/b/c": the nested layers it folds), attributes, incoming edges and
per-output metadata (`tensor_shape` is what it writes on edges). etlab already builds one drawable
model of every graph it shows (`etlab.visualizer.GraphModel`: the ATen and Edge programs of an
ETRecord, a .pte method's instruction graph), with module groups, delegate partitions, shapes and the
Inspector's latency and numeric gap on each node. This module only re-spells that model, so Model
Explorer shows what the notebook views show, and an overlay can be keyed to the same node ids.

Pure functions over plain data; nothing here imports Model Explorer (the JSON is checked against its
own classes in `main.py` and the tests).
"""

from __future__ import annotations

import re

from etlab.visualizer import GraphGroup, GraphModel, GraphNode

KIND_TITLES = {"aten": "ATen", "edge": "Edge", "runtime": "instructions"}


def graph_id(model: GraphModel) -> str:
    """The graph's id in Model Explorer (also the key of its node-data overlays): method and stage."""
    return f"{model.method} ({KIND_TITLES.get(model.kind, model.kind)})"


def _segment(text: str) -> str:
    """A namespace segment: Model Explorer splits namespaces on '/', so a name may not hold one."""
    return text.replace("/", "\u2215").strip() or "_"


def _group_segment(g: GraphGroup, parent: GraphGroup | None) -> str:
    if g.kind == "delegate":
        return _segment(g.label)
    name = g.id[len(parent.id) + 1:] if parent is not None and g.id.startswith(parent.id + ".") else g.id
    short = g.module_type.rsplit(".", 1)[-1]
    return _segment(f"{name} ({short})" if short else name)


def _js_regex_literal(text: str) -> str:
    """`text` matched literally by a JavaScript RegExp (escapes only its syntax characters: Python's
    re.escape also escapes spaces, which a unicode-mode RegExp refuses)."""
    return re.sub(r"([.*+?^${}()|\[\]\\/])", r"\\\1", text)


def namespaces(model: GraphModel) -> dict[str, str]:
    """Group id -> its namespace path (module nesting; a delegate partition is a layer of its own)."""
    groups = {g.id: g for g in model.groups}
    out: dict[str, str] = {}

    def path(gid: str, seen: frozenset = frozenset()) -> str:
        if gid in out:
            return out[gid]
        g = groups[gid]
        parent = groups.get(g.parent) if g.parent and g.parent not in seen else None
        seg = _group_segment(g, parent)
        out[gid] = f"{path(parent.id, seen | {gid})}/{seg}" if parent is not None else seg
        return out[gid]

    for gid in groups:
        path(gid)
    return out


SECTION_SIZE = 100
"""Most children one layer shows before etlab splits them into sections. Model Explorer lays a
layer out when it is expanded (the top level when the graph opens); a chain of 1,700 sibling layers
(a long `nn.Sequential`) overflows its layout's stack, and its own splitting (past 1,000 children)
never finishes on one. Sections of consecutive children keep every layer's layout small."""


def _parent_space(space: str) -> str:
    return space.rsplit("/", 1)[0] if "/" in space else ""


def sectioned(spaces: list[str], names: list[str], size: int = SECTION_SIZE) -> tuple[list[str], dict[str, str]]:
    """The op nodes' namespaces (`spaces`, in graph order) with a section layer inserted wherever a
    layer holds more than `size` children (sub-layers and op nodes): `size` consecutive children per
    section, in the order they first appear, each section named by its first and last child (an op
    node by its `names` entry).
    Returns (the nodes' new namespaces, every layer's path -> its new path)."""
    items: dict[str, list] = {}  # layer -> its children in order: a sub-layer's path, or an op node's index
    known: set[str] = {""}
    for i, space in enumerate(spaces):
        chain = []
        while space not in known:
            chain.append(space)
            space = _parent_space(space)
        for sp in reversed(chain):
            known.add(sp)
            items.setdefault(_parent_space(sp), []).append(sp)
        items.setdefault(spaces[i], []).append(i)
    section: dict[str | int, str] = {}  # sub-layer path or op index -> its section's segment
    for kids in items.values():
        if len(kids) <= size:
            continue
        used: set[str] = set()
        for start in range(0, len(kids), size):
            chunk = kids[start:start + size]
            first, last = (k.rsplit("/", 1)[-1] if isinstance(k, str) else names[k] for k in (chunk[0], chunk[-1]))
            seg = _segment(f"{first} .. {last}")  # ASCII: Model Explorer's canvas font lacks "\u2026"
            if seg in used:  # op names repeat (a .pte's "addmm .. addmm"): one namespace would merge the sections
                seg = _segment(f"{first} .. {last} [{start // size + 1}]")
            used.add(seg)
            for k in chunk:
                section[k] = seg
    paths: dict[str, str] = {"": ""}

    def join(head: str, seg: str) -> str:
        return f"{head}/{seg}" if head else seg

    def rewrite(space: str) -> str:
        if space not in paths:
            head = rewrite(_parent_space(space))
            if space in section:
                head = join(head, section[space])
            paths[space] = join(head, space.rsplit("/", 1)[-1])
        return paths[space]

    for sp in sorted(known, key=lambda x: x.count("/")):  # parents first: no deep recursion
        rewrite(sp)
    return [join(paths[sp], section[i]) if i in section else paths[sp] for i, sp in enumerate(spaces)], paths


def node_label(n: GraphNode) -> str:
    """What Model Explorer writes on the node: the operator's short name ("convolution"), the
    delegate's backend, or the input/output name."""
    if n.kind == "delegate":
        return f"{n.backend or 'delegate'} call"
    if n.kind in ("input", "output"):
        return n.name
    op = n.op.split("::")[-1]
    parts = op.split(".")
    if len(parts) >= 3 and parts[0] in ("aten", "quantized_decomposed", "dim_order_ops", "torchao", "etlab"):
        return parts[1]
    return parts[0] if len(parts) == 2 and parts[1] in ("default", "out", "Tensor") else op


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def node_attrs(n: GraphNode, model: GraphModel, extra: dict[str, str] | None = None) -> list[dict]:
    """The side panel's key/value rows of one node (strings, as Model Explorer takes them).

    Only what the drawing does not already say: the module is the node's layer (its namespace; the
    layer's own rows give path and type), so it is a row only for a node a delegated partition holds;
    the output's bytes follow from its `tensor_shape` (and are the `output_bytes` overlay). Every row
    costs on a large graph: Model Explorer's server copies each one (`dataclasses.asdict`) and its page
    parses and keeps it."""
    rows = [{"key": "op", "value": n.op}, {"key": "name", "value": n.name}]
    if n.module and n.group != n.module:
        module = f"{n.module} ({n.module_type.rsplit('.', 1)[-1]})" if n.module_type else n.module
        rows.append({"key": "module", "value": module})
    if n.source:
        rows.append({"key": "source", "value": n.source})
    if n.backend:
        rows.append({"key": "backend", "value": n.backend})
    if n.handles:
        key = "instruction" if model.kind == "runtime" else "debug handles"
        rows.append({"key": key, "value": ", ".join(map(str, n.handles))})
    if n.weights:
        rows.append({"key": "weights", "value": ", ".join(n.weights)})
    if n.latency:
        unit = model.time_unit
        rows += [{"key": f"latency {k} ({unit})", "value": _fmt(n.latency[k])} for k in ("p50", "p90")
                 if n.latency.get(k) is not None]
    if n.gap is not None and model.gap_metric:
        rows.append({"key": f"numeric gap ({model.gap_metric})", "value": _fmt(n.gap)})
    if extra:
        rows += [{"key": k, "value": str(v)} for k, v in extra.items()]
    return rows


def _tensor_shape(shape: list, dtype: str) -> str:
    dims = ",".join("?" if not isinstance(d, int) else str(d) for d in shape)
    return f"{dtype or 'tensor'}[{dims}]"


def outputs_metadata(n: GraphNode, texts: dict | None = None) -> list[dict]:
    """Per output: its `tensor_shape` ("float32[1,32,112,112]"), which Model Explorer draws on edges.
    `texts`: the texts made so far, by (dims, dtype) (a graph's nodes share a few shapes)."""
    out = []
    for i, shape in enumerate(n.shapes):
        dtype = n.dtypes[i] if i < len(n.dtypes) else (n.dtypes[0] if n.dtypes else "")
        key = (repr(shape), dtype)
        text = texts.get(key) if texts is not None else None
        if text is None:
            text = _tensor_shape(shape, dtype)
            if texts is not None:
                texts[key] = text
        out.append({"id": str(i), "attrs": [{"key": "tensor_shape", "value": text}]})
    return out


def to_me_graph(model: GraphModel, node_extra: dict[int, dict[str, str]] | None = None) -> dict:
    """One GraphModel as Model Explorer's graph JSON (node ids are the model's node ids as strings).
    `node_extra`: more attribute rows per node id (e.g. the delegation explainer's reason)."""
    spaces = namespaces(model)
    incoming: dict[int, list[int]] = {}
    for src, dst in model.edges:
        incoming.setdefault(dst, []).append(src)
    labels = [node_label(n) for n in model.nodes]
    node_spaces, paths = sectioned([spaces.get(n.group, "") if n.group else "" for n in model.nodes], labels)
    spaces = {gid: paths.get(space, space) for gid, space in spaces.items()}
    extra = node_extra or {}
    texts: dict[tuple[str, str], str] = {}
    nodes = []
    for n, label, space in zip(model.nodes, labels, node_spaces):
        node = {
            "id": str(n.id), "label": label, "namespace": space,
            "attrs": node_attrs(n, model, extra.get(n.id)),
            "incomingEdges": [{"sourceNodeId": str(s), "sourceNodeOutputId": "0", "targetNodeInputId": str(i)}
                              for i, s in enumerate(incoming.get(n.id, ()))],
            "outputsMetadata": outputs_metadata(n, texts),
        }
        if n.kind == "delegate" and n.backend in model.backend_colors:
            node["style"] = {"borderColor": model.backend_colors[n.backend]}
        nodes.append(node)
    group_attrs: dict[str, dict[str, str]] = {"": {"graph": model.title, "nodes": str(len(model.nodes))}}
    configs = []
    by_id = {g.id: g for g in model.groups}
    for gid, space in spaces.items():
        g = by_id[gid]
        if g.kind == "delegate":
            group_attrs[space] = {"backend": g.backend or "", "partition": g.label}
            color = model.backend_colors.get(g.backend or "")
            if color:
                configs.append({"namespaceRegex": "^" + _js_regex_literal(space) + "$", "borderColor": color})
        elif g.module_type:
            group_attrs[space] = {"module": g.id, "type": g.module_type}
    graph = {"id": graph_id(model), "nodes": nodes, "groupNodeAttributes": group_attrs}
    if configs:
        graph["groupNodeConfigs"] = configs
    return graph

