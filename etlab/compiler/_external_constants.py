"""Tagging weights for a delegate to store outside the .pte (upstream's `delegate_external_constants_pass_unlifted`).

    gm = torch.export.export(model, inputs).module()
    delegate_external_constants_pass_unlifted(gm, gen_tag_fn=lambda node: "model")
    ep = torch.export.export(gm, inputs)           # the tags ride on the weights' placeholders
    et = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    et.write_tensor_data_to_file(outdir)           # outdir/model.ptd holds the XNNPACK weights

The tag is `node.meta["custom"]["delegate_constant_tag"]` of each weight (a `get_attr` node of the
unlifted module, a placeholder once exported): a backend storing its constants as named data
(XNNPACK) puts a tagged weight's bytes in the .ptd named by the tag instead of the .pte. Tagging
the placeholders of an ExportedProgram directly does the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

DELEGATE_CONSTANT_TAG = "delegate_constant_tag"


@dataclass
class PassResult:
    """What the pass returns, as upstream's passes do: the module and whether any node was tagged."""

    graph_module: torch.nn.Module
    modified: bool


def delegate_external_constants_pass_unlifted(module: torch.nn.Module,
                                              gen_tag_fn: Callable[[torch.fx.Node], str | None] | None = None
                                              ) -> PassResult:
    """Tags every `get_attr` node of the module's graphs with `gen_tag_fn(node)` (a .ptd name, or
    None to keep that weight in the .pte). Without `gen_tag_fn` nothing is tagged, as upstream."""
    if gen_tag_fn is not None and not callable(gen_tag_fn):
        raise TypeError(f"delegate_external_constants_pass_unlifted: gen_tag_fn must be callable, got {gen_tag_fn!r}")
    modified = False
    for sub in module.modules():
        if not isinstance(sub, torch.fx.GraphModule) or gen_tag_fn is None:
            continue
        for node in sub.graph.nodes:
            if node.op != "get_attr":
                continue
            tag = gen_tag_fn(node)
            if tag is not None and (not isinstance(tag, str) or not tag or "/" in tag or "\\" in tag):
                raise ValueError(f"delegate_external_constants_pass_unlifted: gen_tag_fn({node.name}) returned "
                                 f"{tag!r}; a tag is a .ptd file name (a non-empty str without '/'), or None")
            node.meta.setdefault("custom", {})[DELEGATE_CONSTANT_TAG] = tag
            modified = True
    return PassResult(module, modified)
