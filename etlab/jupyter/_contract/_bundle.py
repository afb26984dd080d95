"""The contract's replies about bundled programs (.bpte): the viewer's test cases and the verify report's
verdicts."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from ._files import Versioned
from ._program import MethodSummary


class BundledValue(TypedDict):
    """A bundled input or expected output: a tensor (dtype, shape, bytes, first numbers) or a scalar."""

    kind: Literal["tensor", "int", "bool", "double", "none"]
    dtype: NotRequired[str]
    shape: NotRequired[list[int]]
    bytes: NotRequired[int]
    preview: NotRequired[list[float]]
    value: NotRequired[float | bool]


class BundledCase(TypedDict):
    """One bundled test case as the viewer lists it: its inputs and expected outputs."""

    index: int
    inputs: list[BundledValue]
    expected: list[BundledValue]


class BundledSuite(TypedDict):
    """The test cases of one method of a bundled program."""

    method: str
    cases: list[BundledCase]


class Tolerance(TypedDict):
    """The relative and absolute tolerance an output check used."""

    rtol: float
    atol: float


class BpteView(Versioned):
    """GET /etlab/api/view/bpte."""

    version: int
    program_bytes: int
    methods: list[MethodSummary]
    suites: list[BundledSuite]
    signature: str
    tolerance: Tolerance


class OutputVerdict(TypedDict):
    """One output's check: whether it matched, how far off (max abs diff, mismatched elements), and why not."""

    index: int
    ok: bool
    max_abs_diff: float | None
    mismatched: int
    numel: int
    problem: str | None
    text: str


class CaseVerdict(TypedDict):
    """One test case's verdict, with the tolerance used and each output's check."""

    method: str
    index: int
    ok: bool
    rtol: float
    atol: float
    outputs: list[OutputVerdict]


class VerifyReport(TypedDict):
    """POST /etlab/api/verify: each bundled test case's verdict at the tolerance named."""

    file: str
    passed: bool
    rtol: float
    atol: float
    default_rtol: float
    default_atol: float
    cases: list[CaseVerdict]
