"""The patterns `EtlabQuantizer` annotates: which nodes anchor a quantized op, and how each is annotated.

An anchor is the op that computes (conv, linear, matmul/bmm, add, mul, pooling, cat); a fused
activation after it (batch norm, then relu/hardtanh, each the single user of the one before) joins
it, so the whole chain runs in float between one dequantize and one quantize, as upstream's
quantized kernels fuse them. Annotations use torchao's `QuantizationAnnotation` in
`node.meta["quantization_annotation"]`, the key `prepare_pt2e` reads.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch.fx import Node
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationConfig,
    SharedQuantizationSpec,
)

_KEY = "quantization_annotation"
aten = torch.ops.aten

_ANCHORS = {
    "conv": {aten.conv1d, aten.conv2d, aten.conv3d},
    "linear": {aten.linear},
    "matmul": {aten.matmul, aten.bmm, aten.mm},
    "add": {aten.add, aten.add_},
    "mul": {aten.mul, aten.mul_},
    "pool": {aten.max_pool2d, aten.avg_pool2d, aten.adaptive_avg_pool2d, aten.mean},
    "cat": {aten.cat, aten.concat, aten.concatenate},
}
_KIND_OF = {packet: kind for kind, packets in _ANCHORS.items() for packet in packets}
_BATCH_NORM = {aten.batch_norm, aten._native_batch_norm_legit_no_training}
_ACTIVATIONS = {aten.relu, aten.relu_, aten.hardtanh, aten.hardtanh_}


def _packet(node: Node):
    target = node.target
    return getattr(target, "overloadpacket", None) if node.op == "call_function" else None


def anchor_kind(node: Node) -> str | None:
    """"conv", "linear", "matmul", "add", "mul", "pool", "cat", or None if `node` anchors no pattern."""
    kind = _KIND_OF.get(_packet(node))
    if kind == "pool" and node.target is aten.mean.dim and not _is_float(node.args[0]):
        return None
    return kind


def is_annotated(node: Node) -> bool:
    """Whether a quantizer pattern has already annotated the node (patterns run in order and never annotate a node
    twice)."""
    annotation = node.meta.get(_KEY)
    return annotation is not None and annotation._annotated


def _is_float(value) -> bool:
    """A node producing one floating-point tensor (scalars, int tensors and tuples are not quantized)."""
    if not isinstance(value, Node):
        return False
    val = value.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def _single_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def fused_chain(anchor: Node, kind: str) -> list[Node]:
    """The nodes after `anchor` that run fused with it: [batch_norm] (conv only) then [relu/hardtanh]."""
    chain: list[Node] = []
    last = anchor
    user = _single_user(last)
    if kind == "conv" and user is not None and _packet(user) in _BATCH_NORM and not is_annotated(user):
        if user.target is aten._native_batch_norm_legit_no_training.default:
            getitem = _single_user(user)  # the tuple's output 0, the only one an eval graph reads
            if getitem is None or getitem.target is not operator.getitem or getitem.args[1] != 0:
                return chain
            chain += [user, getitem]
            last = getitem
        else:
            chain.append(user)
            last = user
        user = _single_user(last)
    if kind in ("conv", "linear", "matmul", "add", "mul") and user is not None and _packet(user) in _ACTIVATIONS \
            and not is_annotated(user):
        chain.append(user)
    return chain


def _finish(anchor: Node, kind: str, inputs: dict[Node, object], config: QuantizationConfig) -> None:
    """Writes the anchor's input annotation and puts the output qspec on the last node of its fused chain."""
    chain = fused_chain(anchor, kind)
    output = config.output_activation
    anchor.meta[_KEY] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=None if chain else output,
                                               _annotated=True)
    for i, node in enumerate(chain):
        last = i == len(chain) - 1
        node.meta[_KEY] = QuantizationAnnotation(output_qspec=output if last else None, _annotated=True)


def _annotate_weighted(node: Node, config: QuantizationConfig, kind: str) -> None:
    """conv / linear: activation input, weight (per channel on the output-channel axis) and bias."""
    x = node.args[0]
    weight = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    if not (_is_float(x) and _is_float(weight)):
        return
    inputs: dict[Node, object] = {}
    if config.input_activation is not None:
        inputs[x] = config.input_activation
    if config.weight is not None:
        inputs[weight] = config.weight
    if config.bias is not None and _is_float(bias):
        inputs[bias] = config.bias
    if config.output_activation is None:  # dynamic: no output qspec, no fusion
        node.meta[_KEY] = QuantizationAnnotation(input_qspec_map=inputs, _annotated=True)
        return
    _finish(node, kind, inputs, config)


def _annotate_binary(node: Node, config: QuantizationConfig, kind: str) -> None:
    """matmul/bmm/add/mul: every floating-point tensor operand (a Python scalar stays a scalar)."""
    operands = [a for a in node.args[:2] if _is_float(a)]
    if not operands or config.input_activation is None or not _is_float(node):
        return
    _finish(node, kind, {a: config.input_activation for a in operands}, config)


def _annotate_pool(node: Node, config: QuantizationConfig, kind: str) -> None:
    """Pooling keeps its input's qparams (its output lies within its input's range): no requantization."""
    x = node.args[0]
    if not _is_float(x) or config.input_activation is None or config.output_activation is None:
        return
    node.meta[_KEY] = QuantizationAnnotation(input_qspec_map={x: config.input_activation},
                                             output_qspec=SharedQuantizationSpec((x, node)), _annotated=True)


def _annotate_cat(node: Node, config: QuantizationConfig, kind: str) -> None:
    """cat: every input and the output share the first input's qparams, so cat copies int8 bytes."""
    tensors = node.args[0]
    if not isinstance(tensors, (list, tuple)) or not tensors or not all(_is_float(t) for t in tensors):
        return
    if config.input_activation is None or config.output_activation is None:
        return
    first = tensors[0]
    shared = SharedQuantizationSpec((first, node))
    inputs = {first: config.input_activation}
    for t in tensors[1:]:
        inputs.setdefault(t, shared)
    node.meta[_KEY] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=shared, _annotated=True)


ANNOTATORS: dict[str, Callable[[Node, QuantizationConfig], None]] = {
    "conv": lambda n, c: _annotate_weighted(n, c, "conv"),
    "linear": lambda n, c: _annotate_weighted(n, c, "linear"),
    "matmul": lambda n, c: _annotate_binary(n, c, "matmul"),
    "add": lambda n, c: _annotate_binary(n, c, "add"),
    "mul": lambda n, c: _annotate_binary(n, c, "mul"),
    "pool": lambda n, c: _annotate_pool(n, c, "pool"),
    "cat": lambda n, c: _annotate_cat(n, c, "cat"),
}
