"""Edge-dialect rewrites after decomposition: views to copies, dim-order ops, scalars to tensors, fresh outputs."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch._ops import OpOverload
from torch.fx import GraphModule, Node

from etlab.compiler import _dim_order_ops
from etlab.compiler._functionalize import is_view_op
from etlab.compiler._graph import call
from etlab.compiler._shapes import dim_order_of

aten = torch.ops.aten

# View ops whose functional copy is not simply "<name>_copy" with the same overload.
_COPY_OF = {aten._unsafe_view.default: aten.view_copy.default, aten.reshape.default: aten.view_copy.default}


def copy_variant(op: OpOverload) -> OpOverload | None:
    """The functional `*_copy` op of a view op (aten.view.default -> aten.view_copy.default)."""
    if op in _COPY_OF:
        return _COPY_OF[op]
    name = op._schema.name.split("::")[-1]
    packet = getattr(getattr(torch.ops, op.namespace), f"{name}_copy", None)
    return getattr(packet, op._overloadname, None) if packet is not None else None


def _contiguous_like(val, fake_mode):
    if isinstance(val, torch.Tensor):
        if val.is_contiguous():
            return val
        with fake_mode:
            return torch.empty(val.shape, dtype=val.dtype)
    if isinstance(val, (list, tuple)):
        return type(val)(_contiguous_like(v, fake_mode) for v in val)
    return val


def views_to_copies(gm: GraphModule, fake_mode) -> None:
    """View ops become their *_copy ops, whose results are fresh contiguous tensors."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_view_op(node.target):
            replacement = copy_variant(node.target)
            if replacement is not None:
                node.target = replacement
                node.meta["val"] = _contiguous_like(node.meta.get("val"), fake_mode)
                for user in node.users:
                    if user.target is operator.getitem:
                        user.meta["val"] = node.meta["val"][user.args[1]]


def to_dim_order_ops(gm: GraphModule) -> None:
    """aten.clone / aten._to_copy -> dim_order_ops._clone_dim_order / _to_dim_order_copy."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.clone.default:
            node.target = _dim_order_ops.clone_dim_order
            node.kwargs = {"dim_order": dim_order_of(node.meta["val"])}
        elif node.target is aten._to_copy.default:
            kw = dict(node.kwargs)
            kw.pop("memory_format", None)
            kw.pop("layout", None)
            kw.pop("device", None)
            kw.pop("pin_memory", None)
            kw["dim_order"] = dim_order_of(node.meta["val"])
            node.target = _dim_order_ops.to_dim_order_copy
            node.kwargs = kw


def scalars_to_tensors(gm: GraphModule, make_constant: Callable[[torch.Tensor, Node], Node]) -> None:
    """Python numbers passed where an op's schema wants a Tensor become 0-dim constant tensors.

    The runtime kernels (add.out, mul.out, ...) take tensors there; `make_constant(value, user)`
    returns a node holding the constant.
    """
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        schema_args = node.target._schema.arguments
        args = list(node.args)
        changed = False
        for i, value in enumerate(args):
            if i < len(schema_args) and isinstance(schema_args[i].type, torch.TensorType) and \
                    isinstance(value, (bool, int, float)):
                args[i] = make_constant(torch.tensor(value), node)
                changed = True
        if changed:
            node.args = tuple(args)


def fresh_outputs(gm: GraphModule, first_user_output: int) -> None:
    """Every user output gets its own tensor: an input, a constant or a repeated output is copied."""
    out_node = gm.graph.output_node()
    outs = list(out_node.args[0]) if isinstance(out_node.args[0], (tuple, list)) else [out_node.args[0]]
    seen: set[Node] = set()
    for i in range(first_user_output, len(outs)):
        o = outs[i]
        if not isinstance(o, Node):
            continue
        if o.op in ("placeholder", "get_attr") or o in seen:
            with gm.graph.inserting_before(out_node):
                outs[i] = call(gm.graph, _dim_order_ops.clone_dim_order, (o,),
                               {"dim_order": dim_order_of(o.meta["val"])}, like=o, val=o.meta.get("val"))
        seen.add(outs[i])
    out_node.args = (type(out_node.args[0])(outs) if isinstance(out_node.args[0], (tuple, list)) else outs[0],)


def remove_dead_code(gm: GraphModule) -> None:
    """Drops unused pure nodes (the graph's own DCE keeps ops whose schema writes memory)."""
    gm.graph.eliminate_dead_code()
