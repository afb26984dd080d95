"""Which Edge nodes XNNPACK can run, and for every other node why not (`why_unsupported`).

One rule per operator: it returns None when the node can be lowered, else a `DelegationRefusal`
whose category says what kind of obstacle it is (operator, dtype, dynamic shape, argument, ...)
and whose hint says what the user can change. The partitioner tags nodes by these rules and
preprocess relies on them: a node that passes is one the lowering knows how to write.

The rules read only the node and its inputs' `meta["val"]`, plus which placeholders hold
constants (weights must be constants for convolutions). With the ExportedProgram at hand that
is its signature; without (an upstream ETRecord's graph) torch.export's placeholder names tell.
q/dq operators follow the rules of `_quant`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etlab.compiler.backends.xnnpack._checks import (
    Context,
    DelegationRefusal,
    arg_of,
    check_values,
    is_static,
    op_key,
    refusal,
    static_only,
    tensor_of,
    value_refusal,
)
from etlab.compiler.backends.xnnpack._quant import QUANT_RULES, getitem_rule

Rule = Callable[[Node, Context], "DelegationRefusal | None"]


# --- rules --------------------------------------------------------------------------------------


def _live_operands(args, ctx: Context) -> list:
    """Operands to check: constants of any real dtype are converted to float32 when stored (the
    integer 3 and 6 of a decomposed hardswish, `x + 1`), so only computed operands must be float32."""
    return [a for a in args if not (ctx.is_constant(a) and tensor_of(a) is not None
                                    and not tensor_of(a).is_complex() and is_static(tensor_of(a)))]


def _binary_rule(node: Node, ctx: Context) -> DelegationRefusal | None:
    return check_values(node, _live_operands(node.args[:2], ctx))


def _float_op(arity: int) -> Rule:
    def rule(node: Node, ctx: Context) -> DelegationRefusal | None:
        return check_values(node, list(node.args[:arity]))
    return rule


def _alpha_one(node: Node, ctx: Context) -> DelegationRefusal | None:
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        return refusal("argument", f"alpha={alpha!r}; XNNPACK adds/subtracts without a scale",
                       "write x + alpha * y as a separate multiply")
    if not isinstance(node.args[1], Node):
        return refusal("argument", "the second operand is a Python scalar, not a tensor",
                       "compile through to_edge, which makes scalars constant tensors")
    return _binary_rule(node, ctx)


def _div(node: Node, ctx: Context) -> DelegationRefusal | None:
    mode = node.kwargs.get("rounding_mode")
    if mode is not None:
        return refusal("argument", f"rounding_mode={mode!r}; XNNPACK divides without rounding",
                       "use true division (rounding_mode=None)")
    return _binary_rule(node, ctx)


def _gelu(node: Node, ctx: Context) -> DelegationRefusal | None:
    approximate = node.kwargs.get("approximate", arg_of(node, 1, "approximate", "none"))
    if approximate != "none":
        return refusal("argument", f"gelu approximate={approximate!r}; XNNPACK's GELU is the exact (erf) one",
                       "use approximate='none'")
    if tensor_of(node) is not None and tensor_of(node).dtype == torch.float16:
        return refusal("dtype", "a float16 GELU; XNNPACK has no fp16 GELU (upstream refuses it too)",
                       "run the GELU in float32 (cast around it)")
    return check_values(node, node.args[:1])


def _clamp(node: Node, ctx: Context) -> DelegationRefusal | None:
    low, high = arg_of(node, 1, "min"), arg_of(node, 2, "max")
    if any(isinstance(v, Node) for v in (low, high)):
        return refusal("argument", "clamp bounds are tensors; XNNPACK clamps to constant numbers",
                       "pass Python numbers as min/max")
    if low is not None and high is not None and low > high:
        return refusal("argument", f"clamp min {low} > max {high}", "")
    return check_values(node, node.args[:1])


def _pow(node: Node, ctx: Context) -> DelegationRefusal | None:
    if node.args[1] != 2:
        return refusal("argument", f"exponent {node.args[1]!r}; XNNPACK only squares (exponent 2)",
                       "use x * x, torch.sqrt or torch.exp/log for other powers")
    return check_values(node, node.args[:1])


def _conv(node: Node, ctx: Context) -> DelegationRefusal | None:
    x, weight, bias = node.args[:3]
    dilation, transposed, output_padding = node.args[5:8]
    found = check_values(node, [x, weight, bias])
    if found is not None:
        return found
    if tensor_of(x).dim() not in (3, 4):
        return refusal("argument", f"a {tensor_of(x).dim() - 2}-D convolution; etlab lowers 1-D and 2-D "
                       "convolutions to XNNPACK", "fold the extra spatial dims into the batch, or use Conv2d")
    if tensor_of(x).dim() == 3:  # over a unit width: reshapes around it infer at most one dynamic dim
        for t in (tensor_of(x), tensor_of(node)):
            if sum(not isinstance(d, int) for d in t.shape) > 1:
                return refusal("dynamic_shape", f"a 1-D convolution over the shape {[str(d) for d in t.shape]}: "
                               "XNNPACK's reshapes to and from its unit-width 2-D form infer at most one "
                               "dynamic dim", "keep one dynamic dim (batch or length), or export static shapes")
    if not ctx.is_constant(weight) or (bias is not None and not ctx.is_constant(bias)):
        return refusal("argument", "the convolution's weight or bias is computed at run time; XNNPACK packs "
                       "convolution weights ahead of time", "make the weight a parameter or buffer of the module")
    if transposed and any(d != 1 for d in dilation):
        return refusal("argument", f"a transposed convolution with dilation {list(dilation)}",
                       "XNNPACK's deconvolution is lowered here only without dilation")
    if not transposed and any(p != 0 for p in output_padding):
        return refusal("argument", f"output_padding {list(output_padding)} on a regular convolution", "")
    return None


def _batch_norm(node: Node, ctx: Context) -> DelegationRefusal | None:
    x = node.args[0]
    found = check_values(node, [x]) if tensor_of(node) is not None else value_refusal(x, "operand")
    if found is not None and found.category != "other":
        return found
    if tensor_of(x) is None or tensor_of(x).dim() not in (2, 3, 4):
        return refusal("argument", f"batch norm over a {tensor_of(x).dim() if tensor_of(x) is not None else '?'}-D "
                       "input", "XNNPACK runs batch norm over (N, C), (N, C, L) or (N, C, H, W) only")
    if not all(a is None or ctx.is_constant(a) for a in node.args[1:5]):
        return refusal("argument", "batch norm statistics or affine parameters are not constants",
                       "export the model in eval mode")
    return None


def _getitem(node: Node, ctx: Context) -> DelegationRefusal | None:
    source, index = node.args
    if isinstance(source, Node) and "choose_qparams" in op_key(source):
        return getitem_rule(node, ctx)
    kind = op_key(source) if isinstance(source, Node) and source.op == "call_function" else None
    if kind in ("aten._native_batch_norm_legit_no_training.default", "aten.max_pool2d_with_indices.default"):
        if index != 0 and not node.users:
            return None  # an unused statistic (upstream's graphs keep them): nothing to run
        if index != 0:
            return refusal("argument", f"output {index} of {kind} (batch norm statistics or pooling indices)",
                           "XNNPACK computes only the first output")
        return why_unsupported(source, ctx=ctx)
    return refusal("operator", f"getitem of {kind or source}", "")


def _linear_like(node: Node, ctx: Context) -> DelegationRefusal | None:
    key = op_key(node)
    if key == "aten.addmm.default":
        bias, x, weight = node.args[:3]
        for name in ("beta", "alpha"):
            if node.kwargs.get(name, 1) != 1:
                return refusal("argument", f"addmm {name}={node.kwargs[name]!r}", "use beta=alpha=1 (nn.Linear)")
    elif key == "aten.linear.default":
        x, weight, bias = node.args[0], node.args[1], arg_of(node, 2, "bias")
    else:
        (x, weight), bias = node.args[:2], None
    found = check_values(node, [x, weight, bias])
    if found is not None:
        return found
    if not ctx.is_constant(weight):
        return refusal("argument", "the matrix multiply's second operand is computed at run time; etlab lowers "
                       "matrix products with a constant weight (XNNPACK's fully connected)",
                       "for activation @ activation use a 3-D batched matmul (torch.bmm / @ on 3-D tensors)")
    outputs = tensor_of(weight).shape[0 if key == "aten.linear.default" else -1]
    if bias is not None and (not ctx.is_constant(bias) or tensor_of(bias).numel() != outputs):
        return refusal("argument", "the bias is computed at run time or does not hold one value per output",
                       "use nn.Linear's bias")
    return None


def _bmm(node: Node, ctx: Context) -> DelegationRefusal | None:
    return check_values(node, list(node.args[:2]))


def _pool_lists(node: Node, has_dilation: bool):
    kernel = list(node.args[1])
    stride = list(arg_of(node, 2, "stride", None) or kernel)
    padding = list(arg_of(node, 3, "padding", [0, 0]))
    dilation = list(arg_of(node, 4, "dilation", [1, 1])) if has_dilation else [1, 1]
    expand = (lambda v: v * 2 if len(v) == 1 else v)
    return expand(kernel), expand(stride), expand(padding), expand(dilation)


def _max_pool(node: Node, ctx: Context) -> DelegationRefusal | None:
    found = check_values(node if tensor_of(node) is not None else node.args[0], node.args[:1])
    if found is not None:
        return found
    if tensor_of(node.args[0]).dim() != 4:
        return refusal("argument", "max pooling over a non-4-D input", "use max_pool2d on NCHW input")
    kernel, stride, _padding, _dilation = _pool_lists(node, True)
    if any(s > k for s, k in zip(stride, kernel)):
        return refusal("argument", f"stride {stride} larger than the window {kernel}",
                       "XNNPACK's max pooling needs stride <= kernel size")
    ceil_mode = arg_of(node, 5, "ceil_mode", False)
    if ceil_mode and static_only(node, node.args[:1], "max pooling with ceil_mode"):
        return static_only(node, node.args[:1], "max pooling with ceil_mode")
    if key_users_need_indices(node):
        return refusal("argument", "the pooling indices are used", "XNNPACK's max pooling returns values only")
    return None


def key_users_need_indices(node: Node) -> bool:
    """Whether anything uses max_pool2d_with_indices' indices (XNNPACK computes only the values)."""
    if op_key(node) != "aten.max_pool2d_with_indices.default":
        return False
    return any(op_key(u) != "getitem" or u.args[1] != 0 for u in node.users)


