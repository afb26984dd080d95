"""etlab's XNNPACK lowering, in process: partition decisions, payloads, etlab's runtime vs eager, refusals."""

from __future__ import annotations

import collections
import hashlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from etlab.compiler import CompileError, to_backend, to_edge, to_edge_transform_and_lower
from etlab.compiler._delegation import DelegationSpec, Partitioner, PartitionResult
from etlab.compiler.backends import XnnpackBackend, XnnpackPartitioner
from etlab.compiler.backends.xnnpack import why_unsupported
from etlab.facts.lowered import DELEGATION_REFUSAL_META, CompileSpec, DelegationRefusal, lowered_modules
from etlab.models import zoo
from etlab.runtime import Runtime
from etlab.schema.xnnpack import HEADER_MAGIC, UINT64_MAX, deserialize_xnnpack, node_kind

NO_HANDLE = 65535


class Convs(nn.Module):
    """conv+BN+relu6, depthwise, grouped+dilated, transposed (grouped too), a batch norm after an add."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1, stride=2)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 16, 3, padding=1, groups=8)
        self.g = nn.Conv2d(16, 16, 3, padding=(1, 2), dilation=(1, 2), groups=4)
        self.t = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.tg = nn.ConvTranspose2d(8, 8, 2, stride=2, groups=2)
        self.bn2 = nn.BatchNorm2d(8)
        with torch.no_grad():
            for bn in (self.bn, self.bn2):
                bn.running_mean.normal_()
                bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 2)
                bn.bias.normal_()

    def forward(self, x):
        y = F.relu6(self.bn(self.c(x)))
        y = F.hardswish(self.dw(y))
        y = torch.clamp(self.g(y), -2, 3)
        return self.tg(self.bn2(self.t(y) + 1.0))


class Conv1ds(nn.Module):
    """1-D convolutions: strided + BatchNorm1d + relu, depthwise, grouped + dilated after a pad (no bias) with a
    clamp, transposed; zeros_like (full_like, folded) and elementwise ops between them in [N, L, C]."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(3, 8, 3, padding=1, stride=2)
        self.bn = nn.BatchNorm1d(8)
        self.dw = nn.Conv1d(8, 8, 5, padding=2, groups=8)
        self.g = nn.Conv1d(8, 8, 3, padding=2, dilation=2, groups=2, bias=False)
        self.t = nn.ConvTranspose1d(8, 4, 3, stride=2, padding=1, output_padding=1)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 2)
            self.bn.bias.normal_()

    def forward(self, x):
        y = F.relu(self.bn(self.a(x)))
        y = torch.tanh(self.dw(y)) * torch.sigmoid(y) + torch.zeros_like(y)
        y = F.hardtanh(self.g(F.pad(y, (1, 0))), -1.0, 2.0)
        return self.t(y[..., 1:]), y


class Pools(nn.Module):
    def forward(self, x):
        a = F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True)
        b = F.avg_pool2d(x, 2)
        c = F.interpolate(b, size=a.shape[2:], mode="bilinear", align_corners=False)
        d = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=True)
        return a + c, d * x.mean((2, 3), keepdim=True), F.adaptive_avg_pool2d(x, 1).flatten(1)


class Elementwise(nn.Module):
    def forward(self, x, y):
        a = torch.sigmoid(x) * torch.tanh(y) - x / (y.abs() + 1)
        b = torch.maximum(F.gelu(a), torch.minimum(x, y)) + F.elu(x) + F.leaky_relu(y, 0.2)
        c = torch.exp(-x.abs()) + torch.log(y.abs() + 1) + torch.sqrt(x.abs()) + torch.rsqrt(y.abs() + 1)
        d = torch.floor(x) + torch.ceil(y) + x ** 2 - torch.neg(y)
        return b + c, F.relu(d) * 0.5


class Shapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(24, 6)
        self.c = nn.Conv2d(4, 4, 1)

    def forward(self, x, q):
        y = self.c(x)
        cat = torch.cat([y, x, y, x, y, x, y], 1)  # seven inputs: two concatenate nodes
        p = F.pad(cat[:, 3:27], (1, 2, 0, 1), value=0.5)
        out = torch.softmax(self.lin(p.permute(0, 2, 3, 1).reshape(-1, 24)), -1)
        att = torch.bmm(q, q.transpose(1, 2)).softmax(-1)
        return out, att, x[:, 1], y.flatten(1)


def _seeded(make):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return make()


MODELS = {
    "convs": lambda: (Convs().eval(), (torch.randn(1, 3, 16, 16),)),
    "conv1ds": lambda: (Conv1ds().eval(), (torch.randn(2, 3, 33),)),
    "pools": lambda: (Pools().eval(), (torch.randn(2, 4, 9, 9),)),
    "elementwise": lambda: (Elementwise().eval(), (torch.randn(3, 5), torch.randn(3, 5))),
    "shapes": lambda: (Shapes().eval(), (torch.randn(1, 4, 5, 6), torch.randn(2, 3, 4))),
    "mlp": zoo.make_mlp,
    "cnn": zoo.make_cnn,
}


def _lower(model, inputs, partitioner=None, dynamic_shapes=None):
    ep = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    return to_edge_transform_and_lower(ep, partitioner=[partitioner or XnnpackPartitioner()])


def _blobs(edge):
    modules = lowered_modules(edge.exported_program().graph_module)
    return [(m, deserialize_xnnpack(m.processed_bytes)) for _, _, m in modules]


def _kinds(edge) -> collections.Counter:
    return collections.Counter(node_kind(n) for _, blob in _blobs(edge) for n in blob.graph.xnodes)


def _portable_ops(edge) -> list[str]:
    return [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"
            and "delegate" not in str(n.target) and "getitem" not in str(n.target)]


def _run(edge, inputs):
    et = edge.to_executorch()
    return Runtime.get().load_program(et.buffer).load_method("forward").execute(list(inputs))


@pytest.fixture(scope="module", params=sorted(MODELS))
def lowered(request):
    model, inputs = _seeded(MODELS[request.param])
    return request.param, model, inputs, _lower(model, inputs)


def test_whole_model_is_one_partition_and_runs_like_eager_on_etlab_runtime(lowered):
    name, model, inputs, edge = lowered
    assert len(_blobs(edge)) == 1, name
    assert _portable_ops(edge) == []
    with torch.no_grad():
        want = model(*inputs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = _run(edge, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_payload_is_upstreams_format_with_edge_debug_handles(lowered):
    _, _, _, edge = lowered
    for module, blob in _blobs(edge):
        assert module.backend_id == "XnnpackBackend"
        assert module.processed_bytes[4:8] == HEADER_MAGIC and blob.identifier == b"XN01"
        graph = blob.graph
        handles = {n.meta["debug_handle"] for n in module.original_module.graph.nodes if n.op == "call_function"}
        for xnode in graph.xnodes:
            assert xnode.debug_handle in handles or (xnode.debug_handle == NO_HANDLE
                                                      and node_kind(xnode) == "XNNStaticTranspose")
        offsets = graph.constant_data  # as upstream 1.5.1: every constant is named data, keyed by its SHA-256
        assert offsets[0].size == 0 and len(blob.constant_data) == 0
        store = module.named_data_store_output
        assert (store is None) == (len(offsets) == 1)
        for c in offsets[1:]:
            assert c.offset == UINT64_MAX and c.named_key in store.pte_data
            data = store.buffers[store.pte_data[c.named_key].buffer_index]
            assert len(data) == c.size and hashlib.sha256(data).hexdigest() == c.named_key.removeprefix("scale_")
        assert graph.num_externs == len(graph.input_ids) + len(graph.output_ids)
        assert module.debug_handle_map == {}  # as upstream: handles live in the nodes


def test_op_kinds_each_model_lowers_to():
    kinds = {name: _kinds(_lower(*_seeded(MODELS[name]))) for name in ("convs", "pools", "shapes", "cnn")}
    assert {"XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d"} <= set(kinds["convs"])
    assert kinds["convs"]["XNNStaticTranspose"] == 2  # into NHWC once, back once
    assert {"XNNMaxPooling2d", "XNNAvgPooling2d", "XNNStaticResizeBilinear2D", "XNNGlobalAvgPooling2d"} <= set(
        kinds["pools"])
    assert {"XNNConcatenate5", "XNNConcatenate3", "XNNStaticSlice", "XNNStaticConstantPad", "XNNSoftmax",
            "XNNBatchMatrixMultiply", "XNNFullyConnected"} <= set(kinds["shapes"])
    # cnn: 16 convolutions with their batch norms and relu6 folded in, one transpose at the input,
    # the mean over H, W as global pooling read directly by the classifier (no transpose back)
    cnn = kinds["cnn"]
    assert cnn["XNNConv2d"] + cnn["XNNDepthwiseConv2d"] == 16
    assert cnn["XNNStaticTranspose"] == 1 and "XNNClamp" not in cnn and "XNNMultiply" not in cnn


def test_one_d_convolutions_are_2d_convolutions_over_a_unit_width():
    edge = _lower(*_seeded(MODELS["conv1ds"]))
    kinds = _kinds(edge)
    assert (kinds["XNNConv2d"], kinds["XNNDepthwiseConv2d"], kinds["XNNConvTranspose2d"]) == (2, 1, 1)
    # each convolution reshapes [N, L, C] <-> [N, L, 1, C] (free in memory, as upstream); the values between stay
    # channels-last: one transpose in, one back for each of the two outputs; batch norm, relu and the clamp fold
    assert kinds["XNNStaticReshape"] == 8 and kinds["XNNStaticTranspose"] == 3
    assert "XNNClamp" not in kinds and kinds["XNNMultiply"] == 1  # tanh * sigmoid only
    ((_, blob),) = _blobs(edge)
    (conv,) = [n for n in blob.graph.xnodes if node_kind(n) == "XNNConv2d" and n.xnode_union.dilation_height == 2]
    assert conv.xnode_union.dilation_width == 1 and conv.xnode_union.kernel_width == 1
    assert (conv.output_min_max.output_min, conv.output_min_max.output_max) == (-1.0, 2.0)


def test_one_d_convolution_over_a_bounded_dynamic_length_runs_at_every_length():
    model, inputs = _seeded(lambda: (nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(),
                                                   nn.Conv1d(8, 8, 3, dilation=2, groups=2)).eval(),
                                     (torch.randn(1, 4, 40),)))
    edge = _lower(model, inputs, dynamic_shapes=({2: torch.export.Dim("frames", min=8, max=64)},))
    assert _portable_ops(edge) == []
    method = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward")
    for length in (64, 9, 40, 64):
        x = torch.randn(1, 4, length)
        (got,) = method.execute([x])
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


def test_one_d_convolution_with_two_dynamic_dims_is_refused_as_dynamic_shape():
    model = nn.Conv1d(4, 8, 3).eval()
    dims = {0: torch.export.Dim("batch", min=1, max=4), 2: torch.export.Dim("frames", min=8, max=64)}
    ep = to_edge(torch.export.export(model, (torch.randn(2, 4, 16),), dynamic_shapes=(dims,))).exported_program()
    refused = _refusals(XnnpackPartitioner().partition(ep).tagged_exported_program)
    (conv,) = [n for n in ep.graph.nodes if n.target is not None and "convolution" in str(n.target)]
    assert refused[conv.name].category == "dynamic_shape" and "1-D convolution" in refused[conv.name].reason


def test_weight_normed_conv1d_after_a_linear_folds_its_weight_and_runs_like_eager():
    """wav2vec2's positional conv: weight_norm's ops (sum, pow, div: some XNNPACK cannot run) read only
    constants and only the convolution, so they are evaluated when the delegate is built; its input is a
    transpose of a linear's N-D output (the matmul's value is 2-D, the transpose's 3-D)."""

    class PosConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 32)
            self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(32, 32, 5, padding=2, groups=4), dim=2)

        def forward(self, x):
            h = self.lin(x)
            return h + F.gelu(self.conv(h.transpose(1, 2))).transpose(1, 2)

    model, inputs = _seeded(lambda: (PosConv().eval(), (torch.randn(1, 39, 16),)))
    edge = _lower(model, inputs)
    assert _portable_ops(edge) == []
    with torch.no_grad():
        want = model(*inputs)
    torch.testing.assert_close(_run(edge, inputs)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["dilated_tcn", "dynamic_conv1d", "conformer_block"])
