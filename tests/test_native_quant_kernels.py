"""The native core's quantize/dequantize kernels (etlab/runtime/_native/quant.cpp) against the Python
kernels of etlab/runtime/_quant_kernels.py: the same bits on every dtype, layout and special value,
quantized programs that give the same outputs and ETDumps on both cores with no Python step for
q/dq or choose_qparams, and the same errors (naming the instruction) for bad qparams from a file or an input."""

from __future__ import annotations

import math

import pytest
import torch

from etlab.runtime import DebugLevel, ExecutionError, Runtime, _native
from etlab.runtime._quant_kernels import (
    _Q_BOUNDS,
    choose_qparams,
    dequantize_per_channel,
    dequantize_per_tensor,
    native_call,
    quantize_per_channel,
    quantize_per_tensor,
)
from etlab.schema.scalar_type import dtype_to_scalar_type
from tests.compiler._quant import quantized_zoo

pytestmark = pytest.mark.skipif(not _native.available(), reason="needs the native core (make setup builds it)")

QD = "quantized_decomposed::"
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
OUT_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _ops():
    from etlab.runtime._native import _core  # noqa: F401  (registers the etlab_native operators)

    return torch.ops.etlab_native


def _hard_input(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values with ties (k + 0.5 steps), both zeros, infinities and nan among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 40
    special = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 0.25, -0.25, 0.75, -0.75, 1e30, -1e30]
    x[: min(n, len(special))] = torch.tensor(special[:n])
    return x.to(dtype)


def _qrange(q: torch.dtype) -> tuple[int, int]:
    lo, hi = _Q_BOUNDS[q]
    return (lo, hi) if q == torch.int32 else (max(lo, -100), min(hi, 100))  # int32: float32's rounding at 2^31


# Sizes: the AVX2 body alone, its body plus a tail, a tail alone, and one parallel task's worth and more.
@pytest.mark.parametrize("n", [16, 37, 5, 70001])
def test_per_tensor_kernels_are_bit_identical_to_the_python_kernels(n):
    ops = _ops()
    for xdtype in FLOATS:
        x = _hard_input(n, xdtype, n)
        for q in _Q_BOUNDS:
            qmin, qmax = _qrange(q)
            for scale, zp in ((0.5, 0), (0.0237, 3), (1e-3, -7)):
                ref, got = torch.empty(n, dtype=q), torch.full((n,), 99, dtype=q)
                quantize_per_tensor(x, scale, zp, qmin, qmax, dtype_to_scalar_type(q), ref)
                ops.quantize_per_tensor.out(x, scale, zp, qmin, qmax, out=got)
                assert torch.equal(got, ref), (xdtype, q, scale, zp)
                for out_dtype in OUT_FLOATS if xdtype == torch.float32 else ():
                    back_ref, back = torch.empty(n, dtype=out_dtype), torch.empty(n, dtype=out_dtype)
                    dequantize_per_tensor(ref, scale, zp, qmin, qmax, dtype_to_scalar_type(q),
                                          dtype_to_scalar_type(out_dtype), back_ref)
                    ops.dequantize_per_tensor.out(ref, scale, zp, qmin, qmax, out=back)
                    assert torch.equal(back, back_ref), (q, out_dtype, scale, zp)


def test_tensor_qparams_overloads_read_the_tensors_values():
    ops = _ops()
    x = _hard_input(41, torch.float32, 0)
    for scale, zp in ((torch.tensor([0.05], dtype=torch.float64), torch.tensor([4])),
                      (torch.tensor([0.1]), torch.tensor([-2], dtype=torch.int32))):
        ref, got = torch.empty(41, dtype=torch.int8), torch.empty(41, dtype=torch.int8)
        quantize_per_tensor(x, scale, zp, -128, 127, dtype_to_scalar_type(torch.int8), ref)
        ops.quantize_per_tensor.tensor_out(x, scale, zp, -128, 127, out=got)
        assert torch.equal(got, ref)
        back_ref, back = torch.empty(41), torch.empty(41)
        dequantize_per_tensor(ref, scale, zp, -128, 127, dtype_to_scalar_type(torch.int8), None, back_ref)
        ops.dequantize_per_tensor.tensor_out(ref, scale, zp, -128, 127, out=back)
        assert torch.equal(back, back_ref)


