"""How much of a lowered graph runs in backends: counts per operator and per backend, and a
printout of the graph with every lowered module's own graph shown in place.

Operator types are what upstream's `get_delegation_info` reports: it strips the numeric suffix
from node names, and upstream names every edge-dialect node after its operator
(`aten_convolution_default`, `aten_add_tensor`, `getitem`). etlab keeps export's node names
(`conv2d`'s decomposition is named `convolution_default`, an undecomposed add stays `add`), so
the type is derived from the node's operator the way upstream's names are, and the two tables
line up on the same model. Like upstream, `getitem` nodes (picking one output of a multi-output
op or delegate call) are counted as non-delegated nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from etlab.facts import display
from etlab.facts.fx import op_name, op_type_of
from etlab.facts.lowered import DELEGATE_PARTITION_META, LoweredBackendModule, is_delegate_call, lowered_module_of
from etlab.facts.lowered import lowered_modules as all_lowered_modules

# Column names of get_operator_delegation_dataframe(), as upstream names them.
OCCURRENCES_IN_DELEGATED_GRAPHS = "occurrences_in_delegated_graphs"
OCCURRENCES_IN_NON_DELEGATED_GRAPHS = "occurrences_in_non_delegated_graphs"


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
    """
    gm = _as_graph_module(graph_module)
    by_op: dict[str, DelegationBreakdown] = {}
    by_backend: dict[str, BackendBreakdown] = {}

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
    return DelegationInfo(
        num_delegated_subgraphs=num_subgraphs,
        num_delegated_nodes=sum(b.delegated for b in by_op.values()),
        num_non_delegated_nodes=sum(b.non_delegated for b in by_op.values()),
        delegation_by_operator=by_op,
        delegation_by_backend=by_backend,
    )


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
    print(format_delegated_graph(graph_module), end="")
