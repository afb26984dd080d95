"""How much of a lowered graph runs in backends: counts per operator and per backend, and a
printout of the graph with every lowered module's own graph shown in place.

Operator types are what upstream's `get_delegation_info` reports: it strips the numeric suffix
from node names, and upstream names every edge-dialect node after its operator
(`aten_convolution_default`, `aten_add_tensor`, `getitem`). etlab keeps export's node names
(`conv2d`'s decomposition is named `convolution_default`, an undecomposed add stays `add`), so
the type is derived from the node's operator the way upstream's names are, and the two tables
line up on the same model. Like upstream, `getitem` nodes (picking one output of a multi-output
op or delegate call) are counted as non-delegated nodes.

The explainer: `DelegationInfo.nodes` has one row per operator node, delegated or not, with where it
came from (module path, source line) and, for a node left out, why: the `DelegationRefusal` its
partitioner recorded in `node.meta[DELEGATION_REFUSAL_META]`, or, on graphs lowered without that
record (upstream's XNNPACK ETRecords), what etlab's XNNPACK rules say about the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pandas as pd
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from etlab.facts import display
from etlab.facts.fx import is_getitem, op_name, op_type_of
from etlab.facts.lowered import (
    DELEGATE_PARTITION_META,
    DELEGATION_REFUSAL_META,
    REFUSAL_CATEGORIES,
    DelegationRefusal,
    LoweredBackendModule,
    is_delegate_call,
    lowered_module_of,
)
from etlab.facts.lowered import lowered_modules as all_lowered_modules
from etlab.facts.source import module_path, source_line

log = logging.getLogger(__name__)

# Column names of get_operator_delegation_dataframe(), as upstream names them.
OCCURRENCES_IN_DELEGATED_GRAPHS = "occurrences_in_delegated_graphs"
OCCURRENCES_IN_NON_DELEGATED_GRAPHS = "occurrences_in_non_delegated_graphs"

# Columns of get_node_delegation_dataframe().
NODE_COLUMNS = ["node", "op", "module", "source", "delegated", "backend", "category", "reason", "hint"]
XNNPACK_BACKEND = "XnnpackBackend"


@dataclass(frozen=True)
class NodeDelegation:
    """One operator node: where it came from, whether a backend took it, and if not, why not.

    `category`, `reason` and `hint` are those of the node's `DelegationRefusal` ("" when delegated, or
    when nothing recorded or could tell why); `backend` is the backend that took it or refused it."""

    node: str
    op: str
    module: str = ""
    source: str = ""
    delegated: bool = False
    backend: str = ""
    category: str = ""
    reason: str = ""
    hint: str = ""
    debug_handle: int | None = None

    def row(self) -> list:
        """The node's values in NODE_COLUMNS order (one row of the per-node dataframe)."""
        return [getattr(self, c) for c in NODE_COLUMNS]


@dataclass(frozen=True)
class RefusalGroup:
    """The nodes left out for one kind of reason (`category`), for the grouped views."""

    category: str
    nodes: list[NodeDelegation]

    @property
    def count(self) -> int:
        """How many nodes were left out for this reason (the whole group, even when the listed nodes are capped)."""
        return len(self.nodes)


@dataclass
class DelegationBreakdown:
    """Occurrences of one operator type inside and outside delegated subgraphs."""

    op_type: str = ""
    delegated: int = 0
    non_delegated: int = 0


@dataclass
class BackendBreakdown:
    """What one backend took: its lowered subgraphs and the call_function nodes inside them."""

    backend_id: str
    num_subgraphs: int = 0
    num_nodes: int = 0


