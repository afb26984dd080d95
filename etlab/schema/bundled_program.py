"""The .bpte bundled program: a whole .pte plus per-method test cases (identifier BP08)."""

from __future__ import annotations

from dataclasses import dataclass, field

from etlab.schema._codec import TableCodec, make_enum

ScalarType = make_enum("scalar_type.ScalarType")

BUNDLED_PROGRAM_VERSION = 2  # the schema version upstream 1.x writes


@dataclass
class Int:
    int_val: int = 0


@dataclass
class Bool:
    bool_val: bool = False


@dataclass
class Double:
    double_val: float = 0.0


@dataclass
class Tensor:
    scalar_type: ScalarType = ScalarType.FLOAT
    sizes: list[int] | None = field(default_factory=list)
    data: bytes | memoryview | None = b""
    dim_order: list[int] | None = field(default_factory=list)


ValueUnion = Tensor | Int | Bool | Double


@dataclass
class Value:
    val: ValueUnion | None = None


@dataclass
class BundledMethodTestCase:
    inputs: list[Value] | None = field(default_factory=list)
    expected_outputs: list[Value] | None = field(default_factory=list)


@dataclass
class BundledMethodTestSuite:
    method_name: str | None = None
    test_cases: list[BundledMethodTestCase] | None = field(default_factory=list)


@dataclass
class BundledProgram:
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
