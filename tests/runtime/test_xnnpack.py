"""etlab's XnnpackBackend on XNNPACK graphs written here (no upstream needed; tests/interop has those).

- float graphs (NCHW->NHWC transpose, conv with fused clamp, depthwise conv, add, max/avg pool,
  transpose back; fully connected, softmax, concatenate, pad, batch matmul) match the same math
  in torch, and each node's logged output is its own result in the graph's layout;
- a quantized graph (quantize, int8 fully connected with per-channel weights, dequantize) is
  within one quantization step of float;
- hostile blobs (truncated, bad offsets, bad ids, bad constants, unknown node kinds, random
  damage) fail at init with a FormatError naming the defect, never anything else.
"""

from __future__ import annotations

import random
import struct

import pytest
import torch
import torch.nn.functional as F

from etlab.errors import FormatError
from etlab.runtime import BackendInitContext, ExecutionError
from etlab.runtime.backends.xnnpack import SUPPORTED_NODE_KINDS, XNNPACK_BACKEND
from etlab.runtime.backends.xnnpack._graph import run_plan
from etlab.schema.xnnpack import MODELS, NODE_KINDS, UINT64_MAX, XNNDatatype, deserialize_xnnpack, serialize_xnnpack

M = MODELS
INVALID = (1 << 32) - 1


@pytest.fixture(autouse=True)
def runtime_core():
    """These tests call the backend directly, so they run once (not once per runtime core)."""
    return None


class GraphBuilder:
    """Writes an XNNPACK graph the way upstream's preprocess lays it out (constants in named data)."""

    def __init__(self):
        self.values, self.nodes, self.inputs, self.outputs = [], [], [], []
        self.constant_data = [M["ConstantDataOffset"](offset=0, size=0, named_key="")]
        self.named: dict[str, bytes] = {}
        self.n_ext = 0

    def value(self, shape, *, data: torch.Tensor | None = None, role: str | None = None, quant=None,
              datatype=XNNDatatype.xnn_datatype_fp32) -> int:
        vid = len(self.values)
        buffer_idx = 0
        if data is not None:
            raw = data.contiguous().numpy().tobytes()
            key = f"c{vid}"
            self.named[key] = raw
            buffer_idx = len(self.constant_data)
            self.constant_data.append(M["ConstantDataOffset"](offset=UINT64_MAX, size=len(raw), named_key=key))
        ext, flags = INVALID, 0
        if role is not None:
            ext, flags = self.n_ext, 1 if role == "input" else 2
            self.n_ext += 1
            (self.inputs if role == "input" else self.outputs).append(vid)
        tensor = M["XNNTensorValue"](datatype=datatype, num_dims=len(shape), dims=list(shape),
                                     constant_buffer_idx=buffer_idx, external_id=ext, flags=flags, id_out=vid)
        if quant is not None:
            tensor = M["XNNQuantizedTensorValue"](tensor_value=tensor, quant_params=quant)
        self.values.append(M["XValue"](xvalue_union=tensor))
        return vid

    def node(self, kind: str, attrs, debug_handle: int, clamp: tuple[float, float] | None = None) -> None:
        minmax = M["OutputMinMax"](output_min=clamp[0], output_max=clamp[1]) if clamp else None
        self.nodes.append(M["XNode"](xnode_union=attrs, xnode_union_type=NODE_KINDS.index(kind) + 1,
                                     debug_handle=debug_handle, output_min_max=minmax))

    def blob(self) -> bytes:
        graph = M["XNNGraph"](version="0", xnodes=self.nodes, xvalues=self.values, num_externs=self.n_ext,
                              input_ids=self.inputs, output_ids=self.outputs, constant_data=self.constant_data)
        return serialize_xnnpack(graph)


def _init(blob: bytes, named: dict[str, bytes]):
    return XNNPACK_BACKEND.init(memoryview(blob), [], BackendInitContext(named, "forward", 0))


class Recorder:
    """A delegate context that keeps what the backend reports: (identifier, metadata) and outputs."""

    enabled = True

    def __init__(self):
        self.events, self.outputs = [], {}

    def start_profiling_delegate(self, name=None, delegate_debug_id=-1):
        return name if name is not None else delegate_debug_id

    def end_profiling_delegate(self, token, metadata=b""):
        self.events.append((token, bytes(metadata)))

    def log_output_delegate(self, name, delegate_debug_id, value):
        self.outputs[name if name is not None else delegate_debug_id] = value.clone()


