"""Quantized zoo programs on both runtime cores, against torchao's converted model run in torch eager;
the quantized_decomposed kernels' arithmetic and their checks of arguments read from a file."""

from __future__ import annotations

import pytest
import torch

from etlab.runtime import Runtime
from etlab.runtime._quant_kernels import (
    choose_qparams,
    dequantize_per_channel,
    dequantize_per_tensor,
    quantize_per_channel,
    quantize_per_tensor,
)
from tests.compiler._quant import as_list, assert_within_one_step, quantized_zoo
from tests.runtime import _cores

runtime_core = _cores.runtime_core  # autouse: every test here runs on both cores
qd = torch.ops.quantized_decomposed
INT8 = 1  # ExecuTorch ScalarType of int8 (kernels receive dtypes as these numbers from a .pte)
FLOAT = 6


@pytest.mark.parametrize("name,mode", [("mlp", "static"), ("cnn", "static"), ("transformer", "static"),
                                       ("mobilenet_v2", "static"),
                                       ("mlp", "dynamic"), ("transformer", "dynamic")])
def test_quantized_zoo_matches_eager_converted_model(name, mode):
    _, inputs, eager, pte, steps = quantized_zoo(name, mode)
    method = Runtime.get().load_program(pte).load_method("forward")
    for _ in range(2):
        assert_within_one_step(method.execute(list(inputs)), eager, steps)
    if mode == "static":
        assert all(s is not None for s in steps)  # the outputs really are dequantized int8
        assert torch.equal(method.execute(list(inputs))[0], eager[0])  # and in fact bit-exact


def test_dynamic_qparams_follow_each_input():
    gm, inputs, _, pte, steps = quantized_zoo("mlp", "dynamic")
    method = Runtime.get().load_program(pte).load_method("forward")
    for factor in (0.01, 10.0):
        scaled = [inputs[0] * factor]
        with torch.no_grad():
            expected = as_list(gm(*scaled))
        assert_within_one_step(method.execute(scaled), expected, steps)


# -- the kernels themselves ------------------------------------------------------------------------------------

def test_per_tensor_kernels_match_torch_reference_including_ties_and_clamping():
    x = torch.tensor([-3.0, -0.25, -0.15, -0.05, 0.05, 0.15, 0.25, 0.35, 1.0, 100.0, -100.0])
    out = torch.empty(x.shape, dtype=torch.int8)
    quantize_per_tensor(x, 0.1, 2, -128, 127, INT8, out)
    assert torch.equal(out, qd.quantize_per_tensor.default(x, 0.1, 2, -128, 127, torch.int8))
    assert out[-2] == 127 and out[-1] == -128
    back = torch.empty(x.shape)
    dequantize_per_tensor(out, 0.1, 2, -128, 127, INT8, None, back)
    assert torch.equal(back, qd.dequantize_per_tensor.default(out, 0.1, 2, -128, 127, torch.int8))
    # the .Tensor_out overloads take one-element tensors
    quantize_per_tensor(x, torch.tensor([0.1], dtype=torch.float64), torch.tensor([2]), -128, 127, INT8, out)
    assert torch.equal(out, qd.quantize_per_tensor.default(x, 0.1, 2, -128, 127, torch.int8))


def test_per_channel_kernels_on_any_axis():
    w = torch.randn(4, 3, 2)
    scales, zps = torch.tensor([0.01, 0.02, 0.03]), torch.zeros(3, dtype=torch.int64)
    q = torch.empty(w.shape, dtype=torch.int8)
    quantize_per_channel(w, scales, zps, 1, -127, 127, INT8, q)
    assert torch.equal(q, qd.quantize_per_channel.default(w, scales, zps, 1, -127, 127, torch.int8))
    back = torch.empty(w.shape)
    dequantize_per_channel(q, scales, zps, -2, -127, 127, INT8, FLOAT, back)  # negative axis: same channel
    assert torch.equal(back, qd.dequantize_per_channel.default(q, scales, zps, 1, -127, 127, torch.int8))


def test_choose_qparams_kernel():
    x = torch.randn(5, 7)
    scale, zp = torch.empty(1, dtype=torch.float64), torch.empty(1, dtype=torch.int64)
    choose_qparams(x, -128, 127, 2**-12, INT8, scale, zp)
    ref_scale, ref_zp = qd.choose_qparams.tensor(x, -128, 127, 2**-12, torch.int8)
    assert torch.equal(scale, ref_scale) and torch.equal(zp, ref_zp)


