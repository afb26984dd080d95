"""A synthetic GraphModel of any size (for responsiveness checks): blocks of ops in nested modules."""

from __future__ import annotations

from etlab.visualizer._graph_model import GraphGroup, GraphModel, GraphNode

_OPS = ["aten.linear.default", "aten.relu.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.layer_norm.default"]


def synthetic_graph_model(num_nodes: int = 5000, block_size: int = 100, *, backend_every: int = 7) -> GraphModel:
    """`num_nodes` ops in blocks "layers.i" (halves "layers.i.attn" / "layers.i.mlp"), chained with a
    skip edge every 7 ops; every `backend_every`-th block's mlp half is a delegated partition."""
    if num_nodes < 1 or block_size < 2:
        raise ValueError("synthetic_graph_model: num_nodes >= 1 and block_size >= 2")
    model = GraphModel(title=f"synthetic ({num_nodes} nodes)", kind="edge", method="forward",
                       backend_colors={"SyntheticBackend": "#9467bd"})
    groups: dict[str, GraphGroup] = {}
    for i in range(num_nodes):
        block, pos = divmod(i, block_size)
        half = "attn" if pos < block_size // 2 else "mlp"
        top, sub = f"layers.{block}", f"layers.{block}.{half}"
        groups.setdefault(top, GraphGroup(id=top, label=f"{top} (Block)", kind="module", parent=None,
                                          module_type="Block"))
        delegated = half == "mlp" and backend_every and block % backend_every == 0
        gid = f"delegate:{sub}" if delegated else sub
        groups.setdefault(gid, GraphGroup(id=gid, label=f"SyntheticBackend · {sub}" if delegated else sub,
                                          kind="delegate" if delegated else "module", parent=top,
                                          backend="SyntheticBackend" if delegated else None))
        model.nodes.append(GraphNode(id=i, name=f"op_{i}", kind="op", op=_OPS[i % len(_OPS)], group=gid,
                                     handles=[i + 1], shapes=[[1, 64]], dtypes=["float32"], bytes=256 * (1 + i % 9),
                                     module=sub, backend="SyntheticBackend" if delegated else None))
        if i:
            model.edges.append((i - 1, i))
        if i >= 7 and i % 7 == 0:
            model.edges.append((i - 7, i))
    model.groups = list(groups.values())
    return model
