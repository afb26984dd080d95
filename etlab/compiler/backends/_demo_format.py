"""The DemoBackend's processed-bytes format (version 1), and its encoder.

The runtime half (`etlab.runtime.backends.demo_backend`) decodes it; the two layers may not import
each other, so the constants below are repeated there; this docstring is the specification.

All integers are little-endian. A program is a table of values (tensors) and a list of ops that
read and write values by index ("slot").

    header   magic b"ETDB" | version u16 = 1 | reserved u16 = 0
             | n_values u32 | n_inputs u32 | n_outputs u32 | n_ops u32          (24 bytes)
    values   n_values x value
      value  kind u8 (0 = activation, 1 = constant) | scalar_type u8 (ExecuTorch ScalarType;
             only 6 = float32) | rank u8 | reserved u8 = 0 | dims u32 x rank
             constants only: nbytes u64 | nbytes of row-major element data
    inputs   n_inputs x u32 slot     the delegate call's inputs, in call order
    outputs  n_outputs x u32 slot    its outputs, in call order
    ops      n_ops x op, in execution order
      op     opcode u8 | n_in u8 | n_out u8 | n_attr u8 | debug_id i32 | name_len u16 | name (utf-8)
             | in slots u32 x n_in | out slots u32 x n_out | attrs i64 x n_attr

Opcodes: 1 add(a, b), 2 mul(a, b) (both broadcasting), 3 mm(a, b), 4 addmm(bias, a, b) =
bias + a @ b, 5 permute(a) with attrs = the dims. Each op has one output.

An op's delegate debug identifier is `debug_id` when it is >= 0, else `name` when non-empty
(the two identifier styles of DelegateMappingBuilder); with neither, the op is reported by its
opcode name only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

import torch

from etlab.schema import dtype_to_scalar_type

MAGIC = b"ETDB"
VERSION = 1
_HEADER = struct.Struct("<4sHHIIII")
_VALUE = struct.Struct("<BBBB")
_OP = struct.Struct("<BBBBiH")


class Opcode(IntEnum):
    """The demo backend's operations (its bytecode's opcodes)."""

    ADD = 1
    MUL = 2
    MM = 3
    ADDMM = 4
    PERMUTE = 5


class ValueKind(IntEnum):
    """Whether a demo value is computed at run time or constant data stored in the payload."""

    ACTIVATION = 0
    CONSTANT = 1


@dataclass
class DemoValue:
    """A float32 tensor slot: an activation (input, output or intermediate) or a constant."""

    shape: tuple[int, ...]
    data: torch.Tensor | None = None  # set for constants


@dataclass
class DemoOp:
    """One demo instruction: opcode, value ids in and out, integer attributes, and the debug id the runtime reports
    it under."""

    opcode: Opcode
    inputs: list[int]
    outputs: list[int]
    attrs: list[int] = field(default_factory=list)
    debug_id: int = -1
    name: str = ""


@dataclass
class DemoProgram:
    """A lowered partition in the demo format: its values, inputs, outputs and ops in order."""

    values: list[DemoValue] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    ops: list[DemoOp] = field(default_factory=list)

    def add_value(self, shape, data: torch.Tensor | None = None) -> int:
        """Adds a value of `shape` (constant when `data` is given) and returns its id."""
        self.values.append(DemoValue(tuple(int(d) for d in shape), data))
        return len(self.values) - 1


def encode_demo_program(program: DemoProgram) -> bytes:
    """Serialize `program` in the format described in this module's docstring."""
    float_type = int(dtype_to_scalar_type(torch.float32))
    parts = [_HEADER.pack(MAGIC, VERSION, 0, len(program.values), len(program.inputs), len(program.outputs),
                          len(program.ops))]
    for value in program.values:
        kind = ValueKind.ACTIVATION if value.data is None else ValueKind.CONSTANT
        parts.append(_VALUE.pack(kind, float_type, len(value.shape), 0))
        parts.append(struct.pack(f"<{len(value.shape)}I", *value.shape))
        if value.data is not None:
            raw = value.data.detach().to(torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()
            parts.append(struct.pack("<Q", len(raw)))
            parts.append(raw)
    parts.append(struct.pack(f"<{len(program.inputs)}I", *program.inputs))
    parts.append(struct.pack(f"<{len(program.outputs)}I", *program.outputs))
    for op in program.ops:
        name = op.name.encode("utf-8")
        parts.append(_OP.pack(op.opcode, len(op.inputs), len(op.outputs), len(op.attrs), op.debug_id, len(name)))
        parts.append(name)
        parts.append(struct.pack(f"<{len(op.inputs)}I{len(op.outputs)}I{len(op.attrs)}q",
                                 *op.inputs, *op.outputs, *op.attrs))
    return b"".join(parts)