def _avg_pool(node: Node, ctx: Context) -> DelegationRefusal | None:
    found = check_values(node, node.args[:1])
    if found is not None:
        return found
    if tensor_of(node.args[0]).dim() != 4:
        return refusal("argument", "average pooling over a non-4-D input", "use avg_pool2d on NCHW input")
    kernel, _stride, padding, _ = _pool_lists(node, False)
    ceil_mode = arg_of(node, 4, "ceil_mode", False)
    count_include_pad = arg_of(node, 5, "count_include_pad", True)
    divisor = arg_of(node, 6, "divisor_override", None)
    if ceil_mode:
        return refusal("argument", "avg_pool2d with ceil_mode=True", "use ceil_mode=False (pad the input instead)")
    if count_include_pad and any(padding):
        return refusal("argument", "avg_pool2d counts the zero padding in its averages (count_include_pad=True)",
                       "use count_include_pad=False, or pad explicitly with F.pad before pooling")
    if divisor is not None and divisor != kernel[0] * kernel[1]:
        return refusal("argument", f"divisor_override={divisor}", "XNNPACK divides by the window size")
    return None


def _mean(node: Node, ctx: Context) -> DelegationRefusal | None:
    x = node.args[0]
    found = check_values(node, [x])
    if found is not None:
        return found
    rank = tensor_of(x).dim()
    dims = sorted(d % rank for d in (node.args[1] if len(node.args) > 1 and node.args[1] is not None else []))
    if rank != 4 or dims != [2, 3]:
        return refusal("argument", f"mean over dims {dims} of a rank-{rank} tensor; XNNPACK averages the spatial "
                       "dims (2, 3) of a 4-D tensor (global average pooling)", "average over H and W of NCHW")
    if node.kwargs.get("dtype") is not None:
        return refusal("dtype", "mean with an explicit dtype", "drop dtype=")
    return _reshape(node, ctx)