@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 3, 9), (11,)])
def test_per_channel_kernels_are_bit_identical_on_every_axis(shape):
    ops = _ops()
    g = torch.Generator().manual_seed(len(shape))
    for axis in range(-len(shape), len(shape)):
        channels = shape[axis]
        for xdtype in FLOATS:
            x = (torch.randn(shape, generator=g) * 30).to(xdtype)
            x.view(-1)[0] = float("nan")
            for sdtype in (torch.float32, torch.float64):
                scales = (torch.rand(channels, generator=g, dtype=torch.float64) * 0.3 + 1e-3).to(sdtype)
                zps = torch.randint(-5, 5, (channels,), generator=g)
                for q in (torch.int8, torch.uint8, torch.int32):
                    qmin, qmax = _qrange(q)
                    z = zps.clamp(min=qmin).to(torch.int32 if q == torch.int32 else torch.int64)
                    ref, got = torch.empty(shape, dtype=q), torch.empty(shape, dtype=q)
                    quantize_per_channel(x, scales, z, axis, qmin, qmax, dtype_to_scalar_type(q), ref)
                    ops.quantize_per_channel.out(x, scales, z, axis, qmin, qmax, out=got)
                    assert torch.equal(got, ref), (axis, xdtype, sdtype, q)
                    for out_dtype in OUT_FLOATS if xdtype == torch.float32 else ():
                        for zz in (z, None):
                            back_ref, back = torch.empty(shape, dtype=out_dtype), torch.empty(shape, dtype=out_dtype)
                            dequantize_per_channel(ref, scales, zz, axis, qmin, qmax, dtype_to_scalar_type(q),
                                                   dtype_to_scalar_type(out_dtype), back_ref)
                            ops.dequantize_per_channel.out(ref, scales, zz, axis, qmin, qmax, out=back)
                            assert torch.equal(back, back_ref), (axis, sdtype, q, out_dtype, zz is None)


def _choose_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(int(torch.randint(1, 40, (1,), generator=g)), generator=g) * 10.0 ** k + shift
          for k in range(-6, 4) for shift in (0.0, 3.0, -3.0)]
    xs += [torch.rand(9).abs(), -torch.rand(9), torch.zeros(4), torch.tensor([float("inf"), 1.0]),
           torch.tensor([-float("inf"), float("inf")]), torch.tensor([float("nan"), 2.0])]
    return [x.to(dtype) for x in xs]


OUTS = ((torch.float64, torch.int64), (torch.float32, torch.int32), (torch.float16, torch.float32))


@pytest.mark.parametrize("dtype", FLOATS)
def test_choose_qparams_is_bit_identical_to_torchs_reference(dtype):
    ops = _ops()
    for x in _choose_inputs(dtype):
        for qmin, qmax, q in ((-128, 127, torch.int8), (0, 255, torch.uint8), (-127, 127, torch.int8)):
            for eps in (2**-12, 0.3):
                for sdtype, zdtype in OUTS:
                    ref = torch.empty(1, dtype=sdtype), torch.empty(1, dtype=zdtype)
                    got = torch.empty(1, dtype=sdtype), torch.empty(1, dtype=zdtype)
                    choose_qparams(x, qmin, qmax, eps, dtype_to_scalar_type(q), *ref)
                    ops.choose_qparams.tensor_out(x, qmin, qmax, eps, scale_out=got[0], zero_point_out=got[1])
                    assert torch.equal(got[0], ref[0]) or (got[0].isnan().all() and ref[0].isnan().all()), x
                    assert torch.equal(got[1], ref[1]), x


def test_strided_and_overlapping_operands_give_the_python_kernels_results():
    ops = _ops()
    x = torch.randn(6, 10).t()  # not contiguous
    ref, got = torch.empty(10, 6, dtype=torch.int8), torch.empty(10, 6, dtype=torch.int8)
    quantize_per_tensor(x, 0.05, 3, -128, 127, 1, ref)
    ops.quantize_per_tensor.out(x, 0.05, 3, -128, 127, out=got)
    assert torch.equal(got, ref)
    scales, zps = torch.rand(6) + 0.01, torch.zeros(6, dtype=torch.int64)
    quantize_per_channel(x, scales, zps, 1, -128, 127, 1, ref)
    ops.quantize_per_channel.out(x, scales, zps, 1, -128, 127, out=got)
    assert torch.equal(got, ref)
    # out written over its own input (a file may plan them into the same bytes): as computed into a temporary
    storage = torch.randint(-128, 127, (64,), dtype=torch.int8)
    q, out = storage[:32], storage.view(torch.float32)[:16]  # out's bytes start where q's do
    expected = (q[:16].float() - 1) * 0.5
    ops.dequantize_per_tensor.out(q[:16], 0.5, 1, -128, 127, out=out)
    assert torch.equal(out, expected)


def test_out_takes_the_inputs_shape_within_its_memory():
    ops = _ops()
    out = torch.empty(12, dtype=torch.int8)
    ops.quantize_per_tensor.out(torch.randn(2, 3), 0.1, 0, -128, 127, out=out)
    assert out.shape == (2, 3) and out.is_contiguous()