@dataclass
class DelegationInfo:
    """Delegation statistics of one graph module (see `get_delegation_info`)."""

    num_delegated_subgraphs: int
    num_delegated_nodes: int
    num_non_delegated_nodes: int
    delegation_by_operator: dict[str, DelegationBreakdown]
    delegation_by_backend: dict[str, BackendBreakdown] = field(default_factory=dict)
    nodes: list[NodeDelegation] = field(default_factory=list)

    def _repr_html_(self) -> str | None:
        return display.html(self)  # the views register it (etlab.facts.display)

    def get_summary(self) -> str:
        """Subgraph and node counts as printable lines, then one line per backend."""
        lines = [
            f"Total delegated subgraphs: {self.num_delegated_subgraphs}",
            f"Number of delegated nodes: {self.num_delegated_nodes}",
            f"Number of non-delegated nodes: {self.num_non_delegated_nodes}",
        ]
        for b in sorted(self.delegation_by_backend.values(), key=lambda b: b.backend_id):
            lines.append(f"Backend {b.backend_id}: {b.num_subgraphs} subgraphs, {b.num_nodes} delegated nodes")
        return "\n".join(lines) + "\n"

    def get_operator_delegation_dataframe(self) -> pd.DataFrame:
        """One row per op_type (sorted) with delegated / non-delegated occurrences, then a 'Total' row."""
        columns = ["op_type", OCCURRENCES_IN_DELEGATED_GRAPHS, OCCURRENCES_IN_NON_DELEGATED_GRAPHS]
        rows = [
            (b.op_type, b.delegated, b.non_delegated)
            for b in sorted(self.delegation_by_operator.values(), key=lambda b: b.op_type)
        ]
        rows.append(("Total", sum(r[1] for r in rows), sum(r[2] for r in rows)))
        df = pd.DataFrame(rows, columns=columns)
        return df.astype({columns[1]: "int64", columns[2]: "int64"})

    def get_node_delegation_dataframe(self, delegated: bool | None = None) -> pd.DataFrame:
        """One row per operator node in graph order (`NODE_COLUMNS`): node, op, module path, source
        line, delegated, backend, and for a node left out the refusal's category, reason and hint.
        `delegated=False` keeps only the nodes left out, `True` only the delegated ones."""
        rows = [n.row() for n in self.nodes if delegated is None or n.delegated == delegated]
        return pd.DataFrame(rows, columns=NODE_COLUMNS).astype({"delegated": bool})

    def refusal_groups(self) -> list[RefusalGroup]:
        """The nodes left out with a reason, grouped by category: largest group first, then in
        REFUSAL_CATEGORIES order."""
        groups: dict[str, list[NodeDelegation]] = {}
        for n in self.nodes:
            if not n.delegated and n.category:
                groups.setdefault(n.category, []).append(n)
        rank = {c: i for i, c in enumerate(REFUSAL_CATEGORIES)}
        return [RefusalGroup(c, ns) for c, ns in sorted(groups.items(), key=lambda kv: (-len(kv[1]),
                                                                                        rank.get(kv[0], 99)))]

    @property
    def unexplained(self) -> list[NodeDelegation]:
        """Operator nodes left out for which no reason was recorded or could be derived."""
        return [n for n in self.nodes if not n.delegated and not n.category]

    def format_refusals(self, max_names: int = 8) -> str:
        """The nodes left out, grouped by category with counts, then by (op, reason): one line each
        with the hint, the nodes and the first one's source line. What `etlab info` prints."""
        groups = self.refusal_groups()
        if not groups and not self.unexplained:
            return "every operator node was delegated\n" if self.nodes else "no operator nodes\n"
        left = sum(g.count for g in groups) + len(self.unexplained)
        lines = [f"left out of delegation: {left} node(s)"]

        def names(nodes: list[NodeDelegation]) -> str:
            more = f" ... {len(nodes) - max_names} more" if len(nodes) > max_names else ""
            return ", ".join(n.node for n in nodes[:max_names]) + more

        for g in groups:
            lines.append(f"  {g.category}: {g.count} node(s)")
            same: dict[tuple[str, str, str], list[NodeDelegation]] = {}
            for n in g.nodes:
                same.setdefault((n.op, n.reason, n.hint), []).append(n)
            for (op, reason, hint), nodes in same.items():
                lines.append(f"    {len(nodes)} x {op}: {reason}")
                if hint:
                    lines.append(f"      hint: {hint}")
                where = f" (first at {nodes[0].source})" if nodes[0].source else ""
                lines.append(f"      nodes: {names(nodes)}{where}")
        if self.unexplained:
            lines.append(f"  no reason recorded: {len(self.unexplained)} node(s): {names(self.unexplained)}")
        return "\n".join(lines) + "\n"


def _as_graph_module(graph_module, what: str = "graph_module") -> GraphModule:
    if isinstance(graph_module, GraphModule):
        return graph_module
    if isinstance(graph_module, ExportedProgram):
        return graph_module.graph_module
    if callable(getattr(graph_module, "exported_program", None)):  # an Edge/Executorch program manager
        return graph_module.exported_program().graph_module
    raise TypeError(f"{what} must be a torch.fx.GraphModule, an ExportedProgram or a program manager, "
                    f"got {type(graph_module).__name__}")


