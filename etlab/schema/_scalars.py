"""The tables the schemas share to the letter: the scalar values of program.fbs, etdump.fbs and
bundled_program.fbs, and the data segment of program.fbs and flat_tensor.fbs. One class each, so the
formats agree by construction (each schema module re-exports them under its own name)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Null:
    """A value with nothing in it: an optional argument left out, a None output."""


@dataclass
class Int:
    """A scalar int value: a program's argument or result, a logged value, a bundled input or expected output."""

    int_val: int = 0


@dataclass
class Bool:
    """A scalar bool value (in an ETDump also the flag that marks a logged value as a method output)."""

    bool_val: bool = False


@dataclass
class Double:
    """A scalar float value (a double on the wire)."""

    double_val: float = 0.0


@dataclass
class String:
    """A string value (e.g. a reduction mode argument, a logged string)."""

    string_val: str | None = None


@dataclass
class DataSegment:
    """A byte range of the file's data after the FlatBuffer: offset from the segment base, and size."""

    offset: int = 0
    size: int = 0
