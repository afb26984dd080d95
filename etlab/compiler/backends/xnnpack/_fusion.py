"""Which Edge nodes of a partition become part of another node's XNNPACK node.

- batch norm after a convolution (whose result nothing else reads) folds into the convolution's
  weights and bias; its `getitem(bn, 0)` then stands for the convolution's value;
- `getitem(max_pool2d_with_indices, 0)` stands for the pooling's value;
- relu, relu6/hardtanh and clamp after a convolution, a fully connected node, an add or a batch norm
  no convolution absorbed (whose result only the activation reads) become that node's output_min/max;
- hardswish as Edge decomposes it, x * clamp(x + 3, 0, 6) / 6, is one XNNHardswish of x (as
  upstream, which keeps hardswish whole): its add, clamps and mul stand for the div;
- a contiguous copy of a value the partition computes stands for that value (no XNNCopy).

A node standing for another is an *alias*; its debug handle joins the other's in the delegate's
debug-handle map, so profiling events of the fused XNNPACK node cover both Edge nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.fx import Node

from etlab.compiler.backends.xnnpack._checks import is_flattening_view, op_key, tensor_of

BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"
MAX_POOL_WITH_INDICES = "aten.max_pool2d_with_indices.default"
CONVOLUTION = "aten.convolution.default"
# Producers whose XNNPACK node takes a fused output clamp.
FUSES_ACTIVATION = {CONVOLUTION, "aten.addmm.default", "aten.mm.default", "aten.linear.default",
                    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", BATCH_NORM}
ACTIVATIONS = {"aten.relu.default", "aten.hardtanh.default", "aten.clamp.default"}
COPIES = {"dim_order_ops._clone_dim_order.default", "aten.clone.default", "aten.alias_copy.default"}


@dataclass
class FusionPlan:
    """What lowering folds into other nodes: values that alias others, clamps fused into their producers, batch norms
    folded into convolutions, N-D linears."""

    alias: dict[Node, Node] = field(default_factory=dict)  # node -> the node whose value it is
    clamp: dict[Node, tuple[float, float]] = field(default_factory=dict)  # producer -> fused (min, max)
    batch_norm: dict[Node, Node] = field(default_factory=dict)  # convolution -> batch norm folded into it
    # linear on N-D input (view -> addmm/mm -> view in Edge): the matmul -> the view giving its shape
    unflatten: dict[Node, Node] = field(default_factory=dict)
    hardswish: dict[Node, Node] = field(default_factory=dict)  # the div ending a decomposed hardswish -> x

    def absorbed_handles(self, node: Node) -> set[int]:
        """The debug handles of the nodes folded into `node`, so the delegate's events still name them."""
        handles = set()
        for alias, target in self.alias.items():
            handle = alias.meta.get("debug_handle")
            if target is node and isinstance(handle, int):
                handles.add(handle)
        return handles

    def output_of(self, node: Node, outputs: dict[Node, int]) -> Node | None:
        """The partition output that is `node`'s value (itself or an alias of it), if any."""
        for out in outputs:
            if self.alias.get(out, out) is node:
                return out
        return None


def activation_bounds(node: Node) -> tuple[float, float] | None:
    """(min, max) of a relu / hardtanh / clamp with number bounds; None for anything else."""
    key = op_key(node)
    if key == "aten.relu.default":
        return 0.0, float("inf")
    if key == "aten.hardtanh.default":
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
        high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
    elif key == "aten.clamp.default":
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
        high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    else:
        return None
    if isinstance(low, Node) or isinstance(high, Node):
        return None
    return (float("-inf") if low is None else float(low)), (float("inf") if high is None else float(high))


def plan(calls: list[Node], constants: dict[Node, torch.Tensor], outputs: set[Node]) -> FusionPlan:
    """Decides the fusions for a partition's call nodes (given its constants and outputs)."""
    p = FusionPlan()
    for node in calls:
        key = op_key(node)
        if key == BATCH_NORM:
            _plan_batch_norm(p, node, constants, outputs)
        elif key == MAX_POOL_WITH_INDICES:
            for user in node.users:
                if op_key(user) == "getitem" and user.args[1] == 0:
                    p.alias[user] = node
    for node in calls:
        if op_key(node) in ("aten.addmm.default", "aten.mm.default"):
            _plan_linear_nd(p, node, constants, outputs)
        elif op_key(node) == "aten.div.Tensor":
            _plan_hardswish(p, node, constants, outputs)
    for node in calls:
        _plan_copy(p, node, constants, outputs)
    for node in calls:
        bounds = activation_bounds(node)
        if bounds is None or node in p.alias:
            continue
        producer = p.alias.get(node.args[0], node.args[0])
        if (not isinstance(producer, Node) or producer.op != "call_function" or producer in constants
                or op_key(producer) not in FUSES_ACTIVATION or producer in p.clamp):
            continue
        if consumers(p, producer) == {node} and not _is_output(p, producer, outputs):
            p.clamp[producer] = bounds
            p.alias[node] = producer
    return p


