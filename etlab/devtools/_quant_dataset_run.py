"""Running the float and converted graphs on a batch for the report over a dataset, doing no more than it
needs: only the values the report reads are kept (the rest freed after their last use), the values no input
reaches (weights dequantized per channel) computed once, and a quantize -> dequantize pair whose int8 value
nobody reads run as one fake-quantize pass (the same values as the two decomposed ops, a third of the time).
The guard torch.export adds for the example's batch size is skipped: the caller checks a batch against a
batch-1 run (see _quant_dataset)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from etlab.devtools._quant_dataset_stats import Coverage
from etlab.devtools._quant_debug import _input_dependent, _is_dequantize, _is_quantize, mutated_later
from etlab.facts.fx import node_op_name


def static_quantizer(node: Node) -> Coverage | None:
    """A quantize_per_tensor node with a constant scale and zero point (a calibrated activation), or None."""
    if not _is_quantize(node) or "per_tensor" not in node_op_name(node) or len(node.args) < 5:
        return None
    scale, zp, qmin, qmax = node.args[1:5]
    if not all(isinstance(v, (int, float)) for v in (scale, zp, qmin, qmax)) or not scale > 0:
        return None
    return Coverage(node.name, float(scale), int(zp), (qmin - zp) * scale, (qmax - zp) * scale)


class _Keep(Interpreter):
    """Runs a GraphModule keeping only the values named in `keep` (the rest are freed after their last
    use); the guard export adds for the example's batch size is skipped (see the module doc)."""

    def __init__(self, gm: GraphModule, keep: set[str], constants: Constants | None = None,
                 fusable: frozenset[str] = frozenset()):
        super().__init__(gm, garbage_collect_values=True)
        self.keep = keep
        self.constants = constants
        self.fusable = fusable
        self.fused: set[str] = set()
        self.values: dict[str, Any] = {}

    def _fake_quantize(self, n: Node):
        """quantize -> dequantize as one pass (torch's fake_quantize: the same values, a third of the time),
        stored as the quantize node's value for its dequantize users; None when it does not apply."""
        x = self.env.get(n.args[0])
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
            return None
        scale, zp, qmin, qmax = n.args[1:5]
        if not qmin <= zp <= qmax:
            return None
        self.fused.add(n.name)
        return torch.fake_quantize_per_tensor_affine(x, float(scale), int(zp), int(qmin), int(qmax))

    def run_node(self, n: Node) -> Any:
        if n.op == "call_module" and str(n.target).startswith("_guards"):
            return None
        if self.fused and n.args and isinstance(n.args[0], Node) and n.args[0].name in self.fused:
            out = self.env[n.args[0]]  # a dequantize of a fused quantize: its value is already dequantized
            if n.name in self.keep:
                self.values[n.name] = out
            return out
        cache = self.constants
        out = None
        if cache is not None and n.name in cache.values:
            out = cache.values[n.name]
        elif n.name in self.fusable:
            out = self._fake_quantize(n)
        if out is None:
            out = super().run_node(n)
            if cache is not None and n.name in cache.names:
                cache.values[n.name] = out
        if n.name in self.keep:
            self.values[n.name] = out
        return out


@dataclass
class Constants:
    """The values of a graph's nodes that no input reaches (weights dequantized per channel, folded
    constants), computed on the first run and reused: they cost as much as the layers on a small batch."""

    names: set[str]
    values: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, gm: GraphModule) -> Constants:
        dependent, mutated = _input_dependent(gm), mutated_later(gm)
        return cls({n.name for n in gm.graph.nodes if n.op == "call_function" and n.name not in dependent
                    and n.name not in mutated})


def fusable_quantizers(gm: GraphModule, keep: set[str]) -> frozenset[str]:
    """Static per-tensor quantize nodes read only by dequantize nodes of the same parameters, and not kept:
    their int8 value is never looked at, so the pair runs as one fake-quantize pass."""
    out = set()
    for n in gm.graph.nodes:
        if static_quantizer(n) is None or n.name in keep or not n.users:
            continue
        if all(_is_dequantize(u) and "per_tensor" in node_op_name(u) and u.args[0] is n
               and tuple(u.args[1:5]) == tuple(n.args[1:5]) for u in n.users):
            out.add(n.name)
    return frozenset(out)


def run_keeping(gm: GraphModule, args: tuple, keep: set[str], constants: Constants | None = None,
                fusable: frozenset[str] = frozenset()) -> dict[str, Any]:
    with torch.no_grad():
        runner = _Keep(gm, keep, constants, fusable)
        runner.run(*args)
    return runner.values
