"""Bundled programs at run time: loading a .bpte, its inputs, and the verification report."""

from __future__ import annotations

import pytest
import torch

from etlab.devtools._bundled_runtime import (
    BundledVerificationError,
    load_bundled_input,
    load_bundled_program,
    verify_bundled_program,
    verify_method_outputs,
)
from etlab.runtime import Runtime
from etlab.schema import bundled_program as B
from etlab.schema import deserialize_etdump, dtype_to_scalar_type, serialize_bundled_program
from tests.runtime._programs import add_chain


def _tensor(t: torch.Tensor) -> B.Value:
    return B.Value(B.Tensor(scalar_type=dtype_to_scalar_type(t.dtype), sizes=list(t.shape),
                            data=t.contiguous().numpy().tobytes(), dim_order=list(range(t.dim()))))


def make_bpte(expected_shift: float = 0.0, expected_shape=None) -> tuple[bytes, list]:
    pte, w = add_chain(2)
    cases, inputs = [], []
    for seed in range(2):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        expected = x + 2 * w + expected_shift
        if expected_shape is not None:
            expected = expected.reshape(expected_shape)
        inputs.append(x)
        cases.append(B.BundledMethodTestCase(inputs=[_tensor(x)], expected_outputs=[_tensor(expected)]))
    bundled = B.BundledProgram(method_test_suites=[B.BundledMethodTestSuite("forward", cases)], program=pte)
    return serialize_bundled_program(bundled), inputs


def test_bundled_cases_pass_and_inputs_load(tmp_path):
    data, inputs = make_bpte()
    path = tmp_path / "m.bpte"
    path.write_bytes(data)
    program = load_bundled_program(path)
    method = program.load_method("forward")
    for i, x in enumerate(inputs):
        (loaded,) = load_bundled_input(method, i)
        torch.testing.assert_close(loaded, x)
        report = verify_method_outputs(method, i, rtol=1e-5, atol=1e-6)
        assert report.ok, str(report)
        assert report.outputs[0].mismatched == 0 and report.outputs[0].max_abs_diff < 1e-5
        report.raise_if_failed()
    assert all(verify_bundled_program(program, atol=1e-6))
    # Runtime.load_program takes a .bpte as well (it runs the embedded program).
    assert Runtime.get().load_program(data).load_method("forward").execute(inputs[:1])[0].shape == (2, 3)


def test_value_mismatch_is_reported_with_diffs():
    data, _ = make_bpte(expected_shift=0.5)
    method = load_bundled_program(data).load_method("forward")
    report = verify_method_outputs(method, 0, rtol=0.0, atol=1e-3)
    assert not report.ok
    check = report.outputs[0]
    assert check.mismatched == check.numel == 6
    assert check.max_abs_diff == pytest.approx(0.5, abs=1e-5)
    assert "output 0: MISMATCH, max abs diff 0.5, 6/6 elements outside tolerance" in str(report)
    with pytest.raises(BundledVerificationError, match="FAILED"):
        report.raise_if_failed()


def test_shape_mismatch_and_missing_outputs_are_reported():
    data, _ = make_bpte(expected_shape=(3, 2))
    method = load_bundled_program(data).load_method("forward")
    report = verify_method_outputs(method, 1)
    assert not report.ok and report.outputs[0].problem == "shape [2, 3] != expected [3, 2]"
    report = verify_method_outputs(method, 1, outputs=[])
    assert report.outputs[0].problem == "expected output is missing"


def test_bad_requests_are_clear():
    data, _ = make_bpte()
    method = load_bundled_program(data).load_method("forward")
    with pytest.raises(IndexError, match="has 2 bundled test cases; 5 is out of range"):
        load_bundled_input(method, 5)
    plain, _ = add_chain(1)
    with pytest.raises(ValueError, match="not a bundled program"):
        load_bundled_program(plain)


def test_bundled_runs_are_marked_in_the_trace(tmp_path):
    data, _ = make_bpte()
    program = load_bundled_program(data, enable_etdump=True)
    method = program.load_method("forward")
    verify_method_outputs(method, 1)
    program.write_etdump_result_to_file(tmp_path / "b.etdp")
    runs = deserialize_etdump((tmp_path / "b.etdp").read_bytes()).run_data
    assert [(r.name, r.bundled_input_index) for r in runs] == [("Default", -1), ("Execute", 1)]
