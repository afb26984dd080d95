"""BundledProgram / MethodTestSuite / MethodTestCase: validation and the .bpte round trip."""

from __future__ import annotations

import pytest
import torch

from etlab.devtools import (
    BundledProgram,
    MethodTestCase,
    MethodTestSuite,
    bundled_value,
    deserialize_from_flatbuffer_to_bundled_program,
    load_bundled_input,
    load_bundled_program,
    method_test_suites_from_schema,
    serialize_from_bundled_program_to_flatbuffer,
    value_from_bundled,
    verify_method_outputs,
)
from etlab.errors import FormatError
from etlab.schema import bundled_program as B


def _cases(module, inputs, n=2):
    cases = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(inputs[0].shape, generator=g)
        with torch.no_grad():
            cases.append(MethodTestCase([x], module(x)))
    return cases


def test_round_trip(mlp, tmp_path):
    module, inputs, et = mlp
    cases = _cases(module, inputs)
    bp = BundledProgram(et, [MethodTestSuite("forward", cases)])
    data = serialize_from_bundled_program_to_flatbuffer(bp)
    assert isinstance(data, bytes) and data[4:8] == b"BP08"
    schema = deserialize_from_flatbuffer_to_bundled_program(data)
    assert schema.version == B.BUNDLED_PROGRAM_VERSION and bytes(schema.program) == et.buffer
    (suite,) = method_test_suites_from_schema(schema)
    assert suite.method_name == "forward" and len(suite.test_cases) == 2
    for got, want in zip(suite.test_cases, cases):
        assert all(torch.equal(a, b) for a, b in zip(got.inputs + got.expected_outputs,
                                                     want.inputs + want.expected_outputs))
    # The same bundle from the .pte file (path or bytes) serializes identically.
    pte = tmp_path / "m.pte"
    pte.write_bytes(et.buffer)
    for source in (pte, str(pte), et.buffer):
        assert serialize_from_bundled_program_to_flatbuffer(
            BundledProgram(None, [MethodTestSuite("forward", cases)], pte_file=source)) == data


def test_values_keep_dim_order_and_kinds():
    # A transposed view is stored densely in its own dim order; prims keep their kinds.
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    case = MethodTestCase([base.t(), base[:, ::2], 3, True, 2.5, torch.tensor([True, False])])
    vals = [bundled_value(v) for v in case.inputs]
    assert vals[0].val.dim_order == [1, 0] and bytes(vals[0].val.data) == base.numpy().tobytes()
    assert vals[1].val.dim_order == [0, 1] and len(vals[1].val.data) == 6 * 4
    assert [type(v.val) for v in vals[2:5]] == [B.Int, B.Bool, B.Double]
    back = [value_from_bundled(v) for v in vals]
    assert torch.equal(back[0], base.t()) and back[0].stride() == (1, 4)
    assert torch.equal(back[1], base[:, ::2])
    assert back[2:5] == [3, True, 2.5] and type(back[2]) is int
    assert torch.equal(back[5], torch.tensor([True, False]))


def test_flattens_nested_containers():
    x = torch.ones(2)
    case = MethodTestCase(((x, [1, 2.0]), {"k": False}))
    assert [type(v) for v in case.inputs] == [torch.Tensor, int, float, bool]
    assert len(MethodTestCase(x).inputs) == 1  # a lone tensor is one input, as upstream flattens it


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda x, y: [MethodTestSuite("fwd", [MethodTestCase([x], y)])],
         r"MethodTestSuite 'fwd': the program has no method 'fwd'; its methods are \['forward'\]"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([x], y), MethodTestCase([x.double()])])],
         r"MethodTestSuite 'forward', test case 1, input 0: dtype torch.float64, but the method's input 0 is "
         r"torch.float32"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([x, x])])],
         r"test case 0: 2 inputs given, but method 'forward' takes 1"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([])])],
         r"test case 0: 0 inputs given, but method 'forward' takes 1"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([1.5])])],
         r"test case 0, input 0: a float, but the method's input 0 is a Tensor"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([x[:2]])])],
         r"test case 0, input 0: shape \[2, 32\], but the method's is \[4, 32\]"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([x], y.long())])],
         r"test case 0, expected output 0: dtype torch.int64, but the method's output 0 is torch.float32"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([x], [y, y])])],
         r"test case 0: 2 expected outputs given, but method 'forward' returns 1"),
        (lambda x, y: [MethodTestSuite("forward", [MethodTestCase([x], [3])])],
         r"test case 0, expected output 0: an int; expected outputs must be tensors"),
        (lambda x, y: [MethodTestSuite("forward", []), MethodTestSuite("forward", [])],
         r"two suites for method 'forward'"),
        (lambda x, y: MethodTestSuite("forward", []), r"method_test_suites must be a list of MethodTestSuite"),
    ],
    ids=["method", "dtype", "arity", "no-inputs", "kind", "shape", "out-dtype", "out-arity", "out-kind", "dup",
         "not-list"],
)
def test_validation_errors(mlp, make, match):
    module, inputs, et = mlp
    with pytest.raises(ValueError, match=match):
        BundledProgram(et, make(inputs[0], module(inputs[0])))


def test_config_and_argument_errors(mlp):
    _, inputs, et = mlp
    with pytest.raises(ValueError, match=r"MethodTestCase inputs\[1\] has type str"):
        MethodTestCase([inputs[0], "x"])
    with pytest.raises(ValueError, match=r"MethodTestCase expected_outputs\[0\] has type NoneType"):
        MethodTestCase([inputs[0]], [None])
    with pytest.raises(ValueError, match=r"test_cases\[0\] is a tuple, not a MethodTestCase"):
        MethodTestSuite("forward", [(inputs[0],)])
    with pytest.raises(ValueError, match="exactly one of executorch_program and pte_file"):
        BundledProgram(None, [])
    with pytest.raises(ValueError, match="exactly one of executorch_program and pte_file"):
        BundledProgram(et, [], pte_file=et.buffer)
    with pytest.raises(TypeError, match="executorch_program must be an ExecutorchProgramManager"):
        BundledProgram(et.buffer, [])
    with pytest.raises(ValueError, match=r"pte_file '/nonexistent\.pte' cannot be read"):
        BundledProgram(None, [], pte_file="/nonexistent.pte")
    with pytest.raises(FormatError):
        deserialize_from_flatbuffer_to_bundled_program(b"\x00" * 16)


def test_etlab_runtime_verifies_our_bpte(mlp):
    module, inputs, et = mlp
    with torch.no_grad():
        wrong = module(inputs[0]) + 1.0
    cases = [*_cases(module, inputs), MethodTestCase([inputs[0]], wrong)]
    data = serialize_from_bundled_program_to_flatbuffer(BundledProgram(et, [MethodTestSuite("forward", cases)]))
    method = load_bundled_program(data).load_method("forward")
    assert torch.equal(load_bundled_input(method, 1)[0], cases[1].inputs[0])
    assert [bool(verify_method_outputs(method, i)) for i in range(3)] == [True, True, False]
