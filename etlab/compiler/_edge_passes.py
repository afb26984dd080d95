"""Edge-dialect rewrites after decomposition: views to copies, dim-order ops, scalars to tensors, fresh outputs."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch._ops import OpOverload
from torch._prims_common import make_contiguous_strides_for
from torch.fx import GraphModule, Node

from etlab.compiler import _dim_order_ops
from etlab.compiler._decompose import is_edge_op
from etlab.compiler._functionalize import is_view_op
from etlab.compiler._graph import call, fake_empty, is_static
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
        if is_static(val):
            return fake_empty(fake_mode, tuple(val.shape), make_contiguous_strides_for(val.shape), val.dtype,
                              val.device)
        with fake_mode:
            return torch.empty(val.shape, dtype=val.dtype)
    if isinstance(val, (list, tuple)):
        return type(val)(_contiguous_like(v, fake_mode) for v in val)
    return val


def views_to_copies(gm: GraphModule, fake_mode) -> None:
    """View ops become their *_copy ops, whose results are fresh contiguous tensors; the layouts of
    the ops downstream are then recomputed from those (see `_refresh_layouts`)."""
    changed: set[Node] = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_view_op(node.target):
            replacement = copy_variant(node.target)
            if replacement is not None:
                node.target = replacement
                node.meta["val"] = _contiguous_like(node.meta.get("val"), fake_mode)
                changed.add(node)
                for user in node.users:
                    if user.target is operator.getitem:
                        user.meta["val"] = node.meta["val"][user.args[1]]
                        changed.add(user)
    _refresh_layouts(gm, changed, fake_mode)


def _strides(val) -> list:
    return [tuple(v.stride()) if isinstance(v, torch.Tensor) else None
            for v in torch.utils._pytree.tree_leaves(val)]


# Static-shape results of _refresh_layouts' fake re-runs, by (op, argument metadata): a transformer
# with 12 identical blocks re-runs each op once. Same key and value format as _decompose's cache.
_LAYOUT_CACHE: dict = {}
_LAYOUT_CACHE_LIMIT = 4096


def _refresh_layouts(gm: GraphModule, changed: set[Node], fake_mode) -> None:
    """Recomputes the fake value of every op fed by a node whose layout changed, in graph order, and
    goes on downstream only where the strides differ. Without this an elementwise op on a former
    transpose keeps the transposed strides, the .pte gives its output another dim order than its
    contiguous inputs, and upstream's portable kernels refuse the mix (tensors_have_same_dim_order)."""
    from etlab.compiler._decompose import _meta_of, _rebuild, _signature, fake_call

    for node in gm.graph.nodes:
        if node in changed or node.op != "call_function" or not any(a in changed for a in node.all_input_nodes):
            continue
        old = node.meta.get("val")
        if node.target is operator.getitem:
            parent = node.args[0].meta.get("val")
            new = parent[node.args[1]] if isinstance(parent, (tuple, list)) else old
        elif isinstance(node.target, OpOverload) and any(isinstance(v, torch.Tensor)
                                                         for v in torch.utils._pytree.tree_leaves(old)):
            sig = _signature(node)
            cached = _LAYOUT_CACHE.get(sig) if sig is not None else None
            if cached is not None:
                new = _rebuild(cached, fake_mode)
            else:
                try:
                    new = fake_call(node.target, node.args, node.kwargs, fake_mode)
                except Exception:  # an op fake mode cannot re-run keeps its recorded value
                    continue
                if sig is not None and len(_LAYOUT_CACHE) < _LAYOUT_CACHE_LIMIT:
                    _LAYOUT_CACHE[sig] = _meta_of(new)
        else:
            continue
        if _strides(new) != _strides(old):
            node.meta["val"] = new
            changed.add(node)


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


_FOLD_LIMIT = 1 << 16  # elements: a folded factory result is stored in the program


def fold_constant_factories(gm: GraphModule, make_constant: Callable[[torch.Tensor, Node], Node], config) -> None:
    """Non-edge ops that read no tensor (torch.triu_indices(3, 3, 1), an arange of literals) run once
    here and become constants: they have no core decomposition, and their value never changes."""
    for node in list(gm.graph.nodes):
        target = node.target
        if node.op != "call_function" or not isinstance(target, OpOverload) or is_edge_op(target, config):
            continue
        if torch.Tag.nondeterministic_seeded in target.tags:
            continue
        leaves = torch.utils._pytree.tree_leaves((node.args, node.kwargs))
        if any(isinstance(a, (Node, torch.SymInt, torch.SymFloat, torch.SymBool)) for a in leaves):
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.numel() > _FOLD_LIMIT:
            continue
        value = target(*node.args, **node.kwargs)
        node.replace_all_uses_with(make_constant(value, node))
        gm.graph.erase_node(node)


def _symbolic_scalar_tensor(value: Node, user: Node) -> Node:
    """A 0-dim tensor of a size computed at run time (`x * x.shape[1]`): scalar_tensor(value). int64
    or float64, which as 0-dim tensors promote like the Python number they replace."""
    sym = value.meta["val"]
    dtype = torch.int64 if isinstance(sym, torch.SymInt) else torch.float64
    fake_mode = next((v.fake_mode for v in (user.meta.get("val"),) if hasattr(v, "fake_mode")), None)
    with user.graph.inserting_before(user), fake_mode or torch._subclasses.fake_tensor.FakeTensorMode():
        val = torch.empty((), dtype=dtype)
        return call(user.graph, aten.scalar_tensor.default, (value,), {"dtype": dtype}, like=user, val=val)


def scalars_to_tensors(gm: GraphModule, make_constant: Callable[[torch.Tensor, Node], Node]) -> None:
    """Python numbers passed where an op's schema wants a Tensor become 0-dim constant tensors, and
    symbolic sizes there become scalar_tensor nodes.

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
            if i >= len(schema_args) or not isinstance(schema_args[i].type, torch.TensorType):
                continue
            if isinstance(value, (bool, int, float)):
                args[i] = make_constant(torch.tensor(value), node)
                changed = True
            elif isinstance(value, Node) and isinstance(value.meta.get("val"), (torch.SymInt, torch.SymFloat)):
                args[i] = _symbolic_scalar_tensor(value, node)
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
