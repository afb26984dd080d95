"""The file layout .pte and .ptd share: a FlatBuffer with a header spliced in after its first
8 bytes (root offset + file identifier), then zero padding, then the aligned data segments."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def align(n: int, alignment: int) -> int:
    """`n` rounded up to a multiple of `alignment`."""
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class Pieces:
    """A segment given as the pieces it is made of, in order (a constant segment's aligned tensors and the
    padding between them). `assemble` copies the pieces straight into the file: joining them into one
    segment first would copy every weight twice (the cost of compiling a model with big weights)."""

    parts: tuple
    size: int

    def __len__(self) -> int:
        return self.size


def place_segments(segments: Sequence, alignment: int) -> tuple[list[tuple[int, int]], int]:
    """(offset, size) of each segment relative to the first, each aligned; and the end of the last."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"segment_alignment must be a power of two, got {alignment}")
    placed, end = [], 0
    for data in segments:
        off = align(end, alignment)
        placed.append((off, len(data)))
        end = off + len(data)
    return placed, end


def assemble(flat: bytes, header_len: int, make_header: Callable[[int, int], bytes], segments: Sequence,
             placed: list[tuple[int, int]], end: int, alignment: int) -> bytes:
    """The whole file. `make_header(flatbuffer_end, segment_base)` returns the header's bytes;
    they are padded to `header_len`, which must keep the FlatBuffer's own alignment."""
    flat_end = len(flat) + header_len
    base = align(flat_end, alignment)
    # One join: the file is allocated and the (possibly large) segments copied once.
    parts = [struct.pack("<I", struct.unpack_from("<I", flat, 0)[0] + header_len),  # the root moved
             flat[4:8], make_header(flat_end, base).ljust(header_len, b"\0"), memoryview(flat)[8:]]
    pos = flat_end
    for (off, size), data in zip(placed, segments):
        parts += [bytes(base + off - pos), *(data.parts if isinstance(data, Pieces) else (data,))]
        pos = base + off + size
    parts.append(bytes(base + end - pos))
    return b"".join(parts)
