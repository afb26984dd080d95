"""In-place and out= ops -> functional ops, without re-tracing.

torch.export's training IR keeps in-place ops (the KV cache's `index_copy_` on a buffer) and out=
calls (`torch.mul(a, x, out=z)`: `aten.mul.out`), and leaves `graph_signature.buffers_to_mutate`
empty. Each such op is replaced by its functional variant (`mul_` and `mul.out` -> `mul.Tensor`: the
overload of the same operator with the same arguments minus `out`); later readers of the written
tensor read the new value instead, and a written placeholder (buffer or user input) is reported so
the caller can add a mutation output to the signature.

A write through a chain of slices, selects and aliases (`mask[a:b, c:d] = k`, Swin's shifted-window
mask; `cache[:, pos] = x`; GhostNet's `out[:, :n] += shortcut` where n is all channels: an alias)
becomes the functional op on the view, then one `slice_scatter`/`select_scatter` per view back to the
base, whose later readers read the scattered result. Any other mutation through an alias (a view read
again after the write, a `view`/`permute` in the chain) cannot be rewritten node by node: `NeedsRetrace`
sends the program through torch's full functionalization instead.
"""

from __future__ import annotations

import torch
from torch._ops import OpOverload
from torch.fx import GraphModule, Node

from etlab.compiler._decompose import NeedsRetrace
from etlab.compiler._graph import call


