"""Bundled programs at run time: run a `.bpte`'s test cases and report how the outputs differ.

    program = load_bundled_program("model.bpte")
    method = program.load_method("forward")
    report = verify_method_outputs(method, 0)          # rtol=1e-4, atol=1e-6 unless given
    print(report)             # per output: max abs diff, mismatching elements, shape/dtype problems
    report.raise_if_failed()  # BundledVerificationError with the same text

`load_bundled_input(method, index)` returns test case `index`'s inputs for `method.execute`.

The default tolerance is rtol=1e-4, atol=1e-6 (`DEFAULT_RTOL`, `DEFAULT_ATOL`), looser than
upstream's 1e-5 / 1e-8: expected outputs are usually eager PyTorch's, and a float32 backend that sums
in another order (XNNPACK) differs by a few ULPs, which near-zero outputs turn into relative errors
far above 1e-5. Upstream's own runtime fails 1e-5 / 1e-8 on its own XNNPACK MobileNetV2 program
(max abs diff 2.4e-7 on outputs of magnitude 0.28, needing atol 6.6e-8); a wrong kernel misses
1e-4 / 1e-6 by orders of magnitude. Give rtol/atol to check tighter or looser.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from etlab.devtools._bundled_program import check_test_cases, value_from_bundled
from etlab.errors import Error
from etlab.runtime import Method, Program, Runtime
from etlab.schema import bundled_program as B

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6


class BundledVerificationError(Error, AssertionError):
    """A method's outputs differ from a bundled test case's expected outputs."""


def _source_name(source) -> str:
    """How an error names a .bpte given as a path, a binary file or bytes."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    if isinstance(name, str):
        return name
    return f"<bundled program of {len(source)} bytes>" if isinstance(source, (bytes, bytearray, memoryview)) \
        else "<bundled program>"


def load_bundled_program(source, **load_kwargs) -> Program:
    """Loads a `.bpte` (path, bytes or binary file); `load_kwargs` go to `Runtime.load_program`.
    Every test-case value is checked (dtype, sizes, dim order, byte count) before it returns: a bad
    one is a FormatError naming the file, the method, the test case and the value."""
    program = Runtime.get().load_program(source, **load_kwargs)
    if program.bundled is None:
        raise ValueError(f"{source!r} is a plain program, not a bundled program (.bpte)")
    check_test_cases(program.bundled, _source_name(source))
    return program


def _test_case(method: Method, index: int) -> B.BundledMethodTestCase:
    bundled = getattr(method.program, "bundled", None)
    if bundled is None:
        raise ValueError(f"method {method.name!r} does not come from a bundled program (.bpte)")
    suites = [s for s in bundled.method_test_suites or [] if s.method_name == method.name]
    if not suites:
        raise ValueError(f"the bundled program has no test suite for method {method.name!r}")
    cases = suites[0].test_cases or []
    if not 0 <= index < len(cases):
        raise IndexError(f"method {method.name!r} has {len(cases)} bundled test cases; {index} is out of range")
    return cases[index]


def bundled_test_case_count(method: Method) -> int:
    """How many test cases the method's .bpte bundles for it (0 for a program not loaded from a .bpte)."""
    bundled = getattr(method.program, "bundled", None)
    suites = [s for s in (bundled.method_test_suites if bundled else None) or [] if s.method_name == method.name]
    return len(suites[0].test_cases or []) if suites else 0


def load_bundled_input(method: Method, index: int) -> list:
    """The inputs of bundled test case `index` of `method` (fresh tensors and Python scalars)."""
    case = _test_case(method, index)
    return [value_from_bundled(v, f"method {method.name!r}: bundled test case {index}: input {k}")
            for k, v in enumerate(case.inputs or [])]


def expected_outputs(method: Method, index: int) -> list:
    """The expected outputs a bundled program records for one test case of a loaded method, decoded to tensors and
    scalars; errors name the method, the case and the output."""
    case = _test_case(method, index)
    return [value_from_bundled(v, f"method {method.name!r}: bundled test case {index}: expected output {k}")
            for k, v in enumerate(case.expected_outputs or [])]


@dataclass
class OutputCheck:
    """How one output compares with its expected value."""

    index: int
    ok: bool
    max_abs_diff: float | None = None
    mismatched: int = 0  # elements outside rtol/atol
    numel: int = 0
    problem: str | None = None  # shape, dtype, kind or count mismatch

    def describe(self) -> str:
        """One line: 'output 0: ok, max abs diff 1.2e-07, 0/10 elements outside tolerance', or the problem."""
        if self.problem is not None:
            return f"output {self.index}: {self.problem}"
        status = "ok" if self.ok else "MISMATCH"
        diff = "n/a" if self.max_abs_diff is None else f"{self.max_abs_diff:.3g}"
        return (f"output {self.index}: {status}, max abs diff {diff}, "
                f"{self.mismatched}/{self.numel} elements outside tolerance")


