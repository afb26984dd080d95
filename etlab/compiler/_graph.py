"""Small FX helpers shared by the compiler passes: node creation with inherited metadata, submodule walks."""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

# Metadata a node created by a pass inherits from the node it replaces.
INHERITED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "debug_handle", "from_node")


def inherit_meta(new: Node, old: Node, val=None) -> Node:
    """Copies the metadata a replacement node must keep (stack trace, module stack, debug handle...) from `old` to
    `new`, with `val` when given; returns `new`."""
    for key in INHERITED_META:
        if key in old.meta:
            new.meta[key] = old.meta[key]
    if val is not None:
        new.meta["val"] = val
    return new


def call(graph: torch.fx.Graph, target, args, kwargs=None, *, like: Node, val=None) -> Node:
    """A new call_function node (inserted at the graph's current insert point) with `like`'s metadata."""
    node = graph.call_function(target, tuple(args), dict(kwargs or {}))
    return inherit_meta(node, like, val)


def getitem(graph: torch.fx.Graph, source: Node, index: int, *, val=None) -> Node:
    """A getitem node taking output `index` of a multi-output node, with the source's metadata."""
    return call(graph, operator.getitem, (source, index), like=source, val=val)


def fake_mode_of(gm: GraphModule):
    """The FakeTensorMode of an exported graph (from its placeholder values), or None."""
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def fake_empty(fake_mode, shape, stride, dtype, device, offset: int = 0, requires_grad: bool = False):
    """A fake tensor of static `shape`/`stride` in `fake_mode`: a meta tensor wrapped in a FakeTensor.
    Same value as `torch.empty_strided` under the mode, without a fake-mode dispatch (cache key,
    output reconstruction), which dominated the passes that make thousands of them."""
    from torch._subclasses.fake_tensor import FakeTensor

    base = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if offset:
        base = base.as_strided(shape, stride, offset)
    fake = FakeTensor(fake_mode, base, device)
    return fake.requires_grad_(True) if requires_grad else fake


def is_static(val) -> bool:
    """True when a tensor value's shape has no symbols."""
    return all(isinstance(s, int) for s in val.shape)


def tensor_vals(val) -> list[torch.Tensor]:
    """The tensors in a node value (a tensor, or a tuple/list of them)."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []
