"""The .pte program: typed model and (de)serialization, ExecuTorch 1.x wire format.

File layout: a FlatBuffer (identifier ET12) whose first 8 bytes are followed by an optional
extended header (magic ``eh00``), then zero padding, then data segments. Segment offsets in
`Program.segments` are relative to the header's `segment_base_offset`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from etlab.errors import FormatError
from etlab.schema._codec import TableCodec, make_enum
from etlab.schema._container import Pieces, align, assemble, place_segments
from etlab.schema._scalars import Bool, DataSegment, Double, Int, Null, String

ScalarType = make_enum("scalar_type.ScalarType")
TensorShapeDynamism = make_enum("program.TensorShapeDynamism")
TensorDataLocation = make_enum("program.TensorDataLocation")
DeviceType = make_enum("program.DeviceType")
DataLocation = make_enum("program.DataLocation")


@dataclass
class ContainerMetadata:
    """The pytree specs of a method's inputs and outputs, encoded as strings: how a runtime rebuilds nested Python
    arguments and results from the flat value lists."""

    encoded_inp_str: str | None = None
    encoded_out_str: str | None = None



@dataclass
class AllocationDetails:
    """Where memory planning placed a tensor: a memory id (a buffer in `non_const_buffer_sizes`) and a byte offset
    split into two 32-bit halves, as the schema stores it."""

    memory_id: int = 0
    memory_offset_low: int = 0
    memory_offset_high: int = 0

    @property
    def memory_offset(self) -> int:
        """The byte offset within the buffer, the two halves joined."""
        return self.memory_offset_low | (self.memory_offset_high << 32)


@dataclass
class ExtraTensorInfo:
    """What a tensor's basic record cannot say: the segment of mutable data, the fully qualified name that finds
    external data (.ptd) by key, where the data lives and on which device."""

    mutable_data_segments_idx: int = 0
    fully_qualified_name: str | None = None
    location: TensorDataLocation = TensorDataLocation.SEGMENT
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass
class Tensor:
    """A tensor value in a method's value list: dtype, sizes and dim order, and where its data comes from
    (`data_buffer_idx` for a constant, `allocation_info` for a planned tensor, neither for a tensor the caller
    supplies)."""

    scalar_type: ScalarType = ScalarType.FLOAT
    storage_offset: int = 0
    sizes: list[int] | None = field(default_factory=list)
    dim_order: list[int] | None = field(default_factory=list)
    requires_grad: bool = False
    data_buffer_idx: int = 0
    allocation_info: AllocationDetails | None = None
    layout: int = 0
    shape_dynamism: TensorShapeDynamism = TensorShapeDynamism.STATIC
    extra_tensor_info: ExtraTensorInfo | None = None






@dataclass
class IntList:
    """A list of ints as kernels take them (e.g. a size or dims argument): `items` are value indices of Int values,
    so each element can come from a run-time value."""

    items: list[int] | None = field(default_factory=list)


@dataclass
class DoubleList:
    """A list of floats stored inline (e.g. scales)."""

    items: list[float] | None = field(default_factory=list)


@dataclass
class BoolList:
    """A list of bools stored inline."""

    items: list[bool] | None = field(default_factory=list)


@dataclass
class TensorList:
    """A list of tensors (e.g. cat's inputs): `items` are indices of Tensor values."""

    items: list[int] | None = field(default_factory=list)


@dataclass
class OptionalTensorList:
    """A list of optional tensors (e.g. index's indices): `items` are value indices, -1 standing for None."""

    items: list[int] | None = field(default_factory=list)


KernelTypes = (
    Null | Int | Bool | Double | Tensor | String | IntList | DoubleList | BoolList | TensorList | OptionalTensorList
)


@dataclass
class EValue:
    """One entry of a method's value list: the union the kernels read their arguments from and write their results
    to."""

    val: KernelTypes | None = None


@dataclass
class Operator:
    """A kernel the method calls, by operator name and overload (e.g. aten::add, out): the runtime resolves it in its
    operator registry when the method loads."""

    name: str | None = None
    overload: str | None = None


@dataclass
class KernelCall:
    """An instruction that calls `operators[op_index]` with `args` (value indices, the out arguments last)."""

    op_index: int = 0
    args: list[int] | None = field(default_factory=list)


@dataclass
class DelegateCall:
    """An instruction that runs `delegates[delegate_index]` on `args` (value indices of its inputs and outputs)."""

    delegate_index: int = 0
    args: list[int] | None = field(default_factory=list)


@dataclass
class MoveCall:
    """An instruction that copies value `move_from` into `move_to` (control flow joins)."""

    move_from: int = 0
    move_to: int = 0


@dataclass
class JumpFalseCall:
    """An instruction that jumps to `destination_instruction` when the bool value `cond_value_index` is false
    (control flow)."""

    cond_value_index: int = 0
    destination_instruction: int = 0


@dataclass
class FreeCall:
    """An instruction that releases a dynamically allocated tensor's memory early."""

    value_index: int = 0


InstructionArguments = KernelCall | DelegateCall | MoveCall | JumpFalseCall | FreeCall


@dataclass
class Instruction:
    """One step of a chain: a kernel call, delegate call, move, conditional jump or free."""

    instr_args: InstructionArguments | None = None


@dataclass
class Frame:
    """One Python stack frame (file, line, function, source text) of the code an instruction came from."""

    filename: str | None = None
    lineno: int = 0
    name: str | None = None
    context: str | None = None


@dataclass
class FrameList:
    """The stack trace of one instruction."""

    items: list[Frame] | None = field(default_factory=list)


@dataclass
class BackendDelegateDataReference:
    """Where a delegate's processed bytes are: inline in the program (`backend_delegate_data[index]`) or in a data
    segment (`segments[index]`)."""

    location: DataLocation = DataLocation.INLINE
    index: int = 0


@dataclass
class CompileSpec:
    """A key/value option the backend was compiled with, handed to the runtime backend's init as well."""

    key: str | None = None
    value: bytes | memoryview | None = b""


@dataclass
class BackendDelegate:
    """A delegated partition: the backend id that runs it, where its processed bytes are, and the compile specs."""

    id: str | None = None
    processed: BackendDelegateDataReference | None = None
    compile_specs: list[CompileSpec] | None = field(default_factory=list)


@dataclass
class Chain:
    """A sequence of instructions with its own inputs and outputs (value indices) and, optionally, a stack trace per
    instruction; methods run their chains in order."""

    inputs: list[int] | None = field(default_factory=list)
    outputs: list[int] | None = field(default_factory=list)
    instructions: list[Instruction] | None = field(default_factory=list)
    stacktrace: list[FrameList] | None = None


@dataclass
class NonConstBufferDevice:
    """The device (type, index) a planned memory buffer lives on, for buffers not on the CPU."""

    buffer_idx: int = 0
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass
class ExecutionPlan:
    """One method: its value list, inputs and outputs (value indices), chains of instructions, the operators and
    delegates they call, and the sizes of the memory buffers planning laid tensors into (entry 0 is reserved)."""

    name: str | None = None
    container_meta_type: ContainerMetadata | None = None
    values: list[EValue] | None = field(default_factory=list)
    inputs: list[int] | None = field(default_factory=list)
    outputs: list[int] | None = field(default_factory=list)
    chains: list[Chain] | None = field(default_factory=list)
    operators: list[Operator] | None = field(default_factory=list)
    delegates: list[BackendDelegate] | None = field(default_factory=list)
    non_const_buffer_sizes: list[int] | None = field(default_factory=list)
    non_const_buffer_device: list[NonConstBufferDevice] | None = None


@dataclass
class Buffer:
    """Constant tensor data stored inside the FlatBuffer (older files; newer ones put constants in a segment)."""

    storage: bytes | memoryview | None = b""


@dataclass
class BackendDelegateInlineData:
    """A delegate's processed bytes stored inside the FlatBuffer rather than in a segment."""

    data: bytes | memoryview | None = b""



@dataclass
class SubsegmentOffsets:
    """Offsets of tensors within one data segment (the constant segment, mutable data): tensor i's data starts at
    `offsets[i]`."""

    segment_index: int = 0
    offsets: list[int] | None = field(default_factory=list)


@dataclass
class NamedData:
    """A blob shared by key (e.g. a delegate's weights): the segment that holds it, found by the runtime's named data
    map."""

    key: str | None = None
    segment_index: int = 0


@dataclass
class Program:
    """The root of a .pte file: the execution plans (methods) and where their constants, delegate payloads, segments
    and named data are."""

    version: int = 0
    execution_plan: list[ExecutionPlan] | None = field(default_factory=list)
    constant_buffer: list[Buffer] | None = field(default_factory=list)
    backend_delegate_data: list[BackendDelegateInlineData] | None = field(default_factory=list)
    segments: list[DataSegment] | None = field(default_factory=list)
    constant_segment: SubsegmentOffsets | None = None
    mutable_data_segments: list[SubsegmentOffsets] | None = None
    named_data: list[NamedData] | None = None


_CODEC = TableCodec("program", {name: cls for name, cls in globals().items() if isinstance(cls, type)})


# -- the file container ---------------------------------------------------------------------------

_EH = struct.Struct("<4sIQQQ")  # magic, header length, program_size, segment_base_offset, segment_data_size
_EH_MIN_LENGTH = 24  # headers before segment_data_size existed end after segment_base_offset
EH_MAGIC = b"eh00"
SCHEMA_ALIGNMENT = 16  # the largest force_align in program.fbs; the header is padded to it


@dataclass
class ExtendedHeader:
    """The ``eh00`` header: where the FlatBuffer ends and where the segments begin."""

    program_size: int
    segment_base_offset: int
    segment_data_size: int
    length: int = _EH.size


@dataclass
class PteFile:
    """A whole .pte: the program plus the raw bytes of each entry of `program.segments`."""

    program: Program
    segments: list[memoryview | bytes] = field(default_factory=list)
    header: ExtendedHeader | None = None

    def segment_bytes(self, index: int) -> memoryview | bytes:
        """The raw bytes of `program.segments[index]` (a zero-copy view when the file was mapped)."""
        return self.segments[index]

    def delegate_bytes(self, delegate: BackendDelegate) -> memoryview:
        """A delegate's processed payload, inline or in a segment, without a copy (the loader checked
        the reference is in range)."""
        ref = delegate.processed
        if ref.location == DataLocation.INLINE:
            return memoryview(self.program.backend_delegate_data[ref.index].data or b"")
        return memoryview(self.segments[ref.index])


def read_extended_header(data, what: str = "program") -> ExtendedHeader | None:
    """Returns the ``eh00`` header of a .pte buffer, or None if it has none."""
    if len(data) < 8 + _EH.size or bytes(data[8:12]) != EH_MAGIC:
        return None
    _magic, length, program_size, base, size = _EH.unpack_from(data, 8)
    if length < _EH_MIN_LENGTH:
        raise FormatError(f"{what}: extended header claims {length} bytes, at least {_EH_MIN_LENGTH} needed")
    if length < _EH.size:
        size = 0  # upstream's older 24-byte header has no segment_data_size; it still reads them
    return ExtendedHeader(program_size, base, size, length)


def _check_segment_refs(program: Program, segments: list, what: str) -> None:
    """Byte offsets into segments, and named-data segment indices, are in range.

    A missing segment counts as empty: upstream writes `constant_segment` offsets [0] naming a
    segment it never emits when a program has no constants, and its runtime accepts that.
    """
    n = len(segments)

    def subsegments(sub: SubsegmentOffsets, ctx: str) -> None:
        size = len(segments[sub.segment_index]) if sub.segment_index < n else 0
        for j, off in enumerate(sub.offsets or ()):
            if off > size:
                raise FormatError(f"{what}: {ctx} offset {j} ({off}) lies past the end of segment "
                                  f"{sub.segment_index} ({size} bytes, {n} segments in the file)")

    if program.constant_segment is not None:
        subsegments(program.constant_segment, "constant_segment")
    for i, sub in enumerate(program.mutable_data_segments or ()):
        subsegments(sub, f"mutable_data_segments[{i}]")
    for nd in program.named_data or ():
        if nd.segment_index >= n:
            raise FormatError(f"{what}: named data {nd.key!r} refers to segment {nd.segment_index}, but there are {n}")
    inline = len(program.backend_delegate_data or ())
    for plan in program.execution_plan or ():
        for d in plan.delegates or ():
            ref = d.processed
            if ref is None:
                raise FormatError(f"{what}: delegate {d.id!r} of method {plan.name!r} has no processed data reference")
            limit, where = (n, "segments") if ref.location == DataLocation.SEGMENT else (inline, "inline blobs")
            if ref.index >= limit:
                raise FormatError(f"{what}: delegate {d.id!r} of method {plan.name!r} refers to {where} "
                                  f"index {ref.index}, but there are {limit}")


def deserialize_pte(data, *, what: str = "program") -> PteFile:
    """Parses a .pte from bytes, a memoryview or an mmap; segment bytes are zero-copy views.

    Raises FormatError (naming `what`, typically the file path) on any defect.

    >>> data = serialize_pte(Program(execution_plan=[ExecutionPlan(name="forward")]))
    >>> bytes(data[4:8])  # the file identifier
    b'ET12'
    >>> [plan.name for plan in deserialize_pte(data).program.execution_plan]
    ['forward']
    >>> deserialize_pte(data[:6], what="model.pte")
    Traceback (most recent call last):
    etlab.errors.FormatError: model.pte: 6 bytes is too short for a .pte file
    """
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise FormatError(f"{what}: {len(view)} bytes is too short for a .pte file")
    if bytes(view[4:6]) != b"ET":
        raise FormatError(f"{what}: not a .pte file (identifier {bytes(view[4:8])!r}, expected b'ET12')")
    if bytes(view[4:8]) != b"ET12":
        raise FormatError(f"{what}: unsupported .pte version {bytes(view[4:8])!r}; this reader handles b'ET12'")
    header = read_extended_header(view, what)
    flat = view
    if header is not None:
        if not (8 + _EH_MIN_LENGTH <= header.program_size <= len(view)):
            raise FormatError(f"{what}: extended header program_size {header.program_size} is outside the "
                              f"file ({len(view)} bytes)")
        if header.segment_data_size and header.segment_base_offset + header.segment_data_size > len(view):
            raise FormatError(f"{what}: extended header places {header.segment_data_size} bytes of segment data at "
                              f"offset {header.segment_base_offset}, past the end of the file ({len(view)} bytes; "
                              "truncated?)")
        flat = view[: header.program_size]
    program = _CODEC.decode(flat, what=what)
    segments: list[memoryview] = []
    for i, seg in enumerate(program.segments or ()):
        if header is None:
            if seg.size == 0:  # upstream writes an empty placeholder segment when constants are external
                segments.append(view[0:0])
                continue
            raise FormatError(f"{what}: program lists {len(program.segments)} segments but has no extended header")
        start = header.segment_base_offset + seg.offset
        if header.segment_base_offset < header.program_size or start + seg.size > len(view):
            raise FormatError(f"{what}: segment {i} (offset {seg.offset}, size {seg.size}) lies outside the file "
                              f"({len(view)} bytes, segments start at {header.segment_base_offset})")
        segments.append(view[start : start + seg.size])
    _check_segment_refs(program, segments, what)
    return PteFile(program, segments, header)


def serialize_pte(program: Program, segments: Sequence[bytes | memoryview | Pieces] = (), *,
                  segment_alignment: int = 4096) -> bytes:
    """Writes a .pte. `segments` are the raw bytes of each data segment, in `program.segments` order (a segment may
    be `Pieces`, copied piece by piece into the file).

    `program.segments` is rewritten with the laid-out offsets and sizes (each segment aligned to
    `segment_alignment`). Without segments no extended header is written, as upstream does.
    """
    segments = list(segments)
    placed, end = place_segments(segments, segment_alignment)
    program.segments = [DataSegment(offset=off, size=size) for off, size in placed]
    flat = _CODEC.encode(program)
    if not segments:
        return flat
    return assemble(flat, align(_EH.size, SCHEMA_ALIGNMENT),
                    lambda program_size, base: _EH.pack(EH_MAGIC, _EH.size, program_size, base, end),
                    segments, placed, end, segment_alignment)


def reserialize_pte(pte: PteFile, *, segment_alignment: int = 4096) -> bytes:
    """Writes a parsed .pte back out (segments in their original order)."""
    return serialize_pte(pte.program, pte.segments, segment_alignment=segment_alignment)


def load_pte(path) -> PteFile:
    """Memory-maps a .pte file and parses it; segments are views into the mapping."""
    from etlab.schema._files import read_bytes

    view, name = read_bytes(path)
    return deserialize_pte(view, what=name)
