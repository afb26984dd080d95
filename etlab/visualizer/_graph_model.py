"""The graph a GraphView draws: nodes, edges and nn.Module / delegate groups, built from an FX graph.

Three kinds of graph, one model:
- "aten": the exported program (torch.export); it carries no debug handles, so each node takes the
  handles of the edge nodes that came from the same torch call (meta 'torch_fn') in the same module.
- "edge": the Edge-dialect program; delegate calls are expanded into their lowered module's nodes,
  grouped in a partition outlined in the backend's color.
- "runtime": the planned ExecuTorch program (out variants); one node per instruction, a delegate
  call is one node colored by its backend.

Plumbing is left out: `getitem` nodes (consumers link to the value's producer) and lifted
parameters/buffers/constants (listed under their consumer as `weights`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from etlab.facts.fx import is_getitem, node_op_name
from etlab.facts.lowered import DELEGATE_PARTITION_META, is_delegate_call, lowered_module_of
from etlab.facts.source import module_stack, source_line

GRAPH_KINDS = ("aten", "edge", "runtime")

# Backend outline colors: distinct from the op fill palette, stable by first appearance.
BACKEND_COLORS = ["#d62728", "#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#8c564b", "#bcbd22", "#2ca02c"]


@dataclass
class GraphNode:
    """One drawn node. `handles`: debug handles it shares with nodes of other graph kinds."""

    id: int
    name: str
    kind: str  # "op" | "input" | "output" | "delegate" | "control_flow"
    op: str  # "aten.addmm.default", "executorch_call_delegate", "placeholder", ...
    group: str | None  # id of the innermost group holding it
    handles: list[int] = field(default_factory=list)
    shapes: list[list] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    bytes: int | None = None  # output bytes (upper bound for dynamic shapes)
    module: str = ""  # innermost nn.Module path
    module_type: str = ""
    source: str = ""  # "file.py:12 in forward: x = self.fc(x)"
    stack_trace: str = ""
    backend: str | None = None
    weights: list[str] = field(default_factory=list)
    latency: dict | None = None  # p10/p50/p90/avg/min/max (ms), runs, events, shared
    gap: float | None = None


@dataclass
class GraphGroup:
    """A box in the graph view: an nn.Module scope (`module_type`, collapsible) or a delegated partition (`backend`,
    outlined in its color); `parent` nests it."""

    id: str
    label: str
    kind: str  # "module" | "delegate"
    parent: str | None
    module_type: str = ""
    backend: str | None = None


@dataclass
class GraphModel:
    """One graph as the graph view draws it (nodes, edges, groups), independent of torch.fx, so the same drawing serves
    the ATen, edge and runtime graphs and a graph read back from an ETRecord or .pte."""

    title: str
    kind: str
    method: str
    nodes: list[GraphNode] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    groups: list[GraphGroup] = field(default_factory=list)
    backend_colors: dict[str, str] = field(default_factory=dict)
    time_unit: str = "ms"
    gap_metric: str = ""
    latency_center: float | None = None  # the latency overlay is a ratio: colors diverge from this value

    def to_json(self) -> dict:
        """Plain data for the browser (nodes as dicts, edges as [src, dst] id pairs, the layout: _layout.py)."""
        from etlab.visualizer._layout import layout_kit

        return {
            "title": self.title, "kind": self.kind, "method": self.method,
            "nodes": [_shallow(n) for n in self.nodes], "edges": [list(e) for e in self.edges],
            "groups": [_shallow(g) for g in self.groups], "backend_colors": dict(self.backend_colors),
            "time_unit": self.time_unit, "gap_metric": self.gap_metric, "latency_center": self.latency_center,
            "layout": layout_kit(self),
        }

    def node_named(self, name: str) -> GraphNode:
        """The node with this name; a KeyError naming the graph kind when there is none (a focus request for a node
        another stage renamed)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the {self.kind} graph")

    def nodes_with_handle(self, handle: int) -> list[GraphNode]:
        """The nodes carrying this debug handle: how an ETDump event or a node of another stage's graph finds its
        counterpart here."""
        return [n for n in self.nodes if handle in n.handles]


def _shallow(obj) -> dict:
    """A dataclass's fields as a dict, without asdict's deep copy: 5,000 nodes in ~20 ms instead of ~1 s."""
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}


# --- node facts ---------------------------------------------------------------------------------