def _softmax(node: Node, ctx: Context) -> DelegationRefusal | None:
    x, dim = node.args[:2]
    found = check_values(node, [x])
    if found is not None:
        return found
    rank = tensor_of(x).dim()
    if dim % max(rank, 1) != rank - 1:
        return refusal("argument", f"softmax over dim {dim} of a rank-{rank} tensor; XNNPACK's softmax runs over "
                       "the last dim", "permute the dim to the end, softmax over -1, permute back")
    return None


def _cat(node: Node, ctx: Context) -> DelegationRefusal | None:
    tensors = list(node.args[0])
    if len(tensors) < 2:
        return refusal("argument", f"cat of {len(tensors)} tensor", "nothing to concatenate")
    return check_values(node, tensors)


def _slice(node: Node, ctx: Context) -> DelegationRefusal | None:
    step = arg_of(node, 4, "step", 1)
    if step != 1:
        return refusal("argument", f"slice with step {step}; XNNPACK slices contiguous ranges",
                       "slice with step 1")
    if any(isinstance(a, Node) or isinstance(a, torch.SymInt) for a in node.args[1:4]):
        return refusal("dynamic_shape", "slice bounds are computed at run time", "slice with constant bounds")
    return check_values(node, node.args[:1]) or static_only(node, node.args[:1], "a slice")