def test_corpus_conv1d_models_lower_every_convolution_and_match_eager(name):
    from etlab.models.corpus import CORPUS, max_abs_error, within_tolerance

    entry = CORPUS[name]
    built = entry.build()
    edge = to_edge_transform_and_lower(entry.export(built)["forward"], partitioner=[XnnpackPartitioner()])
    portable = _portable_ops(edge)
    assert not [op for op in portable if "convolution" in op or "alias_copy" in op or "full_like" in op], portable
    got, want = _run(edge, built[1]["forward"]), entry.eager(built)["forward"]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert within_tolerance(g, w, entry.atol, entry.rtol), (name, max_abs_error([g], [w]))


def test_activation_and_batch_norm_fold_into_the_convolution():
    class ConvBnRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            return F.hardtanh(self.bn(self.conv(x)), -1.0, 2.5)

    model, inputs = _seeded(lambda: (ConvBnRelu().eval(), (torch.randn(1, 3, 8, 8),)))
    edge = _lower(model, inputs, XnnpackPartitioner(compile_specs=[CompileSpec("debug_handle_map", b"fused")]))
    ((module, blob),) = _blobs(edge)
    conv = [n for n in blob.graph.xnodes if node_kind(n) == "XNNConv2d"]
    assert len(conv) == 1 and [node_kind(n) for n in blob.graph.xnodes].count("XNNClamp") == 0
    assert (conv[0].output_min_max.output_min, conv[0].output_min_max.output_max) == (-1.0, 2.5)
    # the fused map covers the conv's batch norm, its getitem and the activation
    edge_handles = {n.meta["debug_handle"] for n in module.original_module.graph.nodes if n.op == "call_function"}
    assert set(module.debug_handle_map[conv[0].debug_handle]) == edge_handles
    torch.testing.assert_close(_run(edge, inputs)[0], model(*inputs), rtol=1e-5, atol=1e-5)


# --- refusals -----------------------------------------------------------------------------------