def lowered_modules(graph_module) -> Iterator[tuple[str, LoweredBackendModule]]:
    """(attribute name, module) of every LoweredBackendModule the graph fetches with get_attr."""
    for path, attr, lowered in all_lowered_modules(_as_graph_module(graph_module)):
        if path == "":
            yield attr, lowered


def get_delegation_info(graph_module) -> DelegationInfo:
    """Counts delegated subgraphs and nodes of a lowered graph (e.g. after `to_backend`).

    Non-delegated nodes: the graph's call_function nodes except the delegate calls themselves
    (`getitem` included, as upstream counts it). Delegated nodes: the call_function nodes of each
    lowered module's `original_module` graph, and the nodes an upstream ETRecord's pre-lowering
    edge graph marks as taken by a delegate call (`etlab.etrecord.DELEGATE_PARTITION_META`: one
    subgraph per delegate-call instruction). Operator types: see `op_type_of`.

    `nodes` (the explainer's table) lists every operator node of the top graph and of the lowered
    modules (not getitems: they pick an output and run no kernel), with the reason recorded for each node
    left out; on a graph lowered to XNNPACK without recorded reasons, etlab's XNNPACK rules give them.
    """
    gm = _as_graph_module(graph_module)
    by_op: dict[str, DelegationBreakdown] = {}
    by_backend: dict[str, BackendBreakdown] = {}
    rows: list[NodeDelegation] = []
    left_out: list[tuple[int, Node]] = []  # (row index, node) of meta-less nodes left out

    def count(node: Node, delegated: bool) -> None:
        op_type = op_type_of(node)
        b = by_op.setdefault(op_type, DelegationBreakdown(op_type))
        if delegated:
            b.delegated += 1
        else:
            b.non_delegated += 1

    num_subgraphs = 0
    partitions: set = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and not is_delegate_call(node):
            partition = node.meta.get(DELEGATE_PARTITION_META)  # an upstream pre-lowering edge graph
            count(node, delegated=partition is not None)
            if not is_getitem(node):
                if partition is None and not isinstance(node.meta.get(DELEGATION_REFUSAL_META), DelegationRefusal):
                    left_out.append((len(rows), node))
                rows.append(_node_row(node, partition[0] if partition is not None else None))
            if partition is not None:
                backend = by_backend.setdefault(partition[0], BackendBreakdown(partition[0]))
                backend.num_nodes += 1
                if partition not in partitions:
                    partitions.add(partition)
                    backend.num_subgraphs += 1
                    num_subgraphs += 1
        lowered = lowered_module_of(gm, node) if node.op == "get_attr" else None
        if lowered is None:
            continue
        num_subgraphs += 1
        backend = by_backend.setdefault(lowered.backend_id, BackendBreakdown(lowered.backend_id))
        backend.num_subgraphs += 1
        for inner in lowered.original_module.graph.nodes:
            if inner.op == "call_function":
                count(inner, delegated=True)
                backend.num_nodes += 1
                if not is_getitem(inner):
                    rows.append(_node_row(inner, lowered.backend_id))
    if left_out and XNNPACK_BACKEND in by_backend:
        _explain_with_xnnpack_rules(rows, left_out)
    return DelegationInfo(
        num_delegated_subgraphs=num_subgraphs,
        num_delegated_nodes=sum(b.delegated for b in by_op.values()),
        num_non_delegated_nodes=sum(b.non_delegated for b in by_op.values()),
        delegation_by_operator=by_op,
        delegation_by_backend=by_backend,
        nodes=rows,
    )


def _node_row(node: Node, delegated_to: str | None) -> NodeDelegation:
    """The explainer's row of one node: delegated to `delegated_to`, or left out with its recorded refusal."""
    handle = node.meta.get("debug_handle")
    common = {"node": node.name, "op": op_name(node.target), "module": module_path(node.meta.get("nn_module_stack")),
              "source": source_line(node.meta.get("stack_trace")),
              "debug_handle": handle if isinstance(handle, int) else None}
    if delegated_to is not None:
        return NodeDelegation(**common, delegated=True, backend=delegated_to)
    refusal = node.meta.get(DELEGATION_REFUSAL_META)
    if isinstance(refusal, DelegationRefusal):
        return NodeDelegation(**common, backend=refusal.backend, category=refusal.category, reason=refusal.reason,
                              hint=refusal.hint)
    return NodeDelegation(**common)