@pytest.mark.parametrize("call,message", [
    (lambda o: o.quantize_per_tensor.out(torch.ones(2), 0.0, 0, -128, 127, out=torch.empty(2, dtype=torch.int8)),
     "scale must be finite and positive, got 0.0"),
    (lambda o: o.quantize_per_tensor.out(torch.ones(2), math.nan, 0, -128, 127, out=torch.empty(2, dtype=torch.int8)),
     "scale must be finite and positive, got nan"),
    (lambda o: o.dequantize_per_tensor.tensor_out(torch.ones(2, dtype=torch.int8),
                                                  torch.tensor([-1e-05], dtype=torch.float64), torch.tensor([0]),
                                                  -128, 127, out=torch.empty(2)),
     "scale must be finite and positive, got -1e-05"),
    (lambda o: o.quantize_per_tensor.tensor_out(torch.ones(2), torch.ones(2), torch.zeros(1, dtype=torch.int64),
                                                -128, 127, out=torch.empty(2, dtype=torch.int8)),
     r"scale must be a one-element floating tensor, got torch.float32 of shape \(2,\)"),
    (lambda o: o.quantize_per_tensor.out(torch.ones(2, dtype=torch.int32), 0.1, 0, -128, 127,
                                         out=torch.empty(2, dtype=torch.int8)), "input must be float"),
    (lambda o: o.quantize_per_tensor.out(torch.ones(2), 0.1, 0, -300, 127, out=torch.empty(2, dtype=torch.int8)),
     r"\[-300, 127\] is not a range within torch.int8's \[-128, 127\]"),
    (lambda o: o.quantize_per_tensor.out(torch.ones(2), 0.1, 0, -128, 127, out=torch.empty(2)),
     "quantized dtype torch.float32 is not one of"),
    (lambda o: o.dequantize_per_tensor.out(torch.ones(2, dtype=torch.int8), 0.1, 0, -128, 127,
                                           out=torch.empty(2, dtype=torch.int32)), "out_dtype must be floating"),
    (lambda o: o.dequantize_per_channel.out(torch.ones(2, 3, dtype=torch.int8), torch.ones(2), None, 2, -127, 127,
                                            out=torch.empty(2, 3)), "axis 2 is out of range"),
    (lambda o: o.dequantize_per_channel.out(torch.ones(2, 3, dtype=torch.int8), torch.ones(3), None, 0, -127, 127,
                                            out=torch.empty(2, 3)), "scales must be a 1-d floating tensor of 2"),
    (lambda o: o.quantize_per_channel.out(torch.ones(2, 3), torch.ones(2), torch.zeros(5, dtype=torch.int64), 0, -127,
                                          127, out=torch.empty(2, 3, dtype=torch.int8)),
     "zero_points must be a 1-d integer tensor of 2"),
    (lambda o: o.choose_qparams.tensor_out(torch.ones(0), -128, 127, 1e-5, scale_out=torch.empty(1),
                                           zero_point_out=torch.empty(1, dtype=torch.int64)), "the input is empty"),
    (lambda o: o.choose_qparams.tensor_out(torch.ones(3), 1, 127, 1e-5, scale_out=torch.empty(1),
                                           zero_point_out=torch.empty(1, dtype=torch.int64)), "must include 0"),
    (lambda o: o.dequantize_per_channel.out(torch.ones(2, 3, dtype=torch.int8), torch.ones(2),
                                            torch.zeros(2, dtype=torch.bool), 0, -127, 127, out=torch.empty(2, 3)),
     "zero_points must be a 1-d integer tensor of 2"),
    (lambda o: o.dequantize_per_channel.out(torch.ones(2, 3, dtype=torch.int8), torch.ones(2, dtype=torch.float16),
                                            None, 0, -127, 127, out=torch.empty(2, 3)), "float32/float64 scales"),
])
def test_native_kernels_check_their_arguments_on_every_call(call, message):
    with pytest.raises(ValueError, match=message):
        call(_ops())


def test_bool_zero_points_are_refused_at_load_by_the_python_kernels_too():
    with pytest.raises(ValueError, match="zero_points must be a 1-d integer tensor of 2"):
        dequantize_per_channel(torch.ones(2, 3, dtype=torch.int8), torch.ones(2), torch.zeros(2, dtype=torch.bool), 0,
                               -127, 127, dtype_to_scalar_type(torch.int8), None, torch.empty(2, 3))


def test_native_call_binds_only_what_the_native_kernels_compute():
    x, q, out = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.int8), torch.empty(2, 3)
    s32, z = torch.ones(3), torch.zeros(3, dtype=torch.int64)
    per_tensor = native_call(QD + "quantize_per_tensor.out", [x, 0.1, 0, -128, 127, 1, q], False)
    assert per_tensor == ("etlab_native::quantize_per_tensor", "out", [x, 0.1, 0, -128, 127, q])
    assert native_call(QD + "quantize_per_tensor.Tensor_out", [x, torch.ones(1), 0, -128, 127, 1, q], True) is None
    assert native_call(QD + "dequantize_per_channel.out", [q, s32, z, 1, -128, 127, 1, None, out], True)[1] == "out"
    assert native_call(QD + "dequantize_per_channel.out", [q, s32, z, 1, -128, 127, 1, None, out], False) is None
    assert native_call(QD + "dequantize_per_channel.out", [q, s32.half(), z, 1, -128, 127, 1, None, out], True) is None
    assert native_call(QD + "choose_qparams.Tensor_out", [x, -128, 127, 1e-5, 1, s32, z], False)[1] == "tensor_out"