def _out_args(op: OpOverload) -> list[str]:
    """Names of the keyword-only arguments an out= variant writes (`out`, or `values`/`indices`)."""
    return [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


def _functional_of_out(op: OpOverload) -> OpOverload | None:
    """The overload of op's operator that takes op's arguments minus the out ones and writes nothing
    (`add.out(self, other, *, alpha, out)` -> `add.Tensor(self, other, *, alpha)`)."""
    outs = set(_out_args(op))
    want = [(a.name, str(a.type), a.kwarg_only) for a in op._schema.arguments if a.name not in outs]
    packet = getattr(getattr(torch.ops, op.namespace), op._schema.name.split("::")[-1], None)
    for name in packet.overloads() if packet is not None else ():
        cand = getattr(packet, name)
        schema = cand._schema
        if any(a.alias_info is not None for a in [*schema.arguments, *schema.returns]):
            continue
        if [(a.name, str(a.type), a.kwarg_only) for a in schema.arguments] == want:
            return cand
    return None


def _same_dtype_as_inputs(node: Node, base: Node) -> bool:
    """Whether out= writes in the dtype its tensor inputs have (else it casts: left to torch's functionalization)."""
    want = getattr(base.meta.get("val"), "dtype", None)
    ins = [getattr(a.meta.get("val"), "dtype", None) for a in node.all_input_nodes if a is not base]
    return want is not None and all(d == want for d in ins if d is not None)


def _functional_call(node: Node) -> tuple[OpOverload, Node, tuple, dict] | None:
    """(functional op, the tensor written, args, kwargs) of an in-place or out= call; None for a
    functional op; NeedsRetrace where the node cannot be rewritten alone."""
    op = node.target
    idx = _mutated_arg(op)
    if idx is not None:
        base, functional, kwargs = node.args[idx], _functional_variant(op), dict(node.kwargs)
    else:
        outs = _out_args(op)
        if not outs:
            return None
        if len(outs) != 1:
            raise NeedsRetrace(f"{op} writes {len(outs)} out arguments")
        base = node.kwargs.get(outs[0])
        functional = _functional_of_out(op)
        kwargs = {k: v for k, v in node.kwargs.items() if k != outs[0]}
        if isinstance(base, Node) and not _same_dtype_as_inputs(node, base):
            raise NeedsRetrace(f"{op} casts into its out argument")
    if functional is None or not isinstance(base, Node):
        raise NeedsRetrace(f"no functional variant for {op}")
    return functional, base, node.args, kwargs


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
    """Whether gm calls an op that writes one of its arguments (in place or out=)."""
    return any(n.op == "call_function" and isinstance(n.target, OpOverload)
               and (_mutated_arg(n.target) is not None or _out_args(n.target)) for n in gm.graph.nodes)


# A view op -> (its scatter: the base with the view's elements replaced, which view arguments it takes);
# None for an alias (all of the base: the new value is the new base).
_SCATTERS = {
    torch.ops.aten.slice.Tensor: (torch.ops.aten.slice_scatter.default, 4),  # dim, start, end, step
    torch.ops.aten.select.int: (torch.ops.aten.select_scatter.default, 2),  # dim, index
    torch.ops.aten.alias.default: (None, 0),
}


def _view_chain(view: Node) -> list[Node] | None:
    """The slices/selects from a non-view tensor down to `view` (base side first), or None when another
    kind of view is on the way."""
    chain = []
    node = view
    while node.op == "call_function" and is_view_op(node.target):
        if node.target not in _SCATTERS:
            return None
        chain.append(node)
        node = node.args[0]
    return chain[::-1]


def _aliases_read_later(root: Node, written: Node | None, writer: Node, order: dict[Node, int]) -> bool:
    """Whether a view of `root` defined before `writer` is read after it (it would need the new value:
    re-deriving views is torch's functionalization's job). The written view itself is exempt: its later
    readers read the functional result."""
    after = order[writer]
    stack, seen = [root], set()
    while stack:
        for user in stack.pop().users:
            if user in seen or user.op != "call_function" or not is_view_op(user.target):
                continue
            seen.add(user)
            if order.get(user, -1) > after:
                continue  # defined after the write: reads the new base, or its parent is flagged below
            if user is not written and any(order.get(u, -1) > after for u in user.users):
                return True
            stack.append(user)
    return False


def _scatter_back(gm: GraphModule, chain: list[Node], value: Node, like: Node, order: dict[Node, int]) -> Node:
    """The chain's base with `value` (the new contents of the chain's last view) written in: one scatter
    per view, innermost first."""
    for view in reversed(chain):
        scatter, n_args = _SCATTERS[view.target]
        if scatter is None:
            continue
        parent = view.args[0]
        args = (parent, value, *view.args[1:1 + n_args])
        val = parent.meta.get("val")
        if val is not None:
            sizes = [a.meta["val"] if isinstance(a, Node) else a for a in view.args[1:1 + n_args]]
            with val.fake_mode:
                val = scatter(val, value.meta["val"], *sizes)
        value = call(gm.graph, scatter, args, like=like, val=val)
        order[value] = order[like]
    return value


# In-place dropouts: with train=False they leave their input as it is (torchvision's EfficientNet head
# runs Dropout(inplace=True) on a flattened view).
_INPLACE_DROPOUTS = frozenset({torch.ops.aten.dropout_.default, torch.ops.aten.feature_dropout_.default,
                               torch.ops.aten.alpha_dropout_.default, torch.ops.aten.feature_alpha_dropout_.default})


def _drop_eval_dropout(node: Node) -> bool:
    """Removes an in-place dropout that does not train (its result is its input); False otherwise."""
    if node.target not in _INPLACE_DROPOUTS:
        return False
    train = node.kwargs.get("train", node.args[2] if len(node.args) > 2 else None)
    if train is not False:
        return False
    node.replace_all_uses_with(node.args[0])
    node.graph.erase_node(node)
    return True


def functionalize(gm: GraphModule) -> dict[Node, Node]:
    """Rewrites gm's in-place and out= ops; returns {mutated placeholder: its final value}."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    latest: dict[Node, Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, OpOverload) or _drop_eval_dropout(node):
            continue
        call_info = _functional_call(node)
        if call_info is None:
            continue
        functional, base, args, kwargs = call_info
        chain: list[Node] = []
        if base.op == "call_function" and is_view_op(base.target):
            chain = _view_chain(base) or []
            if not chain or _aliases_read_later(chain[0].args[0], base, node, order):
                raise NeedsRetrace(f"{node.target} writes through a view")
        elif _aliases_read_later(base, None, node, order):
            raise NeedsRetrace(f"{node.target} writes a tensor whose views are read afterwards")
        with gm.graph.inserting_before(node):
            new = call(gm.graph, functional, args, kwargs, like=node, val=node.meta.get("val"))
            order[new] = order[node]
            _replace_later_uses(base, new, node, order)
            final = new
            if chain:
                base = chain[0].args[0]
                final = _scatter_back(gm, chain, new, node, order)
                _replace_later_uses(base, final, node, order)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        root = base
        while root in latest.values() and root.op != "placeholder":
            root = next(k for k, v in latest.items() if v is root)
        latest[root] = final
    return {k: v for k, v in latest.items() if k.op == "placeholder"}


def _replace_later_uses(old: Node, new: Node, writer: Node, order: dict[Node, int]) -> None:
    """Nodes after `writer` that read `old` read `new` instead (the value after the write)."""
    for user in list(old.users):
        if user is not new and user is not writer and order.get(user, -1) > order[writer]:
            user.replace_input_with(old, new)