def _conv_graph():
    """x (NCHW) -> NHWC -> conv3x3 s2 + clamp[0, 6] -> depthwise 3x3 -> add -> maxpool -> avgpool -> NCHW."""
    torch.manual_seed(0)
    w1, b1 = torch.randn(8, 3, 3, 3), torch.randn(8)
    wd, bd = torch.randn(8, 1, 3, 3), torch.randn(8)
    g = GraphBuilder()
    x = g.value((1, 3, 16, 16), role="input")
    xh = g.value((1, 16, 16, 3))
    g.node("XNNStaticTranspose", M["XNNStaticTranspose"](num_dims=4, perm=[0, 2, 3, 1], input_id=x, output_id=xh),
           65535)
    wv = g.value((8, 3, 3, 3), data=w1.permute(0, 2, 3, 1))         # OHWI
    bv = g.value((8,), data=b1)
    c1 = g.value((1, 8, 8, 8))
    conv = dict(padding_top=1, padding_right=1, padding_bottom=1, padding_left=1, kernel_height=3, kernel_width=3,
                subsampling_height=2, subsampling_width=2, dilation_height=1, dilation_width=1)
    g.node("XNNConv2d", M["_XNNNodeConv"](**conv, group_input_channels=3, group_output_channels=8, groups=1,
                                          input1_id=xh, filter_id=wv, bias_id=bv, output_id=c1), 1, clamp=(0.0, 6.0))
    wdv = g.value((1, 3, 3, 8), data=wd.permute(1, 2, 3, 0))          # 1HWO
    bdv = g.value((8,), data=bd)
    c2 = g.value((1, 8, 8, 8))
    conv.update(subsampling_height=1, subsampling_width=1)
    g.node("XNNDepthwiseConv2d", M["_XNNNodeConv"](**conv, group_input_channels=1, group_output_channels=1, groups=8,
                                                   input1_id=c1, filter_id=wdv, bias_id=bdv, output_id=c2), 3)
    s = g.value((1, 8, 8, 8))
    g.node("XNNAdd", M["_XNNNode2x1"](input1_id=c1, input2_id=c2, output_id=s), 4)
    p = g.value((1, 4, 4, 8))
    pool = dict(padding_top=0, padding_right=0, padding_bottom=0, padding_left=0, pooling_height=2,
                pooling_width=2, stride_height=2, stride_width=2, dilation_height=1, dilation_width=1)
    g.node("XNNMaxPooling2d", M["_XNNPooling2D"](**pool, input_id=s, output_id=p, flags=0x40), 5)
    a = g.value((1, 4, 4, 8))
    pool.update(padding_top=1, padding_right=1, padding_bottom=1, padding_left=1, pooling_height=3, pooling_width=3,
                stride_height=1, stride_width=1)
    g.node("XNNAvgPooling2d", M["_XNNPooling2D"](**pool, input_id=p, output_id=a, flags=0x40), 6)
    out = g.value((1, 8, 4, 4), role="output")
    g.node("XNNStaticTranspose", M["XNNStaticTranspose"](num_dims=4, perm=[0, 3, 1, 2], input_id=a, output_id=out),
           65535)

    def reference(x):
        c1 = F.conv2d(x, w1, b1, 2, 1)
        r1 = c1.clamp(0, 6)
        c2 = F.conv2d(r1, wd, bd, 1, 1, 1, 8)
        s = r1 + c2
        p = F.max_pool2d(s, 2, 2)
        a = F.avg_pool2d(p, 3, 1, 1, count_include_pad=False)
        return a, {1: c1, 3: c2, 4: s, 5: p, 6: a}
    return g, reference