def _plan_copy(p: FusionPlan, node: Node, constants: dict, outputs: set[Node]) -> None:
    """A contiguous copy (clone, `.contiguous()` after a transpose) of a float value the partition computes is that
    value: XNNPACK values are written once, so nothing can change either after the copy. It stays an XNNCopy when it
    reads a partition input or a constant or is a partition output (an output must be written by a node of its
    own), as upstream, which writes no node for the copies it delegates. ShuffleNet's channel shuffles and CaiT's
    heads paid one pass over the tensor each."""
    src = node.args[0] if node.args else None
    if (op_key(node) not in COPIES or node in outputs or not isinstance(src, Node) or src.op != "call_function"
            or src in constants or any(op_key(n).startswith("quantized_decomposed.") for n in [src, *node.users]
                                       if n.op == "call_function")):
        return
    t = tensor_of(node)
    if t is not None and t.dtype.is_floating_point:
        p.alias[node] = src


def _plan_linear_nd(p: FusionPlan, mm: Node, constants: dict, outputs: set[Node]) -> None:
    """view(x, [M, K]) -> addmm -> view(_, [..., N]): one fully connected node on x itself (XNNPACK
    flattens leading dims), as upstream lowers the linear it keeps whole."""
    flat = mm.args[1] if op_key(mm) == "aten.addmm.default" else mm.args[0]
    if not is_flattening_view(flat) or set(flat.users) != {mm} or flat in outputs or flat.args[0] in constants:
        return
    users = list(mm.users)
    if len(users) != 1 or op_key(users[0]) != "aten.view_copy.default" or mm in outputs:
        return
    back, x = users[0], flat.args[0]
    want = [*tensor_of(x).shape[:-1], tensor_of(mm).shape[-1]]
    if list(tensor_of(back).shape) != want:
        return
    p.alias[flat] = x
    p.alias[back] = mm
    p.unflatten[mm] = back


def _is_number(node, constants: dict, value: float) -> bool:
    t = constants.get(node) if isinstance(node, Node) else None
    return t is not None and t.numel() == 1 and float(t.reshape(-1)[0]) == value


def _plan_hardswish(p: FusionPlan, div: Node, constants: dict, outputs: set[Node]) -> None:
    """div(mul(x, clamp(add(x, 3), 0, 6)), 6), every intermediate read only by the next: XNNHardswish(x)."""
    mul = div.args[0]
    if (not _is_number(div.args[1], constants, 6.0) or div.kwargs.get("rounding_mode") is not None
            or not isinstance(mul, Node) or op_key(mul) != "aten.mul.Tensor" or set(mul.users) != {div}):
        return
    for x, clamped in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
        chain = _relu6_of_add3(clamped, x, mul, constants)
        if chain is not None and isinstance(x, Node) and x not in constants:
            break
    else:
        return
    if any(n in outputs or n in p.alias for n in [*chain, mul]):
        return
    p.hardswish[div] = x
    for n in [*chain, mul]:
        p.alias[n] = div


def _relu6_of_add3(node, x: Node, reader: Node, constants: dict) -> list[Node] | None:
    """The nodes of clamp(x + 3, 0, 6) ending at `node` (clamps/hardtanh/relu over an add of 3), or None."""
    chain, low, high = [], float("-inf"), float("inf")
    while isinstance(node, Node) and activation_bounds(node) is not None:
        if set(node.users) != {reader}:
            return None
        b_low, b_high = activation_bounds(node)
        low, high = max(low, b_low), min(high, b_high)
        chain.append(node)
        reader, node = node, node.args[0]
    if not isinstance(node, Node) or op_key(node) != "aten.add.Tensor" or set(node.users) != {reader}:
        return None
    if node.kwargs.get("alpha", 1) != 1 or (low, high) != (0.0, 6.0):
        return None
    a, b = node.args[:2]
    if not ((a is x and _is_number(b, constants, 3.0)) or (b is x and _is_number(a, constants, 3.0))):
        return None
    return [node, *chain]


def _plan_batch_norm(p: FusionPlan, bn: Node, constants: dict, outputs: set[Node]) -> None:
    items = list(bn.users)
    if not all(op_key(u) == "getitem" and u.args[1] == 0 for u in items):
        return  # statistics are read: left to the standalone rule (which refuses them)
    conv = bn.args[0]
    foldable = (isinstance(conv, Node) and op_key(conv) == CONVOLUTION and set(conv.users) == {bn}
                and conv not in outputs and conv.args[1] in constants
                and (conv.args[2] is None or conv.args[2] in constants)
                and all(a is None or a in constants for a in bn.args[1:5]))
    target = conv if foldable else bn
    if foldable:
        p.batch_norm[conv] = bn
        p.alias[bn] = conv
    for item in items:
        p.alias[item] = target


def consumers(p: FusionPlan, node: Node) -> set[Node]:
    """Nodes reading `node`'s value, directly or through its aliases (aliases themselves excluded)."""
    found, stack, seen = set(), [node], set()
    while stack:
        current = stack.pop()
        for user in current.users:
            if user in seen:
                continue
            seen.add(user)
            if p.alias.get(user) is node:
                stack.append(user)
            else:
                found.add(user)
    return found


def _is_output(p: FusionPlan, node: Node, outputs: set[Node]) -> bool:
    return any(p.alias.get(out, out) is node for out in outputs)