def _select(node: Node, ctx: Context) -> DelegationRefusal | None:
    if isinstance(node.args[2], (Node, torch.SymInt)):
        return refusal("dynamic_shape", "the selected index is computed at run time", "select a constant index")
    return check_values(node, node.args[:1]) or static_only(node, node.args[:1], "a select")


def _shape_op(node: Node, ctx: Context) -> DelegationRefusal | None:
    return check_values(node, node.args[:1])


def _reshape(node: Node, ctx: Context) -> DelegationRefusal | None:
    found = check_values(node, node.args[:1])
    t = tensor_of(node)
    if found is None and t is not None and sum(not isinstance(d, int) for d in t.shape) > 1:
        return refusal("dynamic_shape", f"a reshape to {[str(d) for d in t.shape]}: XNNPACK infers at most one "
                       "dynamic dim of a reshape", "keep one dynamic dim, or export with static shapes")
    return found


def _pad(node: Node, ctx: Context) -> DelegationRefusal | None:
    pads = list(node.args[1])
    if any(p < 0 for p in pads):
        return refusal("argument", f"negative padding {pads} (cropping)", "slice the tensor instead")
    if len(pads) // 2 > (tensor_of(node.args[0]).dim() if tensor_of(node.args[0]) is not None else 0):
        return refusal("argument", f"padding {pads} has more dims than the input", "")
    return check_values(node, node.args[:1])


def _upsample_bilinear(node: Node, ctx: Context) -> DelegationRefusal | None:
    found = check_values(node, node.args[:1])
    if found is not None:
        return found
    if tensor_of(node.args[0]).dim() != 4:
        return refusal("argument", "bilinear resize of a non-4-D tensor", "")
    return static_only(node, node.args[:1], "a resize")


def _full_like(node: Node, ctx: Context) -> DelegationRefusal | None:
    """A tensor of one number shaped like its input: a constant of the partition when the shape is static."""
    t = tensor_of(node)
    if isinstance(node.args[1], Node):
        return refusal("argument", "the fill value is computed at run time", "fill with a Python number")
    if t is not None and t.dtype != torch.float32:
        return refusal("dtype", f"full_like of dtype {t.dtype}; etlab folds float32 ones", "")
    return static_only(node, [], "full_like (folded to a constant)")


def _clone(node: Node, ctx: Context) -> DelegationRefusal | None:
    order = node.kwargs.get("dim_order")
    t = tensor_of(node)
    if order is not None and t is not None and list(order) != list(range(t.dim())):
        return refusal("argument", f"a copy into dim order {list(order)}", "keep the default (contiguous) dim order")
    if node.kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        return refusal("argument", f"memory_format={node.kwargs['memory_format']}", "")
    return check_values(node, node.args[:1])