def test_conv_graph_matches_torch_and_logs_each_node_in_nchw():
    g, reference = _conv_graph()
    plan = _init(g.blob(), g.named)
    x = torch.randn(1, 3, 16, 16)
    out = torch.empty(1, 8, 4, 4)
    recorder = Recorder()
    XNNPACK_BACKEND.execute(plan, [x, out], recorder)
    expected, intermediates = reference(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert [e[1].decode() for e in recorder.events] == [
        "XNNStaticTranspose", "XNNConv2d", "XNNDepthwiseConv2d", "XNNAdd", "XNNMaxPooling2d", "XNNAvgPooling2d",
        "XNNStaticTranspose"]
    assert [e[0] for e in recorder.events] == ["XNNStaticTranspose #1", 1, 3, 4, 5, 6, "XNNStaticTranspose #2"]
    for handle, value in intermediates.items():  # the conv's own output: before its fused clamp
        torch.testing.assert_close(recorder.outputs[handle], value, rtol=1e-5, atol=1e-5)
    XNNPACK_BACKEND.execute(plan, [x, out], None)  # tracing off: same result
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_convolutions_with_constant_weights_run_prepacked_with_the_clamp_fused():
    """Weights packed once at init; a run that logs no values takes the fused kernel (clamp inside), a
    run that logs takes the same packed kernel without it (the op's own result is logged): same outputs."""
    g, reference = _conv_graph()
    plan = _init(g.blob(), g.named)
    packed = {n.kind: n.fast is not None for n in plan.nodes if "Conv" in n.kind}
    assert packed == {"XNNConv2d": True, "XNNDepthwiseConv2d": True}
    x = torch.randn(1, 3, 16, 16)
    expected, _ = reference(x)
    timing_only = Recorder()
    timing_only.logs_values = False
    for context in (timing_only, Recorder(), None):
        out = torch.empty(1, 8, 4, 4)
        XNNPACK_BACKEND.execute(plan, [x, out], context)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert len(timing_only.events) == 7 and not timing_only.outputs


def test_constants_after_the_graph_and_inline_buffers_are_read_too():
    """Constants may follow the graph in the blob (offsets) or, in older blobs, sit in inline buffers."""
    g, reference = _conv_graph()
    graph = deserialize_xnnpack(g.blob()).graph
    region, inline = bytearray(), [M["Buffer"](storage=b"")]
    for entry in graph.constant_data[1:]:
        data = g.named[entry.named_key]
        region += b"\0" * (-len(region) % 16)
        entry.offset, entry.named_key = len(region), ""
        region += data
        inline.append(M["Buffer"](storage=data))
    x = torch.randn(1, 3, 16, 16)
    expected, _ = reference(x)
    old_style = deserialize_xnnpack(g.blob()).graph
    old_style.constant_data, old_style.constant_buffer = None, inline
    for blob in (serialize_xnnpack(graph, bytes(region)), serialize_xnnpack(old_style)):
        plan, out = _init(blob, {}), torch.empty(1, 8, 4, 4)
        XNNPACK_BACKEND.execute(plan, [x, out], None)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_dense_graph_matches_torch():
    """fully connected (and transposed weights), softmax, concatenate, pad, batch matmul, slice, reshape."""
    torch.manual_seed(1)
    w, b = torch.randn(6, 5), torch.randn(6)
    g = GraphBuilder()
    x = g.value((2, 3, 5), role="input")
    wv, bv = g.value((6, 5), data=w), g.value((6,), data=b)
    fc = g.value((2, 3, 6))
    g.node("XNNFullyConnected", M["XNNFullyConnected"](input1_id=x, filter_id=wv, bias_id=bv, output_id=fc), 1)
    wt = g.value((5, 6), data=w.t())
    fc2 = g.value((2, 3, 6))
    g.node("XNNFullyConnected", M["XNNFullyConnected"](input1_id=x, filter_id=wt, bias_id=INVALID, output_id=fc2,
                                                       flags=1), 2)
    sm = g.value((2, 3, 6))
    g.node("XNNSoftmax", M["_XNNNode1x1"](input_id=fc, output_id=sm), 3)
    cat = g.value((2, 3, 12))
    g.node("XNNConcatenate2", M["_XNNCat"](axis=2, input1_id=sm, input2_id=fc2, output_id=cat), 4)
    pad = g.value((2, 4, 14))
    g.node("XNNStaticConstantPad", M["XNNStaticConstantPad"](pre_paddings=[0, 1, 1], post_paddings=[0, 0, 1],
                                                            padding_value=0.5, input_id=cat, output_id=pad), 5)
    sl = g.value((2, 3, 14))
    g.node("XNNStaticSlice", M["XNNStaticSlice"](num_dims=3, offsets=[0, 1, 0], sizes=[2, 3, 14], input_id=pad,
                                                 output_id=sl), 6)
    bmm = g.value((2, 3, 3))
    g.node("XNNBatchMatrixMultiply", M["_XNNNode2x1"](input1_id=sl, input2_id=sl, output_id=bmm, flags=1), 7)
    out = g.value((2, 9), role="output")
    g.node("XNNStaticReshape", M["XNNStaticReshape"](num_dims=2, new_shape=[2, 9], input_id=bmm, output_id=out), 8)
    plan = _init(g.blob(), g.named)
    xin = torch.randn(2, 3, 5)
    result = torch.empty(2, 9)
    XNNPACK_BACKEND.execute(plan, [xin, result], None)
    f = F.linear(xin, w, b)
    c = torch.cat([torch.softmax(f, -1), xin @ w.t()], 2)
    s = F.pad(c, (1, 1, 1, 0), value=0.5)[:, 1:]
    torch.testing.assert_close(result, (s @ s.transpose(1, 2)).reshape(2, 9), rtol=1e-5, atol=1e-5)


def test_dynamic_shapes_run_within_the_bounds():
    """Dims below the delegate's bounds run (a reshape's 0 is inferred); the output is resized to match."""
    torch.manual_seed(3)
    w = torch.randn(6, 4)
    g = GraphBuilder()
    x = g.value((2, 8, 4), role="input")
    wv = g.value((6, 4), data=w)
    fc = g.value((2, 8, 6))
    g.node("XNNFullyConnected", M["XNNFullyConnected"](input1_id=x, filter_id=wv, bias_id=INVALID, output_id=fc), 1)
    out = g.value((2, 48), role="output")
    g.node("XNNStaticReshape", M["XNNStaticReshape"](num_dims=2, new_shape=[2, 0], input_id=fc, output_id=out), 2)
    plan = _init(g.blob(), g.named)
    xin, result = torch.randn(2, 5, 4), torch.empty(2, 48)
    XNNPACK_BACKEND.execute(plan, [xin, result], None)
    torch.testing.assert_close(result, (xin @ w.t()).reshape(2, 30))
    with pytest.raises(ExecutionError, match="or smaller dims"):
        XNNPACK_BACKEND.execute(plan, [torch.randn(2, 9, 4), torch.empty(2, 48)], None)


def _quantized_fc_graph():
    torch.manual_seed(2)
    w, b = torch.randn(4, 8), torch.randn(4)
    w_scales = w.abs().amax(1) / 127
    wq = torch.round(w / w_scales[:, None]).to(torch.int8)
    in_q = M["PerTensorQuant"](scale=0.02, zero_point=3)
    out_scale = 0.05
    bias_q = torch.round(b / (0.02 * w_scales)).to(torch.int32)
    g = GraphBuilder()
    x = g.value((3, 8), role="input")
    xq = g.value((3, 8), quant=in_q, datatype=XNNDatatype.xnn_datatype_qint8)
    g.node("XNNConvert", M["_XNNNode1x1"](input_id=x, output_id=xq), 1)
    g.named["wscales"] = w_scales.numpy().tobytes()  # per-channel scales live in named data, as upstream's
    g.constant_data.append(M["ConstantDataOffset"](offset=UINT64_MAX, size=16, named_key="wscales"))
    scale_idx = len(g.constant_data) - 1
    wv = g.value((4, 8), data=wq, datatype=XNNDatatype.xnn_datatype_qcint8,
                    quant=M["PerChannelQuant"](scale=[], channel_dim=0, scale_buffer_idx=scale_idx, num_scales=4))
    bv = g.value((4,), data=bias_q, datatype=XNNDatatype.xnn_datatype_qcint32,
                 quant=M["PerChannelQuant"](scale=(0.02 * w_scales).tolist(), channel_dim=0))
    yq = g.value((3, 4), quant=M["PerTensorQuant"](scale=out_scale, zero_point=-5),
                 datatype=XNNDatatype.xnn_datatype_qint8)
    g.node("XNNFullyConnected", M["XNNFullyConnected"](input1_id=xq, filter_id=wv, bias_id=bv, output_id=yq), 2,
           clamp=(0.0, float("inf")))
    y = g.value((3, 4), role="output")
    g.node("XNNConvert", M["_XNNNode1x1"](input_id=yq, output_id=y), 3)
    return g, w, b, out_scale, wq, w_scales, bias_q


def test_quantized_fully_connected_is_within_one_step():
    g, w, b, out_scale, wq, w_scales, bias_q = _quantized_fc_graph()
    plan = _init(g.blob(), g.named)
    x = torch.randn(3, 8)
    out = torch.empty(3, 4)
    recorder = Recorder()
    XNNPACK_BACKEND.execute(plan, [x, out], recorder)
    expected = F.linear(x, w, b).clamp(min=0)
    assert (out - expected).abs().max().item() <= out_scale + 0.02 * 8  # output step, plus input/weight rounding
    levels = out / out_scale - (-5)
    torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-4)  # exactly on the output's grid
    quantized_input = (torch.round(x / 0.02) + 3).clamp(-128, 127).sub(3).mul(0.02)
    torch.testing.assert_close(recorder.outputs[1], quantized_input)  # quantized values log their levels
    # a fused relu: the op's own float result (upstream's quantizer quantizes after the relu)
    bias = bias_q.double().mul(0.02 * w_scales.double()).float()
    expected_fc = F.linear(quantized_input, wq.float() * w_scales[:, None], bias)
    torch.testing.assert_close(recorder.outputs[2], expected_fc, rtol=1e-5, atol=1e-5)



