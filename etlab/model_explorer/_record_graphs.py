"""An ETRecord file's ATen and Edge graphs drawn from their torch.export JSON, without rebuilding them.

`etlab.visualizer.build_graph_model` draws a torch.fx graph; on an ETRecord that first means
rebuilding each ExportedProgram with torch (11 s for a 5,000-node chain, the bulk of opening it in
Model Explorer). The record's JSON already holds everything the drawing uses, and
`etlab.etrecord.record_graphs` reads it as torch.fx would hold it (`JsonProgram`). This module walks
those nodes exactly as `build_graph_model` walks fx nodes: same node ids (graph order, plumbing left
out), same module and partition groups, handles, shapes, weights and edges, so the graphs, and the
overlays keyed to their node ids, are the same (the tests hold every zoo model and upstream's files
to equality with the torch path). The delegation explainer's reasons come from the recorded
refusals; only an upstream XNNPACK graph with nodes left out without a recorded reason needs etlab's
XNNPACK rules, which read fx nodes, and so the rebuilt program (`needs_rules`).
"""

from __future__ import annotations

from etlab.etrecord import JsonNode, JsonProgram, target_op_name
from etlab.facts.source import module_stack, source_line
from etlab.visualizer import GraphModel, GraphModelBuilder, GraphNode

GETITEM = "_operator.getitem"
XNNPACK = "XnnpackBackend"
TITLES = {"aten": "ATen", "edge": "Edge (lowered)"}


def _op(node: JsonNode) -> str:
    return target_op_name(node.target) if node.op == "call_function" else node.op


def node_handles(handle) -> list[int]:
    """A JSON node's debug handles (none, one or several) as a sorted list."""
    if type(handle) is int:
        return [handle]
    if isinstance(handle, list):
        return sorted({int(x) for x in handle if type(x) is int})
    return []


def _shape_facts(node: JsonNode) -> tuple[list[list], list[str], int | None]:
    vals = node.val if isinstance(node.val, list) else [node.val]
    vals = [v for v in vals if v is not None]
    if not vals:
        return [], [], None
    shapes, dtypes, total = [], [], 0
    for t in vals:
        shapes.append(list(t.dims))
        dtypes.append(t.dtype)
        if total is not None and all(isinstance(d, int) for d in t.dims):
            numel = 1
            for d in t.dims:
                numel *= d
            total += numel * t.itemsize
        else:
            total = None
    return shapes, dtypes, total


def _is_control_flow(node: JsonNode) -> bool:
    return node.target.startswith("torch.ops.higher_order.") and node.delegate is None


class _Builder(GraphModelBuilder):
    """etlab.visualizer's GraphModelBuilder over an ETRecord's JSON nodes, caching what many nodes share."""

    def __init__(self, title: str, kind: str, method: str):
        super().__init__(title, kind, method)
        self.sources: dict[str, str] = {}  # stack trace -> its source line (a module's nodes share one trace)
        self.stacks: dict[int, list] = {}  # id(module stack) -> its (path, type) list (shared by the reader)

    def module_stack(self, node: JsonNode) -> list[tuple[str, str]]:
        key = id(node.module_stack)
        if key not in self.stacks:
            self.stacks[key] = module_stack(node.module_stack)
        return self.stacks[key]

    def source_line(self, trace: str) -> str:
        if trace not in self.sources:
            self.sources[trace] = source_line(trace)
        return self.sources[trace]

    def add_node(self, node: JsonNode, kind: str, group: str | None, *, op: str | None = None,
                 handles: list[int] | None = None, backend: str | None = None) -> GraphNode:
        shapes, dtypes, nbytes = _shape_facts(node)
        stack = self.module_stack(node)
        return self.append(GraphNode(
            id=len(self.model.nodes), name=node.name, kind=kind, op=op or _op(node), group=group,
            handles=node_handles(node.debug_handle) if handles is None else handles, shapes=shapes, dtypes=dtypes,
            bytes=nbytes, module=stack[-1][0] if stack else "", module_type=stack[-1][1] if stack else "",
            source=self.source_line(node.stack_trace), stack_trace=node.stack_trace, backend=backend))


def _add_graph(b: _Builder, program: JsonProgram, value_of: dict | None = None, top: bool = True,
               handles_of=None, partitions: dict | None = None) -> list:
    """Adds the program's nodes (as `_graph_model._add_graph` adds fx nodes); returns its outputs' producers."""
    value: dict[str, object] = dict(value_of or {})
    by_name = {n.name: n for n in program.nodes}
    outputs: list = []
    for node in program.nodes:
        if node.op == "placeholder":
            if node.name in value:
                continue
            if node.name not in program.user_inputs:
                value[node.name] = ("weight", node.name)
                continue
            if top:
                value[node.name] = b.add_node(node, "input", None, op="input").id
            continue
        if node.op == "output":
            outputs = [value.get(o) if o is not None else None for o in node.outputs]
            if top:
                for i, o in enumerate(node.outputs):
                    if o is None or o not in by_name:
                        continue
                    out = b.as_output(b.add_node(by_name[o], "output", None, op="output"), i)
                    b.link(value.get(o), out.id)
            continue
        if node.target == GETITEM:
            value[node.name] = b.unpack(value.get(node.inputs[0]) if node.inputs else None, node.index)
            continue
        if node.delegate is not None:
            value[node.name] = _add_delegate(b, node, value)
            continue
        group = b.module_group(b.module_stack(node))
        handles = handles_of(node) if handles_of is not None else None
        g = b.add_node(node, "control_flow" if _is_control_flow(node) else "op", group, handles=handles)
        partition = (partitions or {}).get(node.name)
        if partition is not None:
            b.join_partition(g, partition)
        b.link_inputs(g, [value.get(arg) for arg in node.inputs])
        value[node.name] = g.id
    return outputs


