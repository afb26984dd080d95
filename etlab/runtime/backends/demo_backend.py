"""Runtime half of the DemoBackend: decodes and runs the bytes `DemoBackend.preprocess` produced.

The byte format (version 1) is specified in `etlab/compiler/backends/_demo_format.py`; the runtime
may not import the compiler, so the few constants it needs are repeated here. `init` checks the
whole program (bounds, slot ids, def-before-use, shapes) so `execute` can run without checks.

Each op is reported to the method's event tracer as one delegate profiling event, under the
identifier the AOT side mapped to the original debug handles, and its output is logged as a
delegate intermediate output. A handle keeps its intermediates between calls, so one handle
must not execute on two threads at once (as a Method).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

import torch

from etlab.errors import FormatError
from etlab.runtime._errors import ExecutionError, check_delegate_args
from etlab.runtime._registry import register_backend  # not `etlab.runtime`: it imports this module

BACKEND_ID = "DemoBackend"
MAGIC = b"ETDB"
VERSION = 1
_FLOAT32_SCALAR_TYPE = 6  # ExecuTorch ScalarType.FLOAT
_MAX_RANK = 16
_HEADER = struct.Struct("<4sHHIIII")
_VALUE = struct.Struct("<BBBB")
_OP = struct.Struct("<BBBBiH")
_ACTIVATION, _CONSTANT = 0, 1


def _permute(out, a, *dims):
    out.copy_(a.permute(dims))


# opcode -> (name, tensor inputs, kernel(out, *inputs, *attrs))
_KERNELS: dict[int, tuple[str, int, Callable]] = {
    1: ("add", 2, lambda out, a, b: torch.add(a, b, out=out)),
    2: ("mul", 2, lambda out, a, b: torch.mul(a, b, out=out)),
    3: ("mm", 2, lambda out, a, b: torch.mm(a, b, out=out)),
    4: ("addmm", 3, lambda out, bias, a, b: torch.addmm(bias, a, b, out=out)),
    5: ("permute", 1, _permute),
}


@dataclass
class DemoOpPlan:
    """One decoded demo instruction ready to run: the kernel, value ids in and out, attributes, and the debug id its
    events carry."""

    kernel: Callable
    inputs: tuple[int, ...]
    output: int
    attrs: tuple[int, ...]
    debug_id: int  # delegate debug identifier, -1 when the op is identified by name
    name: str | None  # event name: the manual identifier, or the opcode name for unmapped ops
    metadata: bytes  # the opcode name, attached to the op's profiling event


@dataclass
class DemoHandle:
    """One initialized delegate: slot table template plus the op plan."""

    slots: list[torch.Tensor | None]  # constants and intermediates; inputs/outputs are bound per call
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    shapes: list[tuple[int, ...]]
    ops: list[DemoOpPlan]


def _bad(message: str) -> FormatError:
    return FormatError(f"{BACKEND_ID}: invalid processed bytes: {message}")


class _Reader:
    def __init__(self, data: memoryview):
        self.data = data
        self.offset = 0

    def take(self, size: int, what: str) -> memoryview:
        if size > len(self.data) - self.offset:
            raise _bad(f"truncated: {what} needs {size} bytes at offset {self.offset}, "
                       f"only {len(self.data) - self.offset} left")
        chunk = self.data[self.offset:self.offset + size]
        self.offset += size
        return chunk

    def unpack(self, layout: struct.Struct, what: str) -> tuple:
        return layout.unpack(self.take(layout.size, what))

    def ints(self, code: str, count: int, what: str) -> tuple[int, ...]:
        layout = struct.Struct(f"<{count}{code}")
        return layout.unpack(self.take(layout.size, what))


def decode(processed) -> DemoHandle:
    """Parse and validate DemoBackend bytes into a ready-to-run handle; FormatError if malformed."""
    reader = _Reader(memoryview(processed).cast("B"))
    magic, version, _reserved, n_values, n_inputs, n_outputs, n_ops = reader.unpack(_HEADER, "the header")
    if magic != MAGIC:
        raise _bad(f"magic is {bytes(magic)!r}, expected {MAGIC!r} (not a {BACKEND_ID} program)")
    if version != VERSION:
        raise _bad(f"format version {version} is not supported (this runtime reads version {VERSION})")

    shapes: list[tuple[int, ...]] = []
    slots: list[torch.Tensor | None] = []
    constants: set[int] = set()
    for index in range(n_values):
        kind, scalar_type, rank, _ = reader.unpack(_VALUE, f"value {index}")
        if kind not in (_ACTIVATION, _CONSTANT):
            raise _bad(f"value {index} has kind {kind} (0 = activation, 1 = constant)")
        if scalar_type != _FLOAT32_SCALAR_TYPE:
            raise _bad(f"value {index} has scalar type {scalar_type}; only float32 "
                       f"({_FLOAT32_SCALAR_TYPE}) is supported")
        if rank > _MAX_RANK:
            raise _bad(f"value {index} has rank {rank} (at most {_MAX_RANK})")
        shape = reader.ints("I", rank, f"value {index} dims")
        shapes.append(shape)
        if kind == _CONSTANT:
            (nbytes,) = reader.ints("Q", 1, f"value {index} size")
            expected = 4 * math.prod(shape)
            if nbytes != expected:
                raise _bad(f"constant value {index} has {nbytes} bytes of data, shape {list(shape)} needs {expected}")
            data = bytearray(reader.take(nbytes, f"constant value {index} data"))
            slots.append(torch.frombuffer(data, dtype=torch.float32).reshape(shape) if nbytes else
                         torch.empty(shape, dtype=torch.float32))
            constants.add(index)
        else:
            slots.append(None)

    def slot_ids(count: int, what: str) -> tuple[int, ...]:
        ids = reader.ints("I", count, what)
        bad = [i for i in ids if i >= n_values]
        if bad:
            raise _bad(f"{what} refer to value {bad[0]}, but there are only {n_values} values")
        return ids

    inputs = slot_ids(n_inputs, "graph inputs")
    outputs = slot_ids(n_outputs, "graph outputs")
    boundary = inputs + outputs
    if len(set(boundary)) != len(boundary) or constants.intersection(boundary):
        raise _bad("graph inputs and outputs must be distinct activation values")

    defined = set(inputs) | constants
    ops = [_decode_op(reader, index, slot_ids, shapes, defined, constants) for index in range(n_ops)]
    missing = [slot for slot in outputs if slot not in defined]
    if missing:
        raise _bad(f"graph output value {missing[0]} is never computed")
    if reader.offset != len(reader.data):
        raise _bad(f"{len(reader.data) - reader.offset} unexpected bytes after the last op")

    for op in ops:  # intermediates live in the handle; inputs and outputs are bound per call
        if op.output not in boundary:
            try:
                slots[op.output] = torch.empty(shapes[op.output], dtype=torch.float32)
            except RuntimeError as err:  # absurd sizes in damaged bytes
                raise _bad(f"cannot allocate value {op.output} of shape {list(shapes[op.output])}: {err}") from None
    return DemoHandle(slots, inputs, outputs, shapes, ops)


def _decode_op(reader: _Reader, index: int, slot_ids, shapes, defined: set[int], constants: set[int]) -> DemoOpPlan:
    opcode, n_in, n_out, n_attr, debug_id, name_len = reader.unpack(_OP, f"op {index}")
    if opcode not in _KERNELS:
        raise _bad(f"op {index} has unknown opcode {opcode}")
    op_name, arity, kernel = _KERNELS[opcode]
    name = bytes(reader.take(name_len, f"op {index} name"))
    try:
        identifier = name.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"op {index} ({op_name}) name is not valid utf-8") from None
    if n_in != arity or n_out != 1:
        raise _bad(f"op {index} ({op_name}) has {n_in} inputs and {n_out} outputs; it takes {arity} and 1")
    ins = slot_ids(n_in, f"op {index} ({op_name}) inputs")
    (out,) = slot_ids(n_out, f"op {index} ({op_name}) outputs")
    attrs = reader.ints("q", n_attr, f"op {index} ({op_name}) attributes")
    undefined = [slot for slot in ins if slot not in defined]
    if undefined:
        raise _bad(f"op {index} ({op_name}) reads value {undefined[0]} before anything writes it")
    if out in defined:
        raise _bad(f"op {index} ({op_name}) writes value {out}, which is an input, a constant or already written")
    try:
        expected = tuple(_KERNELS_META[opcode](*(torch.empty(shapes[s], device="meta") for s in ins), attrs).shape)
    except (RuntimeError, IndexError, ValueError, TypeError) as err:
        raise _bad(f"op {index} ({op_name}) operands do not fit: {err}") from None
    if expected != shapes[out]:
        raise _bad(f"op {index} ({op_name}) produces shape {list(expected)} but value {out} is {list(shapes[out])}")
    defined.add(out)
    event_name = identifier or (None if debug_id >= 0 else op_name)
    return DemoOpPlan(kernel, ins, out, attrs, debug_id, event_name, op_name.encode())


# Shape checks at init run each op on meta tensors (no data, no compute).
_KERNELS_META: dict[int, Callable] = {
    1: lambda a, b, attrs: _no_attrs(attrs) or torch.add(a, b),
    2: lambda a, b, attrs: _no_attrs(attrs) or torch.mul(a, b),
    3: lambda a, b, attrs: _no_attrs(attrs) or torch.mm(a, b),
    4: lambda bias, a, b, attrs: _no_attrs(attrs) or torch.addmm(bias, a, b),
    5: lambda a, attrs: _checked_permutation(a, attrs),
}


def _no_attrs(attrs) -> None:
    if attrs:
        raise ValueError(f"unexpected attributes {list(attrs)}")


def _checked_permutation(a: torch.Tensor, dims) -> torch.Tensor:
    if sorted(dims) != list(range(a.dim())):
        raise ValueError(f"{list(dims)} is not a permutation of {a.dim()} dims")
    return a.permute(dims)


class DemoBackendRuntime:
    """The object registered under "DemoBackend" with the runtime's backend registry."""

    def init(self, processed: memoryview, compile_specs: list[tuple[str, bytes]]) -> DemoHandle:
        """Decodes and checks the payload once at load; the handle execute runs."""
        # Compile specs only steer the AOT side (identifier style); nothing to read here.
        return decode(processed)

    def execute(self, handle: DemoHandle, args: list, context=None) -> None:
        """Run the program: `args` are the delegate call's inputs then its preallocated outputs."""
        check_delegate_args(BACKEND_ID, len(handle.inputs), len(handle.outputs), args)
        slots = list(handle.slots)
        for position, (slot, value) in enumerate(zip(handle.inputs + handle.outputs, args)):
            role = "input" if position < len(handle.inputs) else "output"
            if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
                raise ExecutionError(f"{BACKEND_ID}: {role} {position} must be a float32 tensor, got "
                                     f"{getattr(value, 'dtype', type(value).__name__)}")
            if tuple(value.shape) != handle.shapes[slot]:
                raise ExecutionError(f"{BACKEND_ID}: {role} {position} has shape {list(value.shape)}, "
                                     f"expected {list(handle.shapes[slot])}")
            slots[slot] = value
        if context is None or not getattr(context, "enabled", True):  # tracing off: skip the per-op calls
            for op in handle.ops:
                op.kernel(slots[op.output], *(slots[i] for i in op.inputs), *op.attrs)
            return
        for op in handle.ops:
            token = context.start_profiling_delegate(name=op.name, delegate_debug_id=op.debug_id)
            op.kernel(slots[op.output], *(slots[i] for i in op.inputs), *op.attrs)
            context.end_profiling_delegate(token, metadata=op.metadata)
            context.log_output_delegate(op.name, op.debug_id, slots[op.output])


DEMO_BACKEND = DemoBackendRuntime()
register_backend(BACKEND_ID, DEMO_BACKEND)