def node_handles(node: Node) -> list[int]:
    """The debug handles of an fx node (none, one, or several after fusion), as a sorted list whatever form the meta
    holds them in."""
    h = node.meta.get("debug_handle")
    if isinstance(h, int) and not isinstance(h, bool):
        return [h]
    if isinstance(h, (list, tuple)):
        return sorted({int(x) for x in h if isinstance(x, int)})
    return []


def _tensors(val) -> list:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _shape_facts(node: Node) -> tuple[list[list], list[str], int | None]:
    vals = _tensors(node.meta.get("val"))
    if not vals:  # planned graphs keep the shapes on TensorSpecs too
        spec = node.meta.get("spec")
        specs = spec if isinstance(spec, (list, tuple)) else [spec]
        specs = [s for s in specs if hasattr(s, "shape") and hasattr(s, "dtype")]
        return ([list(s.shape) for s in specs], [str(s.dtype).replace("torch.", "") for s in specs],
                sum(s.nbytes for s in specs) if specs else None)
    shapes, dtypes, total = [], [], 0
    for t in vals:
        dims: list[int | str] = []
        for d in t.shape:
            try:
                dims.append(int(d))
            except (TypeError, ValueError):  # a symbolic size without a hint
                dims.append(str(d))
        shapes.append(dims)
        dtypes.append(str(t.dtype).replace("torch.", ""))
        sizes = [d for d in dims if isinstance(d, int)]
        total = total + math.prod(sizes) * t.dtype.itemsize if total is not None and len(sizes) == len(dims) else None
    return shapes, dtypes, total


def _is_control_flow(node: Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator) and \
        not is_delegate_call(node)


def _user_input_names(ep: ExportedProgram | None, gm: GraphModule) -> tuple[set[str], set[str]]:
    """(user input placeholder names, lifted constant placeholder names)."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if ep is None:
        return set(placeholders), set()
    user = {name for name in ep.graph_signature.user_inputs if isinstance(name, str)}
    return user, {p for p in placeholders if p not in user}


# --- building -----------------------------------------------------------------------------------


class GraphModelBuilder:
    """Builds a GraphModel node by node, whatever the graph was read from (torch.fx here, an ETRecord's JSON
    graphs in etlab.model_explorer): module groups made on demand from nn_module_stack entries, backend colors in
    order of first use, edges deduplicated, and only the groups that end up holding nodes kept."""

    def __init__(self, title: str, kind: str, method: str):
        self.model = GraphModel(title=title, kind=kind, method=method)
        self.groups: dict[str, GraphGroup] = {}
        self.edges: set[tuple[int, int]] = set()

    def backend_color(self, backend: str) -> str:
        """The backend's color, the next of BACKEND_COLORS the first time a backend is seen."""
        colors = self.model.backend_colors
        if backend not in colors:
            colors[backend] = BACKEND_COLORS[len(colors) % len(BACKEND_COLORS)]
        return colors[backend]

    def module_group(self, stack: list[tuple[str, str]]) -> str | None:
        """The id of the innermost module group of a (path, type) stack, creating the groups along it."""
        parent = None
        for path, typ in stack:
            if path not in self.groups:
                short = typ.rsplit(".", 1)[-1]
                self.groups[path] = GraphGroup(id=path, label=f"{path} ({short})" if short else path, kind="module",
                                               parent=parent, module_type=typ)
            parent = path
        return parent

    def append(self, node: GraphNode) -> GraphNode:
        """Adds a node (its `id` must be its position, `len(model.nodes)` before the call) and returns it."""
        self.model.nodes.append(node)
        return node

    def link(self, src: object, dst: int) -> None:
        """An edge from node `src` to node `dst`; anything but another node's id (a weight, a missing producer)
        draws none."""
        if isinstance(src, int) and src != dst:
            self.edges.add((src, dst))

    def link_inputs(self, node: GraphNode, sources: list) -> None:
        """Edges into `node` from what its inputs hold: a producer's id, a list of them (a multi-output
        producer read whole), or ("weight", name) for a lifted parameter / buffer / constant, which is
        listed under the node as a weight instead of drawn."""
        for src in sources:
            if isinstance(src, tuple):
                node.weights.append(src[1])
            elif isinstance(src, list):
                for s in src:
                    self.link(s, node.id)
            else:
                self.link(src, node.id)

    @staticmethod
    def unpack(src: object, index: int) -> object:
        """What a getitem of output `index` reads: that producer of a multi-output value, else the value itself."""
        return src[index] if isinstance(src, list) and index < len(src) else src

    @staticmethod
    def as_output(node: GraphNode, index: int) -> GraphNode:
        """A node added for a graph output (from the value it returns) made the output's own: named
        `output_<index>`, without handles or source."""
        node.name, node.handles, node.source, node.stack_trace = f"output_{index}", [], "", ""
        return node

    def close_partition(self, first: int, attr: str, backend: str) -> None:
        """Makes the nodes added since `first` (a delegate's original program) a partition group
        `delegate:<attr>` of the backend, under the deepest group holding them all."""
        gid = f"delegate:{attr}"
        members = self.model.nodes[first:]
        parent = self.common_parent([m.group for m in members])
        self.groups[gid] = GraphGroup(id=gid, label=f"{backend} · {attr}", kind="delegate", parent=parent,
                                      backend=backend)
        for m in members:
            m.group, m.backend = gid, backend

    def common_parent(self, groups: list[str | None]) -> str | None:
        """The deepest group that holds all of `groups` (None: the top level)."""
        chains = []
        for gid in groups:
            chain = []
            while gid is not None:
                chain.append(gid)
                gid = self.groups[gid].parent
            chains.append(chain[::-1])
        common = None
        for level in zip(*chains):
            if all(x == level[0] for x in level):
                common = level[0]
            else:
                break
        return common

    def join_partition(self, node: GraphNode, partition: tuple[str, int]) -> None:
        """Puts a node an upstream pre-lowering edge graph marks as delegated (`partition`: backend, delegate
        instruction; see etlab.etrecord.DELEGATE_PARTITION_META) into that delegate call's partition group."""
        backend, instruction = partition
        gid = f"delegate:instruction_{instruction}"
        group = self.groups.get(gid)
        if group is None:
            self.backend_color(backend)
            group = self.groups[gid] = GraphGroup(id=gid, label=f"{backend} · instruction {instruction}",
                                                  kind="delegate", parent=node.group, backend=backend)
        else:
            group.parent = self.common_parent([group.parent, node.group])
        node.group, node.backend = gid, backend

    def finish(self) -> GraphModel:
        """The model, with the groups that hold nodes (and their ancestors) and the edges in order."""
        keep: set[str] = set()
        for gid in {n.group for n in self.model.nodes if n.group}:
            while gid is not None and gid not in keep:
                keep.add(gid)
                gid = self.groups[gid].parent
        self.model.groups = [g for g in self.groups.values() if g.id in keep]
        self.model.edges = sorted(self.edges)
        return self.model