def test_an_int8_fully_connected_runs_on_integers_within_one_step_of_the_levels_path():
    """Untraced, the int8 fully connected node (per-channel filter, fused relu) is oneDNN's int8 inner product
    on the input's integers; node by node on levels it is dequantize -> float linear -> requantize."""
    g, *_ = _quantized_fc_graph()
    plan = _init(g.blob(), g.named)
    assert [n.kind for n in plan.nodes if n.int_fn is not None] == ["XNNFullyConnected"]
    levels_plan = _init(g.blob(), g.named)
    for node in levels_plan.nodes:
        node.int_fn = None
    x = torch.randn(3, 8) * 3
    fast, slow = torch.empty(3, 4), torch.empty(3, 4)
    XNNPACK_BACKEND.execute(plan, [x, fast], None)
    run_plan(levels_plan, [x, slow], None)
    assert (fast - slow).abs().max().item() <= 0.05 * 1.001 and (slow > 0).any()
    levels = fast / 0.05 + 5
    torch.testing.assert_close(levels, levels.round(), rtol=0, atol=1e-4)


# -- hostile blobs ------------------------------------------------------------------------------------


def _blob_and_named():
    g, _ = _conv_graph()
    return g.blob(), g.named


def _edit_graph(edit):
    """A valid blob whose decoded graph `edit` damages, re-encoded."""
    blob, named = _blob_and_named()
    graph = deserialize_xnnpack(blob).graph
    edit(graph)
    return serialize_xnnpack(graph), named


