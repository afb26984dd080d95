"""Quantized programs through the compiler: q/dq kept through edge, upstream's out-variant names in the
operator table, int8 weights in the .pte (quantize ops on constants folded), torchao's own quantizer as input."""

from __future__ import annotations

import collections

import torch
from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

from etlab.compiler import EtlabQuantizer, to_edge
from etlab.models import make_mlp
from etlab.runtime import Runtime
from etlab.schema import deserialize_pte
from etlab.schema import program as P
from tests.compiler._quant import as_list, assert_within_one_step, output_steps, quantize, quantized_zoo

qd = torch.ops.quantized_decomposed


def _program(pte: bytes) -> P.Program:
    return deserialize_pte(pte).program


def _operators(pte: bytes) -> set[tuple[str, str]]:
    return {(op.name, op.overload) for op in _program(pte).execution_plan[0].operators}


def _constants(pte: bytes) -> collections.Counter:
    """Bytes of constant data per dtype (tensors with a data buffer)."""
    counts: collections.Counter = collections.Counter()
    for value in _program(pte).execution_plan[0].values:
        t = value.val
        if isinstance(t, P.Tensor) and t.data_buffer_idx > 0:
            numel = 1
            for s in t.sizes:
                numel *= s
            counts[t.scalar_type.name] += numel
    return counts


def test_static_program_uses_upstream_out_variant_names_and_int8_weights():
    _, _, _, pte, _ = quantized_zoo("mlp")
    ops = _operators(pte)
    assert ("quantized_decomposed::quantize_per_tensor", "out") in ops
    assert ("quantized_decomposed::dequantize_per_tensor", "out") in ops
    assert ("quantized_decomposed::dequantize_per_channel", "out") in ops
    assert not any(name == "quantized_decomposed::quantize_per_channel" for name, _ in ops)
    model, _ = make_mlp()
    weights = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight"))
    constants = _constants(pte)
    assert constants["CHAR"] == weights                     # every weight element stored as int8
    assert constants["FLOAT"] < weights // 10               # floats: biases and per-channel scales only


def test_dynamic_program_chooses_qparams_with_tensor_overloads():
    _, _, _, pte, _ = quantized_zoo("mlp", "dynamic")
    ops = _operators(pte)
    assert ("quantized_decomposed::choose_qparams", "Tensor_out") in ops
    assert ("quantized_decomposed::quantize_per_tensor", "Tensor_out") in ops
    assert ("quantized_decomposed::dequantize_per_tensor", "Tensor_out") in ops


def test_int8_program_is_much_smaller_than_float():
    model, inputs = make_mlp()
    float_pte = to_edge(torch.export.export(model, inputs)).to_executorch().buffer
    _, _, _, int8_pte, _ = quantized_zoo("mlp")
    assert len(int8_pte) < len(float_pte) * 0.6  # 27 KB of float weights -> 7 KB of int8; the rest is program


def test_weight_quantize_left_in_graph_is_folded_at_compile_time():
    model, inputs = make_mlp()
    gm = quantize(model, inputs, EtlabQuantizer(), fold_quantize=False)
    assert sum(n.target is qd.quantize_per_channel.default for n in gm.graph.nodes) == 3  # float weights in graph
    edge = to_edge(torch.export.export(gm, inputs))
    targets = [n.target for n in edge.exported_program().graph.nodes]
    assert qd.quantize_per_channel.default not in targets
    assert targets.count(qd.dequantize_per_channel.default) == 3
    pte = edge.to_executorch().buffer
    assert _constants(pte) == _constants(quantized_zoo("mlp")[3])  # same int8 weights as convert's folding
    outputs = Runtime.get().load_program(pte).load_method("forward").execute(list(inputs))
    with torch.no_grad():
        assert_within_one_step(outputs, as_list(gm(*inputs)), output_steps(gm))


def test_out_variants_run_in_eager_like_the_functional_ops():
    from etlab.compiler._quantizer_ops import register_quantized_out_variants

    register_quantized_out_variants()
    register_quantized_out_variants()  # idempotent
    x = torch.randn(3, 4)
    out = torch.empty(3, 4, dtype=torch.int8)
    qd.quantize_per_tensor.out(x, 0.02, 3, -128, 127, torch.int8, out=out)
    assert torch.equal(out, qd.quantize_per_tensor.default(x, 0.02, 3, -128, 127, torch.int8))
    scale, zp = torch.empty(1, dtype=torch.float64), torch.empty(1, dtype=torch.int64)
    qd.choose_qparams.Tensor_out(x, -128, 127, 2**-12, torch.int8, scale_out=scale, zero_point_out=zp)
    ref_scale, ref_zp = qd.choose_qparams.tensor(x, -128, 127, 2**-12, torch.int8)
    assert torch.equal(scale, ref_scale) and torch.equal(zp, ref_zp)


def test_torchao_xnnpack_style_quantizer_output_compiles_and_runs():
    model, inputs = make_mlp()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    gm = quantize(model, inputs, quantizer)
    pte = to_edge(torch.export.export(gm, inputs)).to_executorch().buffer
    outputs = Runtime.get().load_program(pte).load_method("forward").execute(list(inputs))
    with torch.no_grad():
        assert_within_one_step(outputs, as_list(gm(*inputs)), output_steps(gm))
    assert ("quantized_decomposed::dequantize_per_channel", "out") in _operators(pte)


def test_torchao_x86_quantizer_uint8_activations_compile_and_run():
    """Another of torchao's quantizers: uint8 activations ([0, 255] with a zero point), int8 weights."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    model, inputs = make_mlp()
    gm = quantize(model, inputs, X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
    assert any(n.target is qd.quantize_per_tensor.default and n.args[-1] is torch.uint8 for n in gm.graph.nodes)
    pte = to_edge(torch.export.export(gm, inputs)).to_executorch().buffer
    outputs = Runtime.get().load_program(pte).load_method("forward").execute(list(inputs))
    with torch.no_grad():
        assert_within_one_step(outputs, as_list(gm(*inputs)), output_steps(gm))