@dataclass
class BundledVerification:
    """The result of checking one bundled test case."""

    method: str
    test_case: int
    rtol: float
    atol: float
    outputs: list[OutputCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every output matched within the tolerance."""
        return all(o.ok for o in self.outputs)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = (f"method {self.method!r}, bundled test case {self.test_case} (rtol={self.rtol}, atol={self.atol}): "
                f"{'passed' if self.ok else 'FAILED'}")
        return "\n".join([head, *("  " + o.describe() for o in self.outputs)])

    def raise_if_failed(self) -> None:
        """Raises BundledVerificationError (an AssertionError and an etlab.Error) naming what differed."""
        if not self.ok:
            raise BundledVerificationError(str(self))


def compare_output(index: int, actual: Any, expected: Any, rtol: float, atol: float) -> OutputCheck:
    """One output checked against its expected value: dtype and shape must match exactly, floats within rtol/atol (NaN
    matches NaN), everything else equal; the OutputCheck says how far off and why it failed."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return OutputCheck(index, False, problem=f"expected a tensor, got {type(actual).__name__}")
        if actual.dtype != expected.dtype:
            return OutputCheck(index, False, numel=expected.numel(),
                               problem=f"dtype {actual.dtype} != expected {expected.dtype}")
        if actual.shape != expected.shape:
            return OutputCheck(index, False, numel=expected.numel(),
                               problem=f"shape {list(actual.shape)} != expected {list(expected.shape)}")
        if expected.numel() == 0:
            return OutputCheck(index, True, 0.0, 0, 0)
        if expected.is_floating_point() or expected.is_complex():
            close = torch.isclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
            diff = (actual.double() - expected.double()).abs().nan_to_num(0.0).max().item()
        else:
            close = actual == expected
            diff = (actual.long() - expected.long()).abs().max().item() if expected.dtype != torch.bool else \
                float((actual != expected).any())
        mismatched = int((~close).sum())
        return OutputCheck(index, mismatched == 0, float(diff), mismatched, expected.numel())
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        diff = abs(actual - expected)
        ok = diff <= atol + rtol * abs(expected) or (math.isnan(actual) and math.isnan(expected))
        return OutputCheck(index, ok, diff, int(not ok), 1)
    ok = actual == expected and type(actual) is type(expected)
    return OutputCheck(index, ok, None, int(not ok), 1,
                       None if ok else f"value {actual!r} != expected {expected!r}")


def check_tolerance(rtol, atol) -> tuple[float, float]:
    """rtol and atol as floats, each finite and >= 0 (a ValueError naming the bad one otherwise)."""
    out = []
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        out.append(float(v))
    return out[0], out[1]


def verify_method_outputs(method: Method, index: int, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL, *,
                          outputs: list | None = None) -> BundledVerification:
    """Runs bundled test case `index` on `method` (unless `outputs` are given) and compares the outputs
    with the expected ones (|actual - expected| <= atol + rtol * |expected| per element). Returns the
    report; `report.raise_if_failed()` turns a failure into an error."""
    rtol, atol = check_tolerance(rtol, atol)
    expected = expected_outputs(method, index)
    if outputs is None:
        outputs = method.execute(load_bundled_input(method, index), bundled_input_index=index)
    report = BundledVerification(method.name, index, rtol, atol)
    for k in range(max(len(outputs), len(expected))):
        if k >= len(expected):
            report.outputs.append(OutputCheck(k, False, problem="output has no expected value"))
        elif k >= len(outputs):
            report.outputs.append(OutputCheck(k, False, problem="expected output is missing"))
        else:
            report.outputs.append(compare_output(k, outputs[k], expected[k], rtol, atol))
    return report


def verify_bundled_program(program: Program, rtol: float = DEFAULT_RTOL,
                           atol: float = DEFAULT_ATOL) -> list[BundledVerification]:
    """Runs every bundled test case of every method of `program`; one report per case."""
    rtol, atol = check_tolerance(rtol, atol)
    if program.bundled is None:
        raise ValueError("the program was not loaded from a bundled program (.bpte)")
    reports = []
    for suite in program.bundled.method_test_suites or []:
        method = program.load_method(suite.method_name)
        for index in range(len(suite.test_cases or [])):
            reports.append(verify_method_outputs(method, index, rtol, atol))
    return reports