class _Builder(GraphModelBuilder):
    def add_node(self, node: Node, kind: str, group: str | None, *, op: str | None = None,
                 handles: list[int] | None = None, backend: str | None = None) -> GraphNode:
        shapes, dtypes, nbytes = _shape_facts(node)
        stack = module_stack(node.meta.get("nn_module_stack"))
        trace = node.meta.get("stack_trace") or ""
        return self.append(GraphNode(
            id=len(self.model.nodes), name=node.name, kind=kind, op=op or node_op_name(node), group=group,
            handles=node_handles(node) if handles is None else handles, shapes=shapes, dtypes=dtypes, bytes=nbytes,
            module=stack[-1][0] if stack else "", module_type=stack[-1][1] if stack else "",
            source=source_line(trace), stack_trace=trace, backend=backend))


def _add_graph(b: _Builder, gm: GraphModule, ep: ExportedProgram | None, kind: str,
               value_of: dict[str, int | None] | None = None, top: bool = True,
               handles_of=None) -> list:
    """Adds gm's nodes; returns the producer ids of its outputs (for delegate expansion)."""
    user_inputs, constants = _user_input_names(ep, gm)
    value: dict[str, object] = dict(value_of or {})  # node name -> producer id, or list (tuple outputs)
    outputs: list = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            continue
        if node.op == "placeholder":
            if node.name in value:
                continue  # a delegate's input, bound to its outer producer
            if node.name in constants or node.name not in user_inputs:
                value[node.name] = ("weight", node.name)
                continue
            if top:
                value[node.name] = b.add_node(node, "input", None, op="input").id
            continue
        if node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            outputs = [value.get(o.name) if isinstance(o, Node) else None for o in outs]
            if top:
                for i, o in enumerate(outs):
                    if not isinstance(o, Node):
                        continue
                    out = b.as_output(b.add_node(o, "output", None, op="output"), i)
                    b.link(value.get(o.name), out.id)
            continue
        if is_getitem(node):
            src = value.get(node.args[0].name) if isinstance(node.args[0], Node) else None
            value[node.name] = b.unpack(src, node.args[1])
            continue
        if is_delegate_call(node):
            value[node.name] = _add_delegate(b, gm, node, value, kind)
            continue
        group = b.module_group(module_stack(node.meta.get("nn_module_stack")))
        handles = handles_of(node) if handles_of is not None else None
        g = b.add_node(node, "control_flow" if _is_control_flow(node) else "op", group, handles=handles)
        if DELEGATE_PARTITION_META in node.meta:
            b.join_partition(g, node.meta[DELEGATE_PARTITION_META])
        b.link_inputs(g, [value.get(arg.name) for arg in node.all_input_nodes])
        value[node.name] = g.id
    return outputs