# -- programs ---------------------------------------------------------------------------------------------------

def _load(core: str, pte: bytes, **kwargs):
    program = Runtime.get(core=core).load_program(pte, **kwargs)
    return program, program.load_method("forward")


def _python_quant_steps(method) -> dict:
    return {op: n for op, n in method._core.python_steps.items() if op.startswith(QD)}


@pytest.mark.parametrize("name,mode", [("mlp", "static"), ("cnn", "static"), ("mobilenet_v2", "static"),
                                       ("mlp", "dynamic"), ("transformer", "dynamic")])
def test_quantized_programs_run_qdq_natively_with_the_python_cores_bits(name, mode):
    _, inputs, eager, pte, _ = quantized_zoo(name, mode)
    _, native = _load("native", pte)
    _, python = _load("python", pte)
    assert not _python_quant_steps(native)  # every quantize/dequantize/choose_qparams is a native step
    for scale in (1.0, 0.5) if name != "mobilenet_v2" else (1.0,):
        args = [t * scale if t.is_floating_point() else t for t in inputs]
        for got, want in zip(native.execute(args), python.execute(args)):
            assert torch.equal(got, want)
    if mode == "static":
        assert torch.equal(native.execute(list(inputs))[0], eager[0])


def test_quantized_program_etdumps_log_the_same_values_on_both_cores():
    _, inputs, _, pte, _ = quantized_zoo("mlp", "static")
    buffers = []
    for core in ("native", "python"):
        program, method = _load(core, pte, enable_etdump=True, debug_buffer_size=1 << 20,
                                 etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
        method.execute(list(inputs))
        buffers.append(program._tracer.debug_buffer())
    assert buffers[0] == buffers[1] and len(buffers[0]) > 0


def test_a_bad_scale_from_an_input_fails_the_run_alike_and_the_method_stays_usable():
    """choose_qparams of an input holding inf gives scale inf: the quantize that reads it fails on
    both cores with the same error naming the instruction; the next run is fine."""
    _, inputs, _, pte, _ = quantized_zoo("mlp", "dynamic")
    errors, outputs = [], []
    for core in ("native", "python"):
        _, method = _load(core, pte)
        bad = inputs[0].clone()
        bad.view(-1)[3] = float("inf")
        with pytest.raises(ExecutionError, match="scale must be finite and positive, got inf") as info:
            method.execute([bad])
        errors.append(str(info.value))
        outputs.append(method.execute(list(inputs))[0])
    assert errors[0] == errors[1] and "quantize_per_tensor.Tensor_out, debug handle" in errors[0]
    assert torch.equal(outputs[0], outputs[1])


def _tampered_scale_pte() -> bytes:
    """The dynamic MLP with its first quantize_per_tensor.Tensor_out reading its scale from a float
    constant of several elements (a bias): well-typed, so it loads; wrong in size, so every run fails."""
    from etlab.schema import deserialize_pte, serialize_pte
    from etlab.schema import program as P

    pte = deserialize_pte(quantized_zoo("mlp", "dynamic")[3])
    plan = pte.program.execution_plan[0]
    index = next(i for i, op in enumerate(plan.operators)
                 if op.name == QD + "quantize_per_tensor" and op.overload == "Tensor_out")
    bias = next(i for i, v in enumerate(plan.values) if isinstance(v.val, P.Tensor) and v.val.data_buffer_idx > 0
                and int(v.val.scalar_type) == 6 and math.prod(v.val.sizes) > 1)
    call = next(ins.instr_args for ins in plan.chains[0].instructions
                if isinstance(ins.instr_args, P.KernelCall) and ins.instr_args.op_index == index)
    call.args[1] = bias
    return serialize_pte(pte.program, [bytes(s) for s in pte.segments])


def test_a_hostile_scale_tensor_fails_every_run_naming_the_instruction_on_both_cores():
    pte = _tampered_scale_pte()
    _, inputs, _, _, _ = quantized_zoo("mlp", "dynamic")
    errors = []
    for core in ("native", "python"):
        _, method = _load(core, pte)
        for _ in range(2):
            with pytest.raises(ExecutionError, match="scale must be a one-element floating tensor") as info:
                method.execute(list(inputs))
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "instruction" in errors[0]
