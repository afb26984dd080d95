"""`torch.autocast(..., enabled=False)` regions, inlined.

torch.export keeps an autocast region as a `wrap_with_autocast` call of a submodule (timm's EfficientViT
runs its ReLU linear attention under `torch.autocast(device_type, enabled=False)` so that it stays in
float32). A disabled region computes exactly what its ops say (the casts it needs are in its graph),
so outside any enabled region its ops are simply spliced in place of the call, as torch's own re-trace
does. An enabled region would change the dtypes its ops compute in: a CompileError says so.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from etlab.compiler._errors import CompileError


def _is_autocast(node: Node) -> bool:
    return node.op == "call_function" and node.target is torch.ops.higher_order.wrap_with_autocast


def inline_disabled_autocast(gm: GraphModule) -> bool:
    """Splices the body of every `wrap_with_autocast(enabled=False)` call of gm's graph in its place;
    returns whether there was one."""
    found = False
    for node in list(gm.graph.nodes):
        if not _is_autocast(node):
            continue
        device, dtype, enabled, _cache, body, *operands = node.args
        if enabled:
            raise CompileError.at(node, f"runs under torch.autocast({device!r}, dtype={dtype}): the runtime computes "
                                        "in the dtypes the graph names; cast explicitly instead of autocast")
        _inline(gm, node, getattr(gm, body.target), operands)
        if not body.users:
            gm.graph.erase_node(body)
            delattr(gm, body.target)
        found = True
    return found


def _inline(gm: GraphModule, node: Node, body: GraphModule, operands: list) -> None:
    if any(n.op == "get_attr" or _is_autocast(n) for n in body.graph.nodes):
        raise CompileError.at(node, "an autocast region holding submodules or parameters of its own is not "
                                    "supported")
    env: dict[Node, object] = dict(zip([n for n in body.graph.nodes if n.op == "placeholder"], operands))
    results: tuple = ()
    with gm.graph.inserting_before(node):
        for inner in body.graph.nodes:
            if inner.op == "placeholder":
                continue
            if inner.op == "output":
                results = tuple(env.get(o, o) if isinstance(o, Node) else o for o in inner.args[0])
                break
            env[inner] = gm.graph.node_copy(inner, env.__getitem__)
    for user in list(node.users):
        if user.target is not operator.getitem:
            raise CompileError.at(node, "the result of an autocast region is used other than by indexing")
        user.replace_all_uses_with(results[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)