class Planted(nn.Module):
    """A supported linear surrounded by an unsupported op, an int op, an odd argument and a gelu(tanh)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, n):
        y = self.lin(x)
        a = torch.cumsum(y, 1)                            # operator
        b = n * 3                                         # dtype (int64)
        c = F.gelu(y, approximate="tanh")                 # argument
        d = torch.softmax(y.reshape(2, 4, 2), 1)          # argument (not the last dim)
        return a, b, c, d


def _refusals(edge_program) -> dict[str, DelegationRefusal]:
    return {n.name: n.meta[DELEGATION_REFUSAL_META] for n in edge_program.graph.nodes
            if DELEGATION_REFUSAL_META in n.meta}


def test_every_node_left_out_says_why():
    model, inputs = _seeded(lambda: (Planted().eval(), (torch.randn(2, 8), torch.arange(4))))
    ep = to_edge(torch.export.export(model, inputs)).exported_program()
    result = XnnpackPartitioner().partition(ep)
    refused = _refusals(result.tagged_exported_program)
    tagged = {n.name for n in ep.graph.nodes if n.meta.get("delegation_tag")}
    calls = {n.name for n in ep.graph.nodes if n.op == "call_function"}
    assert tagged | set(refused) == calls and not tagged & set(refused)
    by_op = {str(n.target): refused[n.name] for n in ep.graph.nodes if n.name in refused}
    assert by_op["aten.cumsum.default"].category == "operator"
    assert by_op["aten.mul.Tensor"].category == "dtype" and "int64" in by_op["aten.mul.Tensor"].reason
    assert by_op["aten.gelu.default"].category == "argument" and "tanh" in by_op["aten.gelu.default"].reason
    assert by_op["aten._softmax.default"].category == "argument"
    assert all(r.backend == "XnnpackBackend" and r.reason and r.hint for r in refused.values())
    # the same rules answer for a graph without its program (an upstream ETRecord's graph)
    for node in ep.graph.nodes:
        if node.name in refused:
            assert why_unsupported(node).category == refused[node.name].category
        elif node.op == "call_function":
            assert why_unsupported(node) is None


def test_dynamic_dimension_is_refused_with_its_category():
    class Slice(nn.Module):
        def forward(self, x):
            return torch.relu(x)[:, 1:3] * 2.0

    dim = torch.export.Dim("n", min=2, max=64)  # (to_edge itself refuses unbounded dims)
    exported = torch.export.export(Slice(), (torch.randn(4, 6),), dynamic_shapes=({0: dim},))
    ep = to_edge(exported).exported_program()
    refused = _refusals(XnnpackPartitioner().partition(ep).tagged_exported_program)
    by_op = {str(n.target): refused.get(n.name) for n in ep.graph.nodes if n.op == "call_function"}
    assert by_op["aten.slice_copy.Tensor"].category == "dynamic_shape"  # XNNPACK sizes slices when built
    assert by_op["aten.relu.default"] is None and by_op["aten.mul.Tensor"] is None  # a bounded dim is fine


def test_bounded_dynamic_batch_runs_at_every_size():
    model, inputs = zoo.make_dynamic_batch()
    edge = _lower(model, inputs, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=16)},))
    ((_, blob),) = _blobs(edge)
    assert _portable_ops(edge) == []
    (input_id,) = blob.graph.input_ids
    dims = [list(v.xvalue_union.dims) for v in blob.graph.xvalues if v.xvalue_union.id_out == input_id]
    assert dims == [[16, 3, 8, 8]]  # the upper bound
    method = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward")
    for batch in (16, 5, 1, 16, 3):  # a delegate's outputs shrink and grow back between runs, within the bound
        x = torch.randn(batch, 3, 8, 8)
        (got,) = method.execute([x])
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


def test_user_exclusions_and_per_op_mode():
    model, inputs = zoo.make_mlp()
    ep = to_edge(torch.export.export(model, inputs)).exported_program()
    out = XnnpackPartitioner(exclude_ops=[torch.ops.aten.relu.default], exclude_modules=["fc3"]).partition(ep)
    refused = _refusals(out.tagged_exported_program)
    assert {str(n.target) for n in ep.graph.nodes if n.name in refused} == {"aten.relu.default", "aten.addmm.default",
                                                                           "aten.permute_copy.default"}
    assert {r.category for r in refused.values()} == {"excluded_by_user"}

    edge = _lower(model, inputs, XnnpackPartitioner(per_op_mode=True))
    assert len(_blobs(edge)) == 5  # 3 linears (their weight permutes folded in), 2 relus
    torch.testing.assert_close(_run(edge, inputs)[0], model(*inputs), rtol=1e-5, atol=1e-5)


def test_a_node_xnnpack_cannot_run_is_a_compile_error_naming_node_op_and_source():
    class TagAll(Partitioner):
        def partition(self, ep):
            for node in ep.graph.nodes:
                if node.op == "call_function":
                    node.meta["delegation_tag"] = "all"
            return PartitionResult(ep, {"all": DelegationSpec("XnnpackBackend")})

    class Cumsum(nn.Module):
        def forward(self, x):
            return torch.cumsum(x * 2.0, 0)

    ep = to_edge(torch.export.export(Cumsum(), (torch.randn(3, 4),))).exported_program()
    with pytest.raises(CompileError) as err:
        to_backend(ep, TagAll())
    assert err.value.op == "aten.cumsum.default" and "node 'cumsum'" in str(err.value)
    assert "test_xnnpack_lowering.py" in (err.value.source or "")


def test_unknown_compile_spec_is_refused():
    ep = to_edge(torch.export.export(nn.ReLU(), (torch.randn(2),))).exported_program()
    with pytest.raises(CompileError, match="unknown compile spec"):
        to_backend("XnnpackBackend", ep, [CompileSpec("fp16", b"1")])
    assert XnnpackBackend.__name__ == "XnnpackBackend"


# --- quantized ----------------------------------------------------------------------------------


def _quantized(make, config=None):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from etlab.compiler import EtlabQuantizer

    model, inputs = make()
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(),
                            EtlabQuantizer(config) if config is not None else EtlabQuantizer())
    prepared(*inputs)
    return convert_pt2e(prepared), inputs


def _value_types(blob) -> dict[int, str]:
    out = {}
    for xvalue in blob.graph.xvalues:
        value = xvalue.xvalue_union
        tensor = getattr(value, "tensor_value", None) or value
        out[tensor.id_out] = tensor.datatype.name.removeprefix("xnn_datatype_")
    return out


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_static_int8_patterns_become_quantized_xnnpack_nodes(name):
    model, inputs = _quantized(getattr(zoo, f"make_{name}"))
    edge = _lower(model, inputs)
    ((_, blob),) = _blobs(edge)
    assert _portable_ops(edge) == []
    types = _value_types(blob)
    kinds = [node_kind(n) for n in blob.graph.xnodes]
    assert kinds.count("XNNConvert") == (2 if name == "mlp" else 4)  # in, out (cnn: a requantize too)
    for xnode in blob.graph.xnodes:
        attrs = xnode.xnode_union
        if node_kind(xnode) in ("XNNFullyConnected", "XNNConv2d", "XNNDepthwiseConv2d"):
            assert (types[attrs.input1_id], types[attrs.filter_id], types[attrs.output_id]) == (
                "qint8", "qcint8", "qint8")
            assert types[attrs.bias_id] == "qcint32"
    # etlab's runtime: within one quantization step of the q/dq graph run in float by torch
    with torch.no_grad():
        want = model(*inputs)
    (got,) = _run(edge, inputs)
    assert float((got - want).abs().max()) <= 1.01 * _output_step(model)


def test_static_int8_conv1d_runs_quantized_over_a_unit_width():
    def make():
        model = nn.Sequential(nn.Conv1d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv1d(8, 8, 3, padding=2, dilation=2,
                                                                                   groups=8), nn.ReLU(),
                              nn.Conv1d(8, 4, 1))
        return model.eval(), (torch.randn(2, 3, 20),)

    model, inputs = _seeded(lambda: _quantized(make))
    edge = _lower(model, inputs)
    ((_, blob),) = _blobs(edge)
    assert _portable_ops(edge) == []
    types = _value_types(blob)
    convs = [n.xnode_union for n in blob.graph.xnodes if node_kind(n) in ("XNNConv2d", "XNNDepthwiseConv2d")]
    assert len(convs) == 3
    assert all((types[c.input1_id], types[c.filter_id], types[c.output_id]) == ("qint8", "qcint8", "qint8")
               for c in convs)
    with torch.no_grad():
        want = model(*inputs)
    (got,) = _run(edge, inputs)
    assert float((got - want).abs().max()) <= 1.01 * _output_step(model)


def _output_step(converted) -> float:
    """The scale of the last quantize node of a converted model (its output's quantization step)."""
    scales = [float(n.args[1]) for n in converted.graph.nodes
              if n.op == "call_function" and "quantize_per_tensor" in str(n.target) and "dequant" not in str(n.target)]
    return scales[-1]


def test_dynamic_int8_linear_becomes_a_qdint8_convert_and_fully_connected():
    from etlab.compiler import int8_dynamic_config

    model, inputs = _quantized(zoo.make_mlp, int8_dynamic_config())
    edge = _lower(model, inputs)
    ((_, blob),) = _blobs(edge)
    types = _value_types(blob)
    fcs = [n.xnode_union for n in blob.graph.xnodes if node_kind(n) == "XNNFullyConnected"]
    assert len(fcs) == 3
    assert {(types[fc.input1_id], types[fc.filter_id], types[fc.bias_id], types[fc.output_id]) for fc in fcs} == {
        ("qdint8", "qcint8", "fp32", "fp32")}
    assert [node_kind(n) for n in blob.graph.xnodes].count("XNNConvert") == 3
    with torch.no_grad():
        want = model(*inputs)
    (got,) = _run(edge, inputs)
    # XNNPACK quantizes each row with its own parameters, the q/dq graph the whole tensor with one
    assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max())


