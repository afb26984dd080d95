"""EtlabQuantizer through torchao's prepare_pt2e / convert_pt2e: patterns, fusions, configuration, dynamic mode."""

from __future__ import annotations

import collections
import functools
import warnings

import pytest
import torch
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from etlab.compiler import EtlabQuantizer, int8_dynamic_config, int8_static_config
from etlab.models import make_cnn, make_mlp, make_transformer

qd = torch.ops.quantized_decomposed
aten = torch.ops.aten


def quantize(model, inputs, quantizer):
    """torch.export -> prepare -> calibrate on `inputs` -> convert (warnings of torchao's own silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = torch.export.export(model, inputs).module()
        prepared = prepare_pt2e(gm, quantizer)
        prepared(*inputs)
        return convert_pt2e(prepared)


def ops(gm) -> collections.Counter:
    return collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_function")


def sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).mean() / (ref - out).pow(2).mean()))


@functools.cache
def _quantized_mlp():
    model, inputs = make_mlp()
    return model, inputs, quantize(model, inputs, EtlabQuantizer())


def test_static_mlp_int8_weights_per_channel_and_accurate():
    model, inputs, gm = _quantized_mlp()
    counts = ops(gm)
    assert counts[qd.dequantize_per_channel.default] == 3          # one per linear weight
    assert counts[qd.quantize_per_channel.default] == 0            # weights folded to int8 by convert
    int8_weights = [n for n in gm.graph.nodes if n.op == "get_attr"
                    and functools.reduce(getattr, n.target.split("."), gm).dtype == torch.int8]
    assert len(int8_weights) == 3
    for n in gm.graph.nodes:
        if n.target is qd.dequantize_per_channel.default:
            assert n.args[3] == 0 and (n.args[4], n.args[5]) == (-127, 127)  # axis 0, symmetric range
    assert sqnr(model(*inputs), gm(*inputs)) > 30


def test_linear_relu_fused_no_requantization_between():
    _, _, gm = _quantized_mlp()
    relus = [n for n in gm.graph.nodes if n.target in (aten.relu.default, aten.relu_.default)]
    assert len(relus) == 2
    for relu in relus:
        assert relu.args[0].target is aten.linear.default  # no q/dq pair between linear and relu
        (q,) = relu.users
        assert q.target is qd.quantize_per_tensor.default


def test_conv_bn_relu6_fused_and_cnn_accurate():
    model, inputs = make_cnn()
    gm = quantize(model, inputs, EtlabQuantizer())
    counts = ops(gm)
    assert not any("batch_norm" in str(t) for t in counts)           # folded into the conv
    for n in gm.graph.nodes:
        if n.target is aten.hardtanh.default:
            assert n.args[0].target is aten.conv2d.default
    # mean over H, W shares its input's qparams: its q uses the same scale as the dq feeding it
    (mean,) = [n for n in gm.graph.nodes if n.target is aten.mean.dim]
    dq_in, q_out = mean.args[0], next(iter(mean.users))
    assert dq_in.target is qd.dequantize_per_tensor.default and q_out.target is qd.quantize_per_tensor.default
    assert dq_in.args[1:3] == q_out.args[1:3]
    assert sqnr(model(*inputs), gm(*inputs)) > 25


def test_transformer_matmul_and_mul_quantized():
    model, inputs = make_transformer()
    gm = quantize(model, inputs, EtlabQuantizer())
    for n in gm.graph.nodes:
        if n.target is aten.matmul.default:
            assert all(a.target is qd.dequantize_per_tensor.default for a in n.args[:2])
    assert sqnr(model(*inputs), gm(*inputs)) > 20


class _CatPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.cat([self.a(x), self.b(x) * 3.0], dim=1)
        return torch.nn.functional.max_pool2d(y, 2) + torch.nn.functional.adaptive_avg_pool2d(y, 4)


def test_cat_and_pooling_share_qparams():
    torch.manual_seed(0)
    model, inputs = _CatPool().eval(), (torch.randn(1, 3, 8, 8),)
    gm = quantize(model, inputs, EtlabQuantizer())
    (cat,) = [n for n in gm.graph.nodes if n.target is aten.cat.default]
    params = {tuple(a.args[1:3]) for a in cat.args[0]}
    assert all(a.target is qd.dequantize_per_tensor.default for a in cat.args[0])
    (q_out,) = cat.users
    params.add(tuple(q_out.args[1:3]))
    assert len(params) == 1  # inputs and output share one scale / zero point
    pools = [n for n in gm.graph.nodes if n.target in (aten.max_pool2d.default, aten.adaptive_avg_pool2d.default)]
    assert len(pools) == 2
    for pool in pools:
        (q,) = pool.users
        assert tuple(q.args[1:3]) == tuple(pool.args[0].args[1:3])
    assert sqnr(model(*inputs), gm(*inputs)) > 25


def _per_channel_weights(gm) -> int:
    return ops(gm)[qd.dequantize_per_channel.default]


def test_exclusion_by_module_name_keeps_that_layer_float():
    model, inputs = make_mlp()
    gm = quantize(model, inputs, EtlabQuantizer().set_module_name("fc2", None))
    assert _per_channel_weights(gm) == 2
    (fc2,) = [n for n in gm.graph.nodes if n.target is aten.linear.default
              and "fc2" in str(n.meta.get("nn_module_stack"))]
    assert fc2.args[1].op == "get_attr"  # the float weight itself, no dequantize
    assert functools.reduce(getattr, fc2.args[1].target.split("."), gm).dtype == torch.float32
    (relu,) = fc2.users
    assert relu.target in (aten.relu.default, aten.relu_.default)  # not quantized after fc2 (no q between)


def _under(node, prefix: str) -> bool:
    names = [v[0] for v in (node.meta.get("nn_module_stack") or {}).values()]
    return any(n == prefix or n.startswith(prefix + ".") for n in names)


def test_module_name_most_specific_wins_and_module_type_and_operator_type():
    model, inputs = make_cnn()
    q = EtlabQuantizer().set_module_name("features", None).set_module_name("features.1", int8_static_config())
    gm = quantize(model, inputs, q)
    convs = [n for n in gm.graph.nodes if n.target is aten.conv2d.default]
    assert sum(_under(n, "features.1") for n in convs) == 2
    for conv in convs:
        quantized = conv.args[1].target is qd.dequantize_per_channel.default
        assert quantized == _under(conv, "features.1"), conv.name
    assert _per_channel_weights(gm) == 3  # features.1's two convs and the classifier
    gm = quantize(model, inputs, EtlabQuantizer().set_module_type(nn.Linear, None))
    assert _per_channel_weights(gm) == 16  # the classifier's linear stays float
    gm = quantize(model, inputs, EtlabQuantizer().set_operator_type(aten.conv2d.default, None))
    assert _per_channel_weights(gm) == 1
    gm = quantize(model, inputs, EtlabQuantizer(int8_static_config(per_channel=False)))
    assert _per_channel_weights(gm) == 0 and ops(gm)[qd.dequantize_per_tensor.default] > 17


def test_global_none_quantizes_nothing_but_one_module():
    model, inputs = make_mlp()
    gm = quantize(model, inputs, EtlabQuantizer().set_global(None).set_module_name("fc3", int8_static_config()))
    assert _per_channel_weights(gm) == 1


def test_dynamic_linear_chooses_qparams_at_run_time():
    model, inputs = make_mlp()
    gm = quantize(model, inputs, EtlabQuantizer(int8_dynamic_config()))
    counts = ops(gm)
    assert counts[qd.choose_qparams.tensor] == 3
    assert counts[qd.quantize_per_tensor.tensor] == 3 and counts[qd.quantize_per_tensor.default] == 0
    assert counts[qd.dequantize_per_channel.default] == 3
    # qparams follow the input: a 10x larger input still quantizes well (static ones would clip)
    big = (inputs[0] * 10,)
    assert sqnr(model(*big), gm(*big)) > 30


def test_setters_reject_wrong_types():
    with pytest.raises(TypeError, match="module_name"):
        EtlabQuantizer().set_module_name(3, None)
    with pytest.raises(TypeError, match="module_type"):
        EtlabQuantizer().set_module_type("Linear", None)
    with pytest.raises(TypeError, match="operator"):
        EtlabQuantizer().set_operator_type(torch.relu, None)
