"""The .ptd external-data file: named tensors (or opaque blobs) stored in aligned segments.

File layout: a FlatBuffer (identifier FT01) whose first 8 bytes are followed by the ``FH01``
header (flatbuffer offset and size, segment base offset and size), then padding, then segments.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from etlab.errors import FormatError
from etlab.schema._codec import TableCodec, make_enum
from etlab.schema._container import assemble, place_segments
from etlab.schema._scalars import DataSegment

ScalarType = make_enum("scalar_type.ScalarType")


@dataclass
class TensorLayout:
    """How to read a named blob as a tensor: dtype, sizes and dim order."""

    scalar_type: ScalarType = ScalarType.FLOAT
    sizes: list[int] | None = field(default_factory=list)
    dim_order: list[int] | None = field(default_factory=list)



@dataclass
class NamedData:
    """A tensor stored by key (its fully qualified name): the segment with its bytes and their layout."""

    key: str | None = None
    segment_index: int = 0
    tensor_layout: TensorLayout | None = None


@dataclass
class FlatTensor:
    """The root of a .ptd file: external tensor data (e.g. weights kept out of the .pte), looked up by key."""

    version: int = 0
    segments: list[DataSegment] | None = field(default_factory=list)
    named_data: list[NamedData] | None = field(default_factory=list)


_CODEC = TableCodec("flat_tensor", {c.__name__: c for c in (TensorLayout, DataSegment, NamedData, FlatTensor)})

_FH = struct.Struct("<4sIQQQQ")  # magic, length, flatbuffer_offset, flatbuffer_size, segment base, data size
FH_MAGIC = b"FH01"
_HEADER_PADDED = 48  # _FH.size rounded up to the FlatBuffer alignment (16)


@dataclass
class FlatTensorHeader:
    """The fixed-size header in front of a .ptd's FlatBuffer: where the FlatBuffer and the segment data start and how
    large they are."""

    flatbuffer_offset: int
    flatbuffer_size: int
    segment_base_offset: int
    segment_data_size: int
    length: int = _FH.size


@dataclass
class PtdFile:
    """A whole .ptd: the FlatTensor table plus the raw bytes of each segment."""

    flat_tensor: FlatTensor
    segments: list[memoryview | bytes] = field(default_factory=list)
    header: FlatTensorHeader | None = None

    def named(self) -> dict[str, tuple[TensorLayout | None, memoryview | bytes]]:
        """key -> (layout, bytes) for every named entry."""
        return {nd.key: (nd.tensor_layout, self.segments[nd.segment_index]) for nd in self.flat_tensor.named_data or ()}


def deserialize_ptd(data, *, what: str = "external data") -> PtdFile:
    """Parses a .ptd from bytes/memoryview/mmap; segment bytes are zero-copy views."""
    view = memoryview(data).cast("B")
    if len(view) < 8 + _FH.size or bytes(view[4:8]) != b"FT01" or bytes(view[8:12]) != FH_MAGIC:
        raise FormatError(f"{what}: not a .ptd file (expected identifier b'FT01' and header b'FH01')")
    _, length, fb_off, fb_size, base, size = _FH.unpack_from(view, 8)
    header = FlatTensorHeader(fb_off, fb_size, base, size, length)
    if length < _FH.size:
        raise FormatError(f"{what}: FH01 header claims {length} bytes, at least {_FH.size} needed")
    total = fb_off + fb_size
    if total > len(view) or base > len(view) or base + size > len(view):
        raise FormatError(f"{what}: header places data past the end of the file ({len(view)} bytes)")
    flat_tensor = _CODEC.decode(view[:total], what=what)
    segments = []
    for i, seg in enumerate(flat_tensor.segments or ()):
        start = base + seg.offset
        if start + seg.size > base + size:
            raise FormatError(f"{what}: segment {i} (offset {seg.offset}, size {seg.size}) lies outside the "
                              f"segment data ({size} bytes)")
        segments.append(view[start : start + seg.size])
    for nd in flat_tensor.named_data or ():
        if nd.segment_index >= len(segments):
            raise FormatError(f"{what}: named data {nd.key!r} refers to segment {nd.segment_index}, "
                              f"but there are {len(segments)}")
    return PtdFile(flat_tensor, segments, header)


def serialize_ptd(flat_tensor: FlatTensor, segments=(), *, segment_alignment: int = 128) -> bytes:
    """Writes a .ptd; `flat_tensor.segments` is rewritten to the laid-out offsets."""
    segments = list(segments)
    placed, end = place_segments(segments, segment_alignment)
    flat_tensor.segments = [DataSegment(offset=off, size=size) for off, size in placed]
    flat = _CODEC.encode(flat_tensor)
    return assemble(flat, _HEADER_PADDED,
                    lambda _, base: _FH.pack(FH_MAGIC, _FH.size, _HEADER_PADDED, len(flat), base, end),
                    segments, placed, end, segment_alignment)


def reserialize_ptd(ptd: PtdFile, *, segment_alignment: int = 128) -> bytes:
    """A loaded .ptd written back to bytes (its segments re-placed at `segment_alignment`): how a round trip shows
    the reader lost nothing."""
    return serialize_ptd(ptd.flat_tensor, ptd.segments, segment_alignment=segment_alignment)