def test_builder_refuses_nodes_mixing_float_and_int8():
    from etlab.compiler.backends.xnnpack._builder import GraphBuilder, QuantSpec
    from etlab.schema.xnnpack import XNNDatatype

    b = GraphBuilder()
    x = b.value([2, 3])
    q = b.value([2, 3], quant=QuantSpec(XNNDatatype.xnn_datatype_qint8, scale=0.1))
    with pytest.raises(ValueError, match="mix datatypes"):
        b.node("XNNAdd", 1, input1_id=x, input2_id=q, output_id=b.value([2, 3]))
    b.node("XNNAdd", 1, input1_id=x, input2_id=x, output_id=b.value([2, 3]))
    with pytest.raises(TypeError, match="ints"):
        b.value([2.5, 3])


def test_partition_input_that_is_int8_keeps_its_quantization():
    """A quantize left in another partition: the delegate takes the int8 tensor as a qint8 input."""
    from etlab.compiler._delegation import DelegationSpec, Partitioner, PartitionResult

    class SplitAtQuantize(Partitioner):
        def partition(self, ep):
            tags = {}
            for node in ep.graph.nodes:
                if node.op != "call_function":
                    continue
                tag = "q" if "quantize_per_tensor" in str(node.target) and "dequant" not in str(node.target) \
                    and node.args[0].op == "placeholder" else "rest"
                node.meta["delegation_tag"] = tag
                tags[tag] = DelegationSpec("XnnpackBackend")
            return PartitionResult(ep, tags)

    model, inputs = _quantized(zoo.make_mlp)
    edge = _lower(model, inputs, SplitAtQuantize())
    blobs = [blob for _, blob in _blobs(edge)]
    assert len(blobs) == 2
    rest = next(b for b in blobs if len(b.graph.xnodes) > 1)
    types = _value_types(rest)
    assert [types[i] for i in rest.graph.input_ids] == ["qint8"]
    with torch.no_grad():
        want = model(*inputs)
    (got,) = _run(edge, inputs)
    assert float((got - want).abs().max()) <= 1.01 * _output_step(model)


