"""The layout a layout-agnostic node (an elementwise binary op, a concatenation) runs in: NCHW or NHWC.

Such a node can run in either layout; what differs is the transposes the choice costs: each operand
that does not exist in the chosen layout yet is transposed into it, and the result is transposed once
more when a consumer reads the other layout (a convolution or a pooling reads NHWC; the partition's
output, a reshape, a softmax or a fully connected node read NCHW; another agnostic node follows). The
cheaper layout is the one that moves fewer elements through transposes. Deciding from the operands
alone was a transpose too many where a branch meets the partition's input: CSPResNet's concatenation
of a bypass input (NCHW) with a convolution branch (NHWC) feeding a convolution ran in NCHW (three
transposes where one does), PoolFormer's residual add of the block input and an NHWC branch, returned
by the partition, ran in NHWC (two where one does).
"""

from __future__ import annotations

import math

from torch.fx import Node

from etlab.compiler.backends.xnnpack._checks import op_key
from etlab.compiler.backends.xnnpack._lower import NCHW, NHWC, Lowering

# Handlers that read their data input in NHWC whatever layout it has.
READS_NHWC = frozenset({
    "aten.convolution.default", "aten.max_pool2d_with_indices.default", "aten.max_pool2d.default",
    "aten.avg_pool2d.default", "aten.mean.dim", "aten.upsample_bilinear2d.vec",
})
# Handlers that run in the layout their input already has (their own choice follows the value's).
FOLLOWS_LAYOUT = frozenset({
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.div.Tensor_mode",
    "aten.maximum.default", "aten.minimum.default", "aten.relu.default", "aten.hardtanh.default",
    "aten.clamp.default", "aten.sigmoid.default", "aten.tanh.default", "aten.hardswish.default",
    "aten.gelu.default", "aten.exp.default", "aten.log.default", "aten.sqrt.default", "aten.rsqrt.default",
    "aten.abs.default", "aten.neg.default", "aten.floor.default", "aten.ceil.default", "aten.elu.default",
    "aten.leaky_relu.default", "aten.pow.Tensor_Scalar", "aten._native_batch_norm_legit_no_training.default",
    "aten.cat.default", "aten.slice_copy.Tensor", "aten.constant_pad_nd.default",
    "dim_order_ops._clone_dim_order.default", "aten.clone.default", "aten.alias_copy.default",
})


def _elements(lw: Lowering, node: Node) -> int:
    return math.prod(lw.out_shape(node, NCHW))


def consumer_layouts(lw: Lowering, node: Node, depth: int = 8) -> set[str]:
    """The layouts `node`'s value is read in downstream: by its consumers, and through those that follow their
    input's layout (a batch norm, an activation) by theirs, `depth` deep (DenseNet's concatenation feeds a batch
    norm that feeds a convolution: NHWC)."""
    need = {NCHW} if lw.plan.output_of(node, lw.out_ext) is not None else set()
    for user in lw.plan_consumers(node):
        key = op_key(user) if user.op == "call_function" else user.op
        if key in READS_NHWC:
            need.add(NHWC)
        elif key not in FOLLOWS_LAYOUT:
            need.add(NCHW)
        elif depth > 0:
            need |= consumer_layouts(lw, user, depth - 1)
    return need


def cheaper_layout(lw: Lowering, node: Node, live: list[Node], default: str) -> str:
    """NCHW or NHWC for `node`, reading the non-constant operands `live`: the layout whose transposes (of
    operands into it, of the result out of it) move fewer elements; `default` on a tie."""
    need = consumer_layouts(lw, node)
    cost = {}
    for layout, other in ((NCHW, NHWC), (NHWC, NCHW)):
        operands = sum(_elements(lw, x) for x in live if not lw.has(x, layout))
        cost[layout] = operands + (_elements(lw, node) if other in need else 0)
    if cost[NCHW] == cost[NHWC]:
        return default
    return NCHW if cost[NCHW] < cost[NHWC] else NHWC
