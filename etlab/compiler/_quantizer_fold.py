"""Compile-time folding of quantize ops whose inputs are all constants: the .pte stores int8 weights.

`convert_pt2e(fold_quantize=False)` (and quantizers that leave the weight's quantize in the graph)
give `quantize_per_channel(float_weight, scales, zero_points, ...)` on constant inputs; running it
at every call wastes time and stores the float weight. Like upstream's constant folding, the op is
computed once here and its int8 result becomes a lifted constant; the float weight, now unread,
leaves the program with the other unused placeholders.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument
from torch.fx import GraphModule, Node

_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR)


def _foldable_ops() -> frozenset:
    importlib.import_module("torch.ao.quantization.fx._decomposed")
    qd = torch.ops.quantized_decomposed
    return frozenset({qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor, qd.quantize_per_channel.default})


def constant_values(input_specs, output_specs, state_dict: dict, constants: dict) -> dict[str, torch.Tensor]:
    """Placeholder name -> value, for parameters, constant tensors and buffers the program never writes
    (convert_pt2e stores scales and zero points as buffers); never for mutated buffers or user inputs."""
    mutated = {s.target for s in output_specs if s.kind == OutputKind.BUFFER_MUTATION}
    values = {}
    for spec in input_specs:
        constant = spec.kind in _CONSTANT_KINDS or (spec.kind == InputKind.BUFFER and spec.target not in mutated)
        if constant and isinstance(spec.arg, TensorArgument):
            value = state_dict.get(spec.target, constants.get(spec.target))
            if isinstance(value, torch.Tensor):
                values[spec.arg.name] = value
    return values


def fold_quantized_constants(gm: GraphModule, values: dict[str, torch.Tensor],
                             make_constant: Callable[[torch.Tensor, Node], Node]) -> int:
    """Replaces each quantize op of constant tensors in `gm` (the top graph) by its precomputed
    result; returns how many were folded."""
    foldable = _foldable_ops()
    folded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in foldable:
            continue
        tensors = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, Node)]
        if not tensors or not all(a.op == "placeholder" and a.name in values for a in tensors):
            continue
        resolve = lambda a: values[a.name] if isinstance(a, Node) else a
        with torch.no_grad():
            result = node.target(*[resolve(a) for a in node.args], **{k: resolve(v) for k, v in node.kwargs.items()})
        replacement = make_constant(result.contiguous(), node)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        folded += 1
    return folded
