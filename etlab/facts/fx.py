"""What an FX node says about its operator, and walks over graphs and their nested graphs.

One helper per fact, used by the compiler, the ETRecord, the analyses and the views alike, so that
a node reads the same everywhere (its source line and modules: `etlab.facts.source`).

- `op_name(target)` is torch's dotted name ("aten.convolution.default", "executorch_call_delegate",
  "getitem"); `op_type_of(node)` is upstream's op type ("aten_convolution_default"), the name
  torch.fx gives a node of that target.
"""

from __future__ import annotations

import copy
import operator
import re
from collections.abc import Iterator

import torch
from torch.fx import GraphModule, Node

# --- operators ----------------------------------------------------------------------------------


def op_name(target) -> str:
    """torch's dotted name of a call target: 'aten.add.Tensor', 'cond', 'getitem', 'my_module.fn'."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name()
    name = getattr(target, "__name__", None)
    module = getattr(target, "__module__", None)
    if name and module and module not in ("builtins", "_operator", "operator", "math"):
        return f"{module}.{name}"
    return str(name or target)


def node_op_name(node: Node) -> str:
    """The operator of a call_function node (`op_name`), else the node kind ('placeholder', ...)."""
    return op_name(node.target) if node.op == "call_function" else node.op


def op_type_of(node: Node) -> str:
    """Upstream's operator type of a call_function node: `aten.convolution.default` ->
    `aten_convolution_default`, `aten.add.Tensor` -> `aten_add_tensor`, `operator.getitem` -> `getitem`.

    That is torch.fx's name for a node of that target (snake case, a Python identifier) without a
    numeric suffix, as upstream's edge graphs name their nodes.
    """
    if not isinstance(node, Node):
        raise TypeError(f"op_type_of takes a torch.fx Node, got {type(node).__name__}")
    target = node.target
    if node.op == "call_function" and not isinstance(target, torch._ops.OpOverload):
        raw = getattr(target, "__name__", None) or str(target)
    else:
        raw = str(target)
    name = re.sub(r"(?<=[a-z])([A-Z])", r"_\1", raw).lower()
    return re.sub(r"_\d+$", "", re.sub(r"[^0-9a-zA-Z_]+", "_", name))


def is_getitem(node: Node) -> bool:
    """Whether a node only picks one output of a multi-output node (no kernel runs for it)."""
    return node.op == "call_function" and node.target is operator.getitem


# --- graph walks --------------------------------------------------------------------------------


def graph_modules(gm: GraphModule) -> dict[str, GraphModule]:
    """gm ("") and every GraphModule under it (control-flow branches) by dotted module path."""
    return {path: mod for path, mod in gm.named_modules() if isinstance(mod, GraphModule)}


def all_graph_modules(gm: GraphModule) -> Iterator[GraphModule]:
    """gm and every GraphModule nested under it (control-flow branches), outermost first."""
    yield from graph_modules(gm).values()


def submodules_of(node: Node, root: torch.nn.Module) -> list[GraphModule]:
    """The GraphModules a control-flow node calls (its get_attr arguments)."""
    subs = []
    for arg in node.args:
        if isinstance(arg, Node) and arg.op == "get_attr":
            mod = getattr(root, arg.target, None)
            if isinstance(mod, GraphModule):
                subs.append(mod)
    return subs


def copy_graph_module(gm: GraphModule, val_map: dict | None = None, *, lazy: bool = False) -> GraphModule:
    """A structural copy: new nodes (metadata dicts copied shallowly), shared tensors, copied subgraphs.

    Node names can change (fx renames nodes that shadow builtins, e.g. 'input'); `val_map` receives
    old node -> new node. `lazy`: the copy generates its Python code on first use (call, `.code`)
    instead of now; for a compiler pass that rewrites the copy and never runs it, that saves the
    code generation of a whole graph (tens of ms on a large one).
    """
    graph = torch.fx.Graph()
    val_map = {} if val_map is None else val_map
    out = graph.graph_copy(gm.graph, val_map)
    old_out = gm.graph.output_node()
    new_out = graph.output(out)
    new_out.meta = copy.copy(old_out.meta)
    root = torch.nn.Module()
    for name, child in gm.named_children():
        setattr(root, name, copy_graph_module(child, lazy=lazy) if isinstance(child, GraphModule) else child)
    for node in graph.nodes:
        if node.op == "get_attr" and not hasattr(root, node.target):
            _set_nested(root, node.target, _get_nested(gm, node.target))
    if lazy:
        from torch.fx._lazy_graph_module import _LazyGraphModule

        return _LazyGraphModule(root, graph)
    return GraphModule(root, graph)


def _get_nested(obj, target: str):
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _set_nested(obj, target: str, value) -> None:
    *path, last = target.split(".")
    for part in path:
        if not hasattr(obj, part):
            setattr(obj, part, torch.nn.Module())
        obj = getattr(obj, part)
    setattr(obj, last, value)
