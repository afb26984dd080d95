"""What the .etrecord and .pte viewers show about delegation: per backend what it took, and for the
nodes left out, why, grouped by category with counts (etlab.devtools.get_delegation_info's table).

A .pte holds no graph, so its viewer shows this from an ETRecord of the same program beside it."""

from __future__ import annotations

# Nodes listed per category; the count is always the whole group's.
MAX_NODES_PER_GROUP = 200


def delegation_view(record, method: str | None = None) -> dict | None:
    """JSON-ready delegation facts of one method of an ETRecord (the first when `method` is not one of
    its methods), or None when it records no method."""
    from etlab.devtools import get_delegation_info

    methods = list(record.methods)
    if not methods:
        return None
    method = method if method in methods else methods[0]
    info = get_delegation_info(record.edge_program(method))

    def node(n) -> dict:
        return {"node": n.node, "op": n.op, "reason": n.reason, "hint": n.hint, "module": n.module,
                "source": n.source, "handle": n.debug_handle}

    return {
        "method": method,
        "delegated_nodes": info.num_delegated_nodes,
        "left_out": sum(1 for n in info.nodes if not n.delegated),
        "backends": [{"backend": b.backend_id, "partitions": b.num_subgraphs, "nodes": b.num_nodes}
                     for b in sorted(info.delegation_by_backend.values(), key=lambda b: b.backend_id)],
        "groups": [{"category": g.category, "count": g.count, "nodes": [node(n) for n in g.nodes[:MAX_NODES_PER_GROUP]]}
                   for g in info.refusal_groups()],
        "unexplained": [node(n) for n in info.unexplained[:MAX_NODES_PER_GROUP]],
        "unexplained_count": len(info.unexplained),
    }
