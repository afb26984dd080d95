"""In-place ops -> functional ops, without re-tracing.

torch.export's training IR keeps in-place ops (the KV cache's `index_copy_` on a buffer) and leaves
`graph_signature.buffers_to_mutate` empty. Each in-place op is replaced by its functional variant;
later readers of the mutated tensor read the new value instead, and a mutated placeholder (buffer
or user input) is reported so the caller can add a mutation output to the signature.

Mutation through an alias (a view of a buffer written in place) cannot be rewritten node by node:
`NeedsRetrace` sends the program through torch's full functionalization instead.
"""

from __future__ import annotations

import torch
from torch._ops import OpOverload
from torch.fx import GraphModule, Node

from etlab.compiler._decompose import NeedsRetrace
from etlab.compiler._graph import call


def _mutated_arg(op: OpOverload) -> int | None:
    """Index of the argument an op writes in place (None for functional ops and out= variants)."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            return None if arg.kwarg_only else i
    return None


def _functional_variant(op: OpOverload) -> OpOverload | None:
    name = op._schema.name.split("::")[-1]
    if not name.endswith("_"):
        return None
    packet = getattr(getattr(torch.ops, op.namespace), name[:-1], None)
    if packet is None:
        return None
    return getattr(packet, op._overloadname, None)


def is_view_op(op) -> bool:
    """An op whose result aliases an input without writing it (view, permute, split, ...)."""
    if not isinstance(op, OpOverload):
        return False
    rets = op._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def has_mutation(gm: GraphModule) -> bool:
    return any(n.op == "call_function" and isinstance(n.target, OpOverload) and _mutated_arg(n.target) is not None
               for n in gm.graph.nodes)


def functionalize(gm: GraphModule) -> dict[Node, Node]:
    """Rewrites gm's in-place ops; returns {mutated placeholder: its final value}."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    latest: dict[Node, Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        idx = _mutated_arg(node.target)
        if idx is None:
            continue
        base = node.args[idx]
        functional = _functional_variant(node.target)
        if functional is None or not isinstance(base, Node):
            raise NeedsRetrace(f"no functional variant for {node.target}")
        if base.op == "call_function" and is_view_op(base.target):
            raise NeedsRetrace(f"{node.target} writes through a view")
        if any(is_view_op(u.target) for u in base.users if u.op == "call_function"):
            raise NeedsRetrace(f"{node.target} writes a tensor that has views")
        with gm.graph.inserting_before(node):
            new = call(gm.graph, functional, node.args, node.kwargs, like=node, val=node.meta.get("val"))
        order[new] = order[node]
        for user in list(base.users):
            if user is not new and user is not node and order.get(user, -1) > order[node]:
                user.replace_input_with(base, new)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        root = base
        while root in latest.values() and root.op != "placeholder":
            root = next(k for k, v in latest.items() if v is root)
        latest[root] = new
    return {k: v for k, v in latest.items() if k.op == "placeholder"}