def test_config_precisions_choose_float_or_quantized_nodes():
    quantized, inputs = _quantized(zoo.make_mlp)
    ep = to_edge(torch.export.export(quantized, inputs)).exported_program()
    only_float = XnnpackPartitioner(config_precisions=["fp32"]).partition(ep)
    refused = _refusals(only_float.tagged_exported_program)
    assert refused and {r.category for r in refused.values()} == {"excluded_by_user"}
    assert not any(n.meta.get("delegation_tag") for n in ep.graph.nodes if "addmm" in n.name)
    edge = _lower(quantized, inputs, XnnpackPartitioner(config_precisions=["static_quant"]))
    assert _portable_ops(edge) == []
    with pytest.raises(ValueError, match="config_precisions"):
        XnnpackPartitioner(config_precisions=["fp64"])


def test_weights_read_at_every_step_are_copied_into_each_partition():
    """An RNN reads its weights at every time step, across partitions the portable ops in between
    split: each XNNPACK partition gets its own copy (XNNPACK packs weights when it builds)."""
    model, inputs = _seeded(lambda: (nn.GRU(6, 5, batch_first=True).eval(), (torch.randn(2, 4, 6),)))
    edge = _lower(model, inputs)
    assert len(_blobs(edge)) > 1
    with torch.no_grad():
        want = model(*inputs)
    for got, w in zip(_run(edge, inputs), want):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-5)