RULES: dict[str, Rule] = {
    "aten.add.Tensor": _alpha_one, "aten.sub.Tensor": _alpha_one,
    "aten.mul.Tensor": _binary_rule, "aten.div.Tensor": _div, "aten.div.Tensor_mode": _div,
    "aten.maximum.default": _binary_rule, "aten.minimum.default": _binary_rule,
    "aten.relu.default": _float_op(1), "aten.sigmoid.default": _float_op(1), "aten.tanh.default": _float_op(1),
    "aten.hardswish.default": _float_op(1), "aten.gelu.default": _gelu, "aten.exp.default": _float_op(1),
    "aten.log.default": _float_op(1), "aten.sqrt.default": _float_op(1), "aten.rsqrt.default": _float_op(1),
    "aten.abs.default": _float_op(1), "aten.neg.default": _float_op(1), "aten.floor.default": _float_op(1),
    "aten.ceil.default": _float_op(1), "aten.elu.default": _float_op(1), "aten.leaky_relu.default": _float_op(1),
    "aten.hardtanh.default": _clamp, "aten.clamp.default": _clamp, "aten.pow.Tensor_Scalar": _pow,
    "aten.convolution.default": _conv,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.addmm.default": _linear_like, "aten.mm.default": _linear_like, "aten.linear.default": _linear_like,
    "aten.bmm.default": _bmm,
    "aten.max_pool2d_with_indices.default": _max_pool, "aten.max_pool2d.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool, "aten.mean.dim": _mean,
    "aten._softmax.default": _softmax, "aten.cat.default": _cat,
    "aten.slice_copy.Tensor": _slice, "aten.select_copy.int": _select,
    "aten.view_copy.default": _reshape, "aten.permute_copy.default": _shape_op,
    "aten.squeeze_copy.dims": _reshape, "aten.squeeze_copy.dim": _reshape, "aten.unsqueeze_copy.default": _reshape,
    "aten.constant_pad_nd.default": _pad, "aten.upsample_bilinear2d.vec": _upsample_bilinear,
    "dim_order_ops._clone_dim_order.default": _clone, "aten.clone.default": _clone,
    "aten.alias_copy.default": _shape_op, "aten.full_like.default": _full_like,
    "getitem": _getitem,
}

_HINTS = {
    "aten.upsample_nearest2d.vec": "XNNPACK has no nearest-neighbour resize: use mode='bilinear'",
    "aten.native_layer_norm.default": "XNNPACK has no layer norm node; it stays in the portable program",
    "aten.embedding.default": "embedding lookups stay in the portable program",
}


def why_unsupported(node: Node, program: ExportedProgram | None = None, *,
                    ctx: Context | None = None) -> DelegationRefusal | None:
    """Why XNNPACK (as etlab lowers it) cannot take `node`, or None if it can.

    `program`, when given, tells which placeholders are constants; without it torch.export's
    naming (p_/b_/c_ prefixes) does, so the rules also read upstream ETRecords' graphs.
    """
    if node.op != "call_function":
        return refusal("other", f"{node.op} node {node.name!r} is not an operator", "")
    ctx = ctx or Context(program)
    key = op_key(node)
    sizes = [a.name for a in node.all_input_nodes if isinstance(a.meta.get("val"), (torch.SymInt, torch.SymFloat))]
    if sizes:
        return refusal("dynamic_shape", f"it reads sizes computed at run time ({', '.join(sizes)}); XNNPACK takes "
                       "shapes fixed when the delegate is built (up to a dynamic dim's bound)",
                       "compute the shape from static sizes, or let reshapes infer the dynamic dim (-1)")
    rule = RULES.get(key) or QUANT_RULES.get(key)
    if rule is None:
        return refusal("operator", f"{key} has no XNNPACK lowering in etlab",
                       _HINTS.get(key, "it runs on the portable kernels; rewrite it with supported ops if it is hot"))
    return rule(node, ctx)