def _set_header(field_offset: int, value: int, fmt: str = "<I"):
    blob, named = _blob_and_named()
    data = bytearray(blob)
    struct.pack_into(fmt, data, field_offset, value)
    return bytes(data), named


HOSTILE = {
    "truncated": (lambda: (_blob_and_named()[0][:100], _blob_and_named()[1]), "outside the blob"),
    "graph past the end": (lambda: _set_header(14, 1 << 30), "outside the blob"),
    "constants past the end": (lambda: _set_header(22, 1 << 40, "<Q"), "runs past the blob"),
    "not a graph": (lambda: (b"\0" * 64, {}), "identifier"),
    "unknown node kind": (lambda: _edit_graph(lambda g: setattr(g.xnodes[2], "xnode_union_type",
                                                                NODE_KINDS.index("XNNArgMaxPooling2d") + 1)),
                          "XNNArgMaxPooling2d"),
    "node id out of range": (lambda: _edit_graph(lambda g: setattr(g.xnodes[3].xnode_union, "input2_id", 999)),
                             "input2_id 999 is not a value"),
    "read before write": (lambda: _edit_graph(lambda g: g.xnodes.insert(0, g.xnodes.pop(3))), "before anything"),
    "written twice": (lambda: _edit_graph(lambda g: setattr(g.xnodes[3].xnode_union, "output_id", 1)),
                      "already written"),
    "wrong output shape": (lambda: _edit_graph(lambda g: setattr(g.xvalues[4].xvalue_union, "dims", [1, 9, 8, 8])),
                           "makes shape"),
    "constant too small": (lambda: _edit_graph(lambda g: setattr(g.constant_data[1], "size", 10)), "holds 10"),
    "missing named data": (lambda: _edit_graph(lambda g: setattr(g.constant_data[1], "named_key", "nope")),
                           "does not hold"),
    "constant outside region": (lambda: _edit_graph(lambda g: setattr(g.constant_data[1], "offset", 5) or
                                                    setattr(g.constant_data[1], "named_key", "")), "outside"),
    "huge shape": (lambda: _edit_graph(lambda g: setattr(g.xvalues[4].xvalue_union, "dims", [1 << 20, 1 << 20, 8, 8])),
                   "more than"),
    "not a permutation": (lambda: _edit_graph(lambda g: setattr(g.xnodes[0].xnode_union, "perm", [0, 2, 2, 1])),
                          "not a permutation"),
    "bad external ids": (lambda: _edit_graph(lambda g: setattr(g.xvalues[0].xvalue_union, "external_id", 7)),
                         "external ids"),
    "bad clamp": (lambda: _edit_graph(lambda g: setattr(g.xnodes[1].output_min_max, "output_min", 9.0)), "clamps"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_blobs_fail_at_init_with_a_format_error(case):
    make, message = HOSTILE[case]
    blob, named = make()
    with pytest.raises(FormatError, match=message):
        _init(blob, named)


def test_every_schema_node_kind_is_supported_or_named_when_refused():
    refused = set(NODE_KINDS) - SUPPORTED_NODE_KINDS
    assert refused == {"XNNArgMaxPooling2d", "XNNScaledDotProductAttention"}  # see _kernels.BUILDERS


def test_random_damage_gives_format_errors_only():
    blob, named = _blob_and_named()
    rng = random.Random(0)
    failures = 0
    for _ in range(150):
        data = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            plan = _init(bytes(data), named)
        except FormatError:
            failures += 1
            continue
        out = torch.empty(tuple(plan.specs[plan.outputs[0]].shape))
        XNNPACK_BACKEND.execute(plan, [torch.randn(plan.specs[plan.inputs[0]].shape), out], None)
    assert failures > 0


@pytest.mark.parametrize("pads, clamp", [((1, 1, 1, 1), None), ((0, 1, 0, 1), (0.0, 6.0)), ((2, 0, 1, 3), (-1.0, 1.0))])
def test_prepacked_convolution_is_the_reference_convolution(pads, clamp):
    """Symmetric padding is the kernel's, other padding (TensorFlow SAME with stride 2) is applied first."""
    from etlab.runtime.backends.xnnpack._prepacked import prepacked_conv2d

    torch.manual_seed(1)
    x = torch.randn(1, 9, 11, 4)  # NHWC
    w, b = torch.randn(6, 4, 3, 3), torch.randn(6)
    run = prepacked_conv2d(w, b, pads, (2, 2), (1, 1), 1, clamp, [1, 4, 9, 11])
    if run is None:
        pytest.skip("torch without oneDNN: the reference path runs")
    raw = F.conv2d(F.pad(x.permute(0, 3, 1, 2), pads), w, b, 2).permute(0, 2, 3, 1)
    torch.testing.assert_close(run(x, False), raw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run(x), raw.clamp(*clamp) if clamp else raw, rtol=1e-5, atol=1e-5)
    assert run(x).is_contiguous()  # NHWC in, NHWC out: no layout copies between nodes


def _quantized_conv_graph(residual: bool = False):
    """float NCHW -> qint8 -> NHWC -> conv 3x3 (int8 per-channel) -> clamp [0, 6] -> depthwise 3x3 -> NCHW -> float;
    `residual`: the depthwise result plus the clamp's output (an int8 add) before the NCHW transpose."""
    torch.manual_seed(3)
    g = GraphBuilder()
    qint8, x_q = XNNDatatype.xnn_datatype_qint8, M["PerTensorQuant"](scale=0.03, zero_point=2)

    def q_value(shape, scale, zp):
        return g.value(shape, quant=M["PerTensorQuant"](scale=scale, zero_point=zp), datatype=qint8)

    def conv_weights(w, in_scale, channel_dim):
        scales = w.abs().amax((1, 2, 3)) / 127
        wq = torch.round(w / scales.view(-1, 1, 1, 1)).to(torch.int8)
        stored = wq.permute(1, 2, 3, 0) if channel_dim == 3 else wq.permute(0, 2, 3, 1)  # 1HWO / OHWI
        wv = g.value(tuple(stored.shape), data=stored, datatype=XNNDatatype.xnn_datatype_qcint8,
                     quant=M["PerChannelQuant"](scale=scales.tolist(), channel_dim=channel_dim))
        b = torch.round(torch.randn(w.shape[0]) / (in_scale * scales)).to(torch.int32)
        bv = g.value((w.shape[0],), data=b, datatype=XNNDatatype.xnn_datatype_qcint32,
                     quant=M["PerChannelQuant"](scale=(in_scale * scales).tolist(), channel_dim=0))
        return wv, bv

    x = g.value((1, 3, 8, 8), role="input")
    xq = g.value((1, 3, 8, 8), quant=x_q, datatype=qint8)
    g.node("XNNConvert", M["_XNNNode1x1"](input_id=x, output_id=xq), 1)
    xh = g.value((1, 8, 8, 3), quant=x_q, datatype=qint8)
    g.node("XNNStaticTranspose", M["XNNStaticTranspose"](num_dims=4, perm=[0, 2, 3, 1], input_id=xq, output_id=xh), 2)
    geometry = dict(padding_top=1, padding_right=1, padding_bottom=1, padding_left=1, kernel_height=3,
                    kernel_width=3, subsampling_height=1, subsampling_width=1, dilation_height=1, dilation_width=1)
    wv, bv = conv_weights(torch.randn(6, 3, 3, 3), 0.03, 0)
    c1 = q_value((1, 8, 8, 6), 0.05, -4)
    g.node("XNNConv2d", M["_XNNNodeConv"](**geometry, group_input_channels=3, group_output_channels=6, groups=1,
                                          input1_id=xh, filter_id=wv, bias_id=bv, output_id=c1), 3)
    r1 = q_value((1, 8, 8, 6), 0.05, -4)
    g.node("XNNClamp", M["_XNNNode1x1"](input_id=c1, output_id=r1), 4, clamp=(0.0, 6.0))
    wd, bd = conv_weights(torch.randn(6, 1, 3, 3), 0.05, 3)
    c2 = q_value((1, 8, 8, 6), 0.04, 7)
    g.node("XNNDepthwiseConv2d", M["_XNNNodeConv"](**geometry, group_input_channels=1, group_output_channels=1,
                                                   groups=6, input1_id=r1, filter_id=wd, bias_id=bd, output_id=c2), 5)
    if residual:
        total = q_value((1, 8, 8, 6), 0.04, 7)
        g.node("XNNAdd", M["_XNNNode2x1"](input1_id=c2, input2_id=r1, output_id=total), 8)
        c2 = total
    cn = q_value((1, 6, 8, 8), 0.04, 7)
    g.node("XNNStaticTranspose", M["XNNStaticTranspose"](num_dims=4, perm=[0, 3, 1, 2], input_id=c2, output_id=cn), 6)
    y = g.value((1, 6, 8, 8), role="output")
    g.node("XNNConvert", M["_XNNNode1x1"](input_id=cn, output_id=y), 7)
    return g


def test_int8_convolutions_run_on_integers_within_one_step_of_the_levels_path():
    g = _quantized_conv_graph()
    plan = _init(g.blob(), g.named)
    on_integers = {n.kind for n in plan.nodes if n.int_fn is not None or n.passes_ints}
    assert on_integers == {"XNNConv2d", "XNNClamp", "XNNDepthwiseConv2d", "XNNStaticTranspose"}
    levels_plan = _init(g.blob(), g.named)
    for node in levels_plan.nodes:
        node.int_fn, node.passes_ints = None, False
    x = torch.randn(1, 3, 8, 8)
    outs, recorder = {}, Recorder()
    for name, p, context in (("int", plan, None), ("levels", levels_plan, None), ("logged", plan, recorder)):
        outs[name] = torch.empty(1, 6, 8, 8)
        if name == "levels":  # node by node (an untraced execute runs the steps prepared at init)
            run_plan(p, [x, outs[name]], None)
        else:
            XNNPACK_BACKEND.execute(p, [x, outs[name]], context)
    step = 0.04
    assert (outs["int"] - outs["levels"]).abs().max().item() <= step * 1.001
    assert (outs["logged"] - outs["int"]).abs().max().item() <= step * 1.001
    grid = outs["int"] / step - 7
    torch.testing.assert_close(grid, grid.round(), rtol=0, atol=1e-3)  # on the output's grid
    conv_levels = recorder.outputs[3] / 0.05 + 4  # a value held as integers is logged as its levels (NCHW)
    assert recorder.outputs[3].shape == (1, 6, 8, 8)
    torch.testing.assert_close(conv_levels, conv_levels.round(), rtol=0, atol=1e-3)


@pytest.mark.parametrize("residual", [False, True], ids=["chain", "residual"])
def test_untraced_runs_take_the_prepared_steps_within_one_step_of_node_by_node(residual):
    """An untraced execute runs `_fast`'s steps: the clamp after an int8 convolution fused into it, an
    int8 add on integers, the input quantized straight to integers; the traced run keeps one event per node."""
    g = _quantized_conv_graph(residual)
    plan = _init(g.blob(), g.named)
    assert len(plan.steps) == len(plan.nodes) - 1  # the clamp is part of the convolution's step
    x = torch.randn(1, 3, 8, 8) * 2
    fast, slow, recorder = torch.empty(1, 6, 8, 8), torch.empty(1, 6, 8, 8), Recorder()
    XNNPACK_BACKEND.execute(plan, [x, fast], None)
    run_plan(plan, [x, slow], None)
    assert (fast - slow).abs().max().item() <= 0.04 * 1.001
    assert 0 < (fast != 0).float().mean().item()
    logged = torch.empty(1, 6, 8, 8)
    XNNPACK_BACKEND.execute(plan, [x, logged], recorder)
    assert len(recorder.events) == len(plan.nodes)
    torch.testing.assert_close(logged, slow, rtol=0, atol=0.04 * 1.001)


@pytest.mark.parametrize("core", ["native", "python"])
def test_a_0d_output_of_a_delegate_is_its_1_element_value(tmp_path, core):
    """XNNPACK's graph holds a 0-d tensor as [1] (torchvision's Swin copies a scalar inside a partition):
    the delegate writes it into the program's 0-d output, as it reads a 0-d input."""
    from etlab.compiler import to_edge_transform_and_lower
    from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    from etlab.runtime import Runtime

    class ScalarCopy(torch.nn.Module):
        def forward(self, x, s):
            return x * 2, s.clone()

    inputs = (torch.randn(3, 4), torch.tensor(1.5))
    edge = to_edge_transform_and_lower(torch.export.export(ScalarCopy(), inputs), partitioner=[XnnpackPartitioner()])
    assert "executorch_call_delegate" in str(edge.exported_program().graph)
    (tmp_path / "m.pte").write_bytes(edge.to_executorch().buffer)
    try:
        method = Runtime.get(core=core).load_program(tmp_path / "m.pte").load_method("forward")
    except (ImportError, RuntimeError) as err:  # the native core is an optional build
        pytest.skip(f"runtime core {core!r} unavailable: {err}")
    doubled, scalar = method.execute(list(inputs))
    torch.testing.assert_close(doubled, inputs[0] * 2)
    assert scalar.shape == () and scalar.item() == 1.5


def test_a_tall_1d_convolution_matches_torch_untraced_and_traced():
    """Wav2Letter's Conv1d (250 channels, kernel 32, padding 16) as XNNPACK lowers it: a 32x1 convolution on
    NHWC [1, T, 1, C]. torch 2.13's oneDNN NHWC kernel gets this geometry wrong (errors the size of the
    outputs, eager torch on channels-last inputs too): the backend must notice at load and not use it, and its
    reference path must not take that kernel either."""
    torch.manual_seed(5)
    w, b = torch.randn(64, 250, 32) * 0.05, torch.randn(64)
    g = GraphBuilder()
    x = g.value((1, 100, 1, 250), role="input")
    wv, bv = g.value((64, 32, 1, 250), data=w.permute(0, 2, 1).unsqueeze(2)), g.value((64,), data=b)  # OHWI
    y = g.value((1, 101, 1, 64), role="output")
    g.node("XNNConv2d", M["_XNNNodeConv"](padding_top=16, padding_bottom=16, padding_left=0, padding_right=0,
                                          kernel_height=32, kernel_width=1, subsampling_height=1, subsampling_width=1,
                                          dilation_height=1, dilation_width=1, group_input_channels=250,
                                          group_output_channels=64, groups=1, input1_id=x, filter_id=wv, bias_id=bv,
                                          output_id=y), 1, clamp=(0.0, float("inf")))
    plan = _init(g.blob(), g.named)
    signal = torch.randn(1, 250, 100)
    want = F.conv1d(signal.double(), w.double(), b.double(), padding=16).relu().float()  # [1, 64, 101]
    for context in (None, Recorder()):
        out = torch.empty(1, 101, 1, 64)
        XNNPACK_BACKEND.execute(plan, [signal.permute(0, 2, 1).unsqueeze(2).contiguous(), out], context)
        torch.testing.assert_close(out[:, :, 0].permute(0, 2, 1), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cout, cin, kernel, size, pads", [
    (64, 250, (32, 1), (30, 1), (0, 0, 16, 16)), (256, 500, (31, 1), (60, 1), (0, 0, 15, 15)),
    (32, 24, (3, 3), (9, 9), (1, 1, 1, 1)), (16, 250, (1, 32), (1, 30), (16, 16, 0, 0))])
def test_a_packed_convolution_is_right_or_refused(cout, cin, kernel, size, pads):
    """`prepacked_conv2d` returns a kernel that computes the convolution, or None (then the node runs on
    the reference path): never a wrong one."""
    from etlab.runtime.backends.xnnpack._prepacked import prepacked_conv2d

    torch.manual_seed(2)
    w, b = torch.randn(cout, cin, *kernel) * 0.05, torch.randn(cout)
    run = prepacked_conv2d(w, b, pads, (1, 1), (1, 1), 1, None, [1, cin, *size])
    if run is None:
        return
    x = torch.randn(1, cin, *size)
    want = F.conv2d(F.pad(x.double(), pads), w.double(), b.double()).float()
    torch.testing.assert_close(run(x.permute(0, 2, 3, 1).contiguous()).permute(0, 3, 1, 2), want, rtol=1e-5, atol=1e-4)
