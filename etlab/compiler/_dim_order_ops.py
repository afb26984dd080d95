"""The `dim_order_ops` operators the edge dialect uses (defined in `etlab.ops`, which a recorded graph
needs too)."""

from etlab.ops import clone_dim_order, to_dim_order_copy

__all__ = ["clone_dim_order", "to_dim_order_copy"]