def _delegate_handles(lowered) -> list[int]:
    gm = lowered.original_module.graph_module
    return sorted({h for n in gm.graph.nodes for h in node_handles(n)})


def _add_delegate(b: _Builder, gm: GraphModule, node: Node, value: dict, kind: str):
    lowered = lowered_module_of(gm, node)
    backend = str(getattr(lowered, "backend_id", "delegate"))
    b.backend_color(backend)
    inputs = [value.get(a.name) if isinstance(a, Node) else None for a in node.args[1:]]
    original = getattr(lowered, "original_module", None)
    if kind == "runtime" or original is None:
        # one instruction: the whole partition, with the handles of everything it covers
        handles = _delegate_handles(lowered) if original is not None else node_handles(node)
        stacks = []
        if original is not None:
            stacks = [module_stack(n.meta.get("nn_module_stack"))
                      for n in original.graph_module.graph.nodes if n.op == "call_function"]
        group = b.common_parent([b.module_group(s) for s in stacks]) if stacks else None
        g = b.add_node(node, "delegate", group, op=f"delegate: {backend}", handles=handles, backend=backend)
        for src in inputs:
            b.link(src, g.id)
        n_out = len(node.meta.get("val") or ()) if isinstance(node.meta.get("val"), (list, tuple)) else 1
        return [g.id] * max(n_out, 1)
    inner_gm = original.graph_module
    sig_inputs = list(original.graph_signature.user_inputs)
    bound = {name: src for name, src in zip(sig_inputs, inputs)}
    first = len(b.model.nodes)
    outputs = _add_graph(b, inner_gm, original, kind, value_of=bound, top=False)
    b.close_partition(first, node.args[0].name if isinstance(node.args[0], Node) else str(node.args[0]), backend)
    return outputs


def _graph_module(program) -> tuple[GraphModule, ExportedProgram | None]:
    if isinstance(program, ExportedProgram):
        return program.graph_module, program
    if isinstance(program, GraphModule):
        return program, None
    raise TypeError(f"expected an ExportedProgram or a GraphModule, got {type(program).__name__}")


def build_graph_model(program, kind: str = "edge", *, title: str | None = None, method: str = "forward",
                      handles_of=None) -> GraphModel:
    """The drawable graph of an ExportedProgram (or GraphModule) of the given kind (see module doc)."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"graph kind must be one of {GRAPH_KINDS}, got {kind!r}")
    gm, ep = _graph_module(program)
    b = _Builder(title or f"{kind} graph of {method!r}", kind, method)
    _add_graph(b, gm, ep, kind, handles_of=handles_of)
    return b.finish()


def aten_handle_lookup(edge_program) -> dict[tuple[str, str], list[int]]:
    """(torch call id, module path) -> debug handles of the edge nodes made from that call."""
    gm, _ = _graph_module(edge_program)
    table: dict[tuple[str, str], set[int]] = {}

    def visit(g: GraphModule):
        for node in g.graph.nodes:
            if is_delegate_call(node):
                lowered = lowered_module_of(g, node)
                if lowered is not None and getattr(lowered, "original_module", None) is not None:
                    visit(lowered.original_module.graph_module)
                continue
            fn = node.meta.get("torch_fn")
            if fn and node_handles(node):
                stack = module_stack(node.meta.get("nn_module_stack"))
                key = (str(fn[0]), stack[-1][0] if stack else "")
                table.setdefault(key, set()).update(node_handles(node))

    visit(gm)
    return {k: sorted(v) for k, v in table.items()}


def aten_handles_of(edge_program):
    """A handles_of(node) function for the ATen graph: handles of the edge nodes of the same torch call."""
    table = aten_handle_lookup(edge_program)

    def handles_of(node: Node) -> list[int]:
        fn = node.meta.get("torch_fn")
        if not fn:
            return node_handles(node)
        stack = module_stack(node.meta.get("nn_module_stack"))
        return table.get((str(fn[0]), stack[-1][0] if stack else ""), [])

    return handles_of