def _xnnpack_rules() -> Callable[[Node], DelegationRefusal | None] | None:
    """etlab's XNNPACK partitioner rules (`why_unsupported`), or None where that backend is not built in."""
    try:
        from etlab.compiler.backends.xnnpack import why_unsupported
    except ImportError:
        return None
    return why_unsupported


def _explain_with_xnnpack_rules(rows: list[NodeDelegation], left_out: list[tuple[int, Node]]) -> None:
    """Fills the reason of nodes an XNNPACK lowering left out without recording why (upstream's
    programs) from etlab's XNNPACK rules; a node those rules accept is said to be so (category "other")."""
    rules = _xnnpack_rules()
    if rules is None:
        return
    for index, node in left_out:
        try:
            refusal = rules(node)
        except Exception as e:  # a rule that cannot read this node says nothing about it
            log.debug("XNNPACK rules could not judge node %s: %s", node.name, e)
            continue
        if refusal is None:
            refusal = _ACCEPTED_BY_RULES
        if isinstance(refusal, DelegationRefusal):
            r = rows[index]
            rows[index] = NodeDelegation(r.node, r.op, r.module, r.source, False, refusal.backend, refusal.category,
                                         refusal.reason, refusal.hint, r.debug_handle)


# What the explainer says of a node an XNNPACK lowering left out that etlab's XNNPACK rules accept.
_ACCEPTED_BY_RULES = DelegationRefusal(
    XNNPACK_BACKEND, "other", "the partitioner that lowered this program left it out without recording why; "
    "etlab's XNNPACK rules accept this node", "etlab's XnnpackPartitioner would consider it for delegation")


def print_delegation_info(graph_module) -> None:
    """Prints the summary and the operator table (tabulate)."""
    from tabulate import tabulate

    info = get_delegation_info(graph_module)
    print(info.get_summary())
    print(tabulate(info.get_operator_delegation_dataframe(), headers="keys", tablefmt="fancy_grid"))


# --- the graph printout -------------------------------------------------------------------------


def _fmt_arg(arg) -> str:
    if isinstance(arg, Node):
        return f"%{arg.name}"
    if isinstance(arg, (list, tuple)):
        inner = ", ".join(_fmt_arg(a) for a in arg)
        return f"[{inner}]" if isinstance(arg, list) else f"({inner}{',' if len(arg) == 1 else ''})"
    if isinstance(arg, dict):
        return "{" + ", ".join(f"{k}: {_fmt_arg(v)}" for k, v in arg.items()) + "}"
    return repr(arg)


def _fmt_node(node: Node) -> str:
    if node.op == "placeholder":
        return f"%{node.name} = placeholder"
    if node.op == "output":
        return f"return {_fmt_arg(node.args[0])}"
    if node.op == "get_attr":
        return f"%{node.name} = get_attr[{node.target}]"
    args = [_fmt_arg(a) for a in node.args] + [f"{k}={_fmt_arg(v)}" for k, v in node.kwargs.items()]
    return f"%{node.name} = {op_name(node.target)}({', '.join(args)})"


def _format_lines(gm: GraphModule, indent: str, lines: list[str]) -> None:
    for node in gm.graph.nodes:
        if node.op == "get_attr" and lowered_module_of(gm, node) is not None:
            continue  # shown where the delegate call uses it
        lines.append(indent + _fmt_node(node))
        lowered = lowered_module_of(gm, node) if is_delegate_call(node) else None
        if lowered is None:
            continue
        inner_gm = lowered.original_module.graph_module
        n_ops = sum(1 for n in inner_gm.graph.nodes if n.op == "call_function")
        lines.append(f"{indent}    # {node.args[0].name}: backend {lowered.backend_id!r}, {n_ops} delegated nodes")
        _format_lines(inner_gm, indent + "    ", lines)


def format_delegated_graph(graph_module) -> str:
    """The graph as text, each delegate call followed by its lowered module's graph (indented)."""
    gm = _as_graph_module(graph_module)
    info = get_delegation_info(gm)
    lines = [f"graph: {info.num_delegated_subgraphs} delegated subgraphs, {info.num_delegated_nodes} delegated "
             f"and {info.num_non_delegated_nodes} non-delegated nodes"]
    _format_lines(gm, "    ", lines)
    return "\n".join(lines) + "\n"


def print_delegated_graph(graph_module) -> None:
    """Prints `format_delegated_graph(graph_module)` (upstream's name for it)."""
    print(format_delegated_graph(graph_module), end="")
