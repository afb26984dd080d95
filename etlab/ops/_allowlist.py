"""The reviewed operator allowlist: the only operators etlab runs on data from a file.

A file (`.pte`, `.etrecord`) names the operators it wants run. Torch knows thousands, and some of
them act on the world: `aten::from_file(shared=True)` maps a file for writing, `aten::save`
writes one, `set_*` and `manual_seed` change process state, `rand*` / `dropout` advance the random
generator, `resize_` / `set_` re-point memory, `_reshape_alias` trusts its strides. So etlab runs
only the operators listed here (plus kernels a user registers, `etlab.runtime.register_kernel`).

Review rule for an entry: given tensors whose metadata was checked, the operator reads its inputs
and writes only its outputs (or, for the two in-place entries, the one tensor it is handed);
it does no I/O, touches no global state (random generator, thread count, flags), and checks the
indices and sizes it is given (torch raises on out-of-range indices for every entry here).

Base names only: which overloads of a base name count is decided from torch's schema
(`etlab.ops._resolve`): out-variants for the runtime, functional overloads for graph replay.
Left out on purpose (core ATen, yet not pure): `rand`, `randn`, `randperm`, `native_dropout`
(random state), `resize_` (re-points memory), `empty_strided` (arbitrary strides), `_fft_*` and
`view_as_real` (complex dtypes, which no kernel here supports).
"""

from __future__ import annotations

# Core ATen and portable-kernel operators computed for every supported dtype (SUPPORTED_DTYPES).
ATEN_ANY_DTYPE = frozenset({
    # arithmetic, comparison, logic
    "abs", "add", "sub", "mul", "div", "neg", "rsub", "remainder", "fmod", "floor_divide", "pow", "reciprocal",
    "sign", "round", "trunc", "floor", "ceil", "clamp", "maximum", "minimum", "where", "eq", "ne", "lt", "le",
    "gt", "ge", "isinf", "isnan", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "relu", "hardtanh",
    "leaky_relu", "elu", "glu", "allclose",
    # floating-point math that also takes integer inputs (torch promotes them)
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log2", "log10", "log1p",
    "logit", "_native_batch_norm_legit", "avg_pool1d", "avg_pool3d", "adaptive_avg_pool1d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "_upsample_bilinear2d_aa", "grid_sampler_2d",
    # reductions and scans
    "sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all", "cumsum", "var",
    "var_mean", "topk", "sort",
    # linear algebra
    "mm", "bmm", "addmm", "linear", "matmul",
    # creation (write only their output)
    "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty", "empty_like", "arange",
    "scalar_tensor", "fill", "lift_fresh_copy",
    # copies, layout changes and the view-copies the edge dialect uses
    "clone", "copy", "_to_copy", "alias_copy", "as_strided_copy", "cat", "stack", "constant_pad_nd", "detach_copy",
    "diagonal_copy", "expand_copy", "flip", "roll", "narrow_copy", "permute_copy", "repeat", "repeat_interleave",
    "select_copy", "slice_copy", "split_copy", "split_with_sizes_copy", "squeeze_copy", "t_copy",
    "transpose_copy", "unbind_copy", "unfold_copy", "unsqueeze_copy", "view_copy", "tril", "triu",
    "pixel_shuffle", "pixel_unshuffle", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d",
    # views (replay of edge graphs before view-copy conversion; a view reads its input's checked storage)
    "alias", "as_strided", "detach", "diagonal", "expand", "permute", "select", "slice", "split_with_sizes",
    "squeeze", "unsqueeze", "view", "t", "transpose", "unbind", "_unsafe_view",
    # indexing (torch checks every index against the indexed size)
    "index", "index_put", "index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "select_scatter",
    "slice_scatter", "masked_fill", "masked_scatter", "masked_select", "nonzero", "embedding",
    "embedding_dense_backward", "_embedding_bag",
    # pooling (integer inputs are rejected by torch, not crashed on); max_pool2d itself: upstream's
    # XNNPACK partitioner keeps it whole in the edge programs its ETRecords record
    "max_pool2d", "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
    "_adaptive_avg_pool2d_backward", "avg_pool2d_backward", "col2im", "_cdist_forward", "_pdist_forward",
    "convolution_backward", "native_group_norm_backward", "native_layer_norm_backward",
    # shape queries and run-time assertions (pure; return Python scalars or raise)
    "sym_size", "sym_numel", "sym_stride", "sym_storage_offset", "sym_is_contiguous", "_local_scalar_dense",
    "sym_constrain_range", "sym_constrain_range_for_size", "_assert_scalar", "_assert_async",
    "_assert_tensor_metadata",
})

# Operators whose kernels compute in floating point only (every tensor they see is floating).
ATEN_FLOAT_ONLY = frozenset({
    "convolution", "_native_batch_norm_legit_no_training", "native_layer_norm", "_softmax", "_log_softmax",
    "gelu", "sin", "cos", "tan", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "native_group_norm",
    "avg_pool2d", "upsample_bilinear2d", "upsample_nearest2d",
    # kept whole (not decomposed) by upstream's XNNPACK partitioner in the edge programs it records
    "hardswish", "prelu",
})

# The only in-place operators the runtime runs: upstream's exporter emits copy_ (writes a mutable
# buffer back) and index_put_ (updates a KV cache); fill_ / zero_ initialise planned memory. Each
# writes only the tensor it is given (its `self`), which the binder checks is not constant data.
# In-place operators that change a tensor's metadata (resize_, set_, as_strided_, t_) are not here.
ATEN_IN_PLACE = frozenset({"copy_", "index_put_", "fill_", "zero_"})

# Index arguments that must be integral: (base name, argument position).
INDEX_ARGS = frozenset({("embedding", 1), ("index_select", 2), ("gather", 2), ("index_copy", 2)})

# Non-ATen operators: the namespace's base names, each with its pure flag (all are pure).
# `executorch_prim`, `et_copy` and the symbolic-shape queries have runtime-only kernels
# (etlab.runtime._prim_kernels); dim_order_ops and quantized_decomposed also appear in graphs.
OTHER_NAMESPACES = {
    "dim_order_ops": frozenset({"_to_dim_order_copy", "_clone_dim_order", "_empty_dim_order"}),
    "quantized_decomposed": frozenset({"quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
                                       "dequantize_per_channel", "choose_qparams"}),
    "et_copy": frozenset({"_h2d_copy", "_d2h_copy"}),
    "executorch_prim": frozenset({
        "add", "sub", "mul", "floordiv", "truediv", "mod", "eq", "gt", "lt", "ge", "le", "neg", "ceil", "round",
        "trunc", "sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite", "et_view", "et_copy_index"}),
}

# Higher-order operators a recorded graph may use (their bodies are checked like any graph).
HIGHER_ORDER = frozenset({"cond"})