@pytest.mark.parametrize("call,message", [
    (lambda: quantize_per_tensor(torch.ones(2), 0.0, 0, -128, 127, INT8, torch.empty(2, dtype=torch.int8)),
     "scale must be finite and positive"),
    (lambda: quantize_per_tensor(torch.ones(2), float("nan"), 0, -128, 127, INT8, torch.empty(2, dtype=torch.int8)),
     "scale must be finite"),
    (lambda: quantize_per_tensor(torch.ones(2, dtype=torch.int32), 0.1, 0, -128, 127, INT8,
                                 torch.empty(2, dtype=torch.int8)), "input must be float"),
    (lambda: quantize_per_tensor(torch.ones(2), 0.1, 0, -300, 127, INT8, torch.empty(2, dtype=torch.int8)),
     "not a range within"),
    (lambda: quantize_per_tensor(torch.ones(2), 0.1, 0, 5, 4, INT8, torch.empty(2, dtype=torch.int8)),
     "not a range within"),
    (lambda: quantize_per_tensor(torch.ones(2), 0.1, 0, -128, 127, INT8, torch.empty(2)), "out has dtype"),
    (lambda: quantize_per_tensor(torch.ones(2), torch.ones(2), torch.zeros(1, dtype=torch.int64), -128, 127, INT8,
                                 torch.empty(2, dtype=torch.int8)), "one-element floating tensor"),
    (lambda: dequantize_per_tensor(torch.ones(2, dtype=torch.int32), 0.1, 0, -128, 127, INT8, None, torch.empty(2)),
     "input has dtype"),
    (lambda: dequantize_per_tensor(torch.ones(2, dtype=torch.int8), 0.1, 0, -128, 127, INT8, 4, torch.empty(2)),
     "out_dtype must be floating"),
    (lambda: dequantize_per_channel(torch.ones(2, 3, dtype=torch.int8), torch.ones(2), None, 2, -127, 127, INT8,
                                    None, torch.empty(2, 3)), "axis 2 is out of range"),
    (lambda: dequantize_per_channel(torch.ones(2, 3, dtype=torch.int8), torch.ones(3), None, 0, -127, 127, INT8,
                                    None, torch.empty(2, 3)), "scales must be a 1-d floating tensor of 2"),
    (lambda: quantize_per_channel(torch.ones(2, 3), torch.ones(2), torch.zeros(5, dtype=torch.int64), 0, -127, 127,
                                  INT8, torch.empty(2, 3, dtype=torch.int8)),
     "zero_points must be a 1-d integer tensor of 2"),
    (lambda: choose_qparams(torch.ones(0), -128, 127, 2**-12, INT8, torch.empty(1), torch.empty(1)), "empty"),
    (lambda: choose_qparams(torch.ones(3), -128, 127, 2**-12, 99, torch.empty(1), torch.empty(1)), ""),
])
def test_kernels_reject_bad_arguments_with_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -- hostile programs: a .pte whose quantize call is tampered with fails to load, naming the instruction ---------

def _tampered(change) -> bytes:
    """The quantized MLP with `change(plan, args)` applied to its first quantize_per_tensor call."""
    from etlab.schema import deserialize_pte, serialize_pte
    from etlab.schema import program as P

    pte = deserialize_pte(quantized_zoo("mlp")[3])
    plan = pte.program.execution_plan[0]
    index = next(i for i, op in enumerate(plan.operators)
                 if op.name == "quantized_decomposed::quantize_per_tensor" and op.overload == "out")
    for instruction in plan.chains[0].instructions:
        call = instruction.instr_args
        if isinstance(call, P.KernelCall) and call.op_index == index:
            change(plan, call.args)
            break
    return serialize_pte(pte.program, [bytes(s) for s in pte.segments])


def _constant_slot(plan) -> int:
    from etlab.schema import program as P

    return next(i for i, v in enumerate(plan.values) if isinstance(v.val, P.Tensor) and v.val.data_buffer_idx > 0)


@pytest.mark.parametrize("change,message", [
    (lambda plan, args: setattr(plan.values[args[1]].val, "double_val", 0.0), "scale must be finite and positive"),
    (lambda plan, args: setattr(plan.values[args[1]].val, "double_val", float("inf")), "scale must be finite"),
    (lambda plan, args: setattr(plan.values[args[3]].val, "int_val", -1000), "not a range within"),
    (lambda plan, args: args.__setitem__(6, _constant_slot(plan)), "constant data"),
    (lambda plan, args: args.__setitem__(0, args[1]), "must be a tensor"),
])
def test_tampered_quantize_call_fails_at_load_naming_the_instruction(change, message):
    from etlab.runtime import LoadError

    program = Runtime.get().load_program(_tampered(change))
    with pytest.raises(LoadError, match=message) as info:
        program.load_method("forward")
    assert "instruction" in str(info.value)
