"""The .bpte bundled program: a whole .pte plus per-method test cases (identifier BP08)."""

from __future__ import annotations

from dataclasses import dataclass, field

from etlab.schema._codec import TableCodec, make_enum
from etlab.schema._scalars import Bool, Double, Int

ScalarType = make_enum("scalar_type.ScalarType")

BUNDLED_PROGRAM_VERSION = 2  # the schema version upstream 1.x writes





@dataclass
class Tensor:
    """A tensor input or expected output of a bundled test case, with its data inline."""

    scalar_type: ScalarType = ScalarType.FLOAT
    sizes: list[int] | None = field(default_factory=list)
    data: bytes | memoryview | None = b""
    dim_order: list[int] | None = field(default_factory=list)


ValueUnion = Tensor | Int | Bool | Double


@dataclass
class Value:
    """One input or expected output of a bundled test case."""

    val: ValueUnion | None = None


@dataclass
class BundledMethodTestCase:
    """One test of a method: the inputs to feed it and the outputs it must produce (within a tolerance chosen at
    verification)."""

    inputs: list[Value] | None = field(default_factory=list)
    expected_outputs: list[Value] | None = field(default_factory=list)


@dataclass
class BundledMethodTestSuite:
    """The test cases of one method, by name."""

    method_name: str | None = None
    test_cases: list[BundledMethodTestCase] | None = field(default_factory=list)


@dataclass
class BundledProgram:
    """The root of a .bpte file: a .pte program with test cases per method, so a device can check it computes what
    the model did."""

    version: int = BUNDLED_PROGRAM_VERSION
    method_test_suites: list[BundledMethodTestSuite] | None = field(default_factory=list)
    program: bytes | memoryview | None = b""


_CODEC = TableCodec("bundled_program", {name: cls for name, cls in globals().items() if isinstance(cls, type)})


def deserialize_bundled_program(data, *, what: str = "bundled program") -> BundledProgram:
    """Parses a .bpte; `program` (the embedded .pte) and tensor data stay zero-copy views."""
    return _CODEC.decode(data, what=what)


def serialize_bundled_program(bundled: BundledProgram) -> bytes:
    """The .bpte bytes of `bundled` (what `deserialize_bundled_program` reads back, and upstream's loader too)."""
    return _CODEC.encode(bundled)