def _add_delegate(b: _Builder, node: JsonNode, value: dict):
    d = node.delegate
    b.backend_color(d.backend)
    inputs = [value.get(a) if a is not None else None for a in node.operands]
    original = d.original
    sig_inputs = [n.name for n in original.nodes if n.op == "placeholder" and n.name in original.user_inputs]
    bound = dict(zip(sig_inputs, inputs))
    first = len(b.model.nodes)
    outputs = _add_graph(b, original, value_of=bound, top=False)
    b.close_partition(first, d.attr, d.backend)
    return outputs


def build_json_graph_model(program: JsonProgram, kind: str, *, method: str, handles_of=None,
                           partitions: dict | None = None) -> GraphModel:
    """The GraphModel `build_graph_model(<the rebuilt program>, kind, title=..., method=method)` gives."""
    b = _Builder(TITLES[kind], kind, method)
    _add_graph(b, program, handles_of=handles_of, partitions=partitions)
    return b.finish()


def _programs_under(program: JsonProgram):
    yield program
    for n in program.nodes:
        if n.delegate is not None:
            yield from _programs_under(n.delegate.original)


def aten_handles_of(edge: JsonProgram):
    """handles_of(node) for the ATen graph: the handles of the edge nodes made by the same torch call
    in the same module (`visualizer._graph_model.aten_handles_of`)."""
    table: dict[tuple[str, str], set[int]] = {}
    paths: dict[int, str] = {}  # id(module stack) -> innermost module path (the reader shares a module's stack)

    def module_of(node: JsonNode) -> str:
        key = id(node.module_stack)
        if key not in paths:
            stack = module_stack(node.module_stack)
            paths[key] = stack[-1][0] if stack else ""
        return paths[key]

    for program in _programs_under(edge):
        for node in program.nodes:
            if node.delegate is not None or not node.torch_fn or not node_handles(node.debug_handle):
                continue
            table.setdefault((node.torch_fn[0], module_of(node)), set()).update(node_handles(node.debug_handle))

    def handles_of(node: JsonNode) -> list[int]:
        if not node.torch_fn:
            return node_handles(node.debug_handle)
        return sorted(table.get((node.torch_fn[0], module_of(node)), ()))

    return handles_of


def partition_marks(edge: JsonProgram, debug_handle_map: dict | None, delegate_map: dict | None) -> dict:
    """Node name -> (backend, instruction) on an edge graph recorded before lowering, as
    `etrecord._info.mark_partitions` marks the rebuilt graph (getitems follow their node)."""
    if not delegate_map or any(n.delegate is not None for n in edge.nodes):
        return {}
    owner: dict[int, tuple[str, int]] = {}
    for instruction, entry in sorted(delegate_map.items()):
        for h in node_handles(list((debug_handle_map or {}).get(instruction, []))):
            owner.setdefault(h, (str(entry.get("name")), int(instruction)))
    marks: dict[str, tuple[str, int]] = {}
    for node in edge.nodes:
        if node.op != "call_function":
            continue
        if node.debug_handle is None and node.target == GETITEM:
            if node.inputs and node.inputs[0] in marks:
                marks[node.name] = marks[node.inputs[0]]
            continue
        for h in node_handles(node.debug_handle):
            if h in owner:
                marks[node.name] = owner[h]
                break
    return marks


def explainer_rows(edge: JsonProgram, marks: dict) -> dict[str, dict[str, str]] | None:
    """Node name -> attribute rows of each node left out of delegation with a recorded reason (as
    `_export._explainer_rows` reads them off `get_delegation_info`), or None when etlab's XNNPACK
    rules must judge nodes left out without one (they read fx nodes: the caller rebuilds)."""
    backends = {n.delegate.backend for n in edge.nodes if n.delegate is not None} | {m[0] for m in marks.values()}
    out: dict[str, dict[str, str]] = {}
    unexplained = False
    for node in edge.nodes:
        if node.op != "call_function" or node.delegate is not None or node.target == GETITEM or node.name in marks:
            continue
        r = node.refusal
        if r is None:
            unexplained = True
            continue
        _backend, category, reason, hint = r
        if category and node.name not in out:
            out[node.name] = {"delegation": f"left out ({category}): {reason}",
                              **({"what to do": hint} if hint else {})}
    if unexplained and XNNPACK in backends:
        return None
    return out
