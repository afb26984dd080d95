"""The processed blob of an XNNPACK delegate (upstream's `XnnpackBackend`): header, graph, constants.

Layout: an optional ``XH00`` header (its magic at bytes 4..8, where a FlatBuffer's identifier
would be) giving the offset and size of the FlatBuffer (`xnnpack.fbs`, identifier XN01 or the
older XN00) and of the constant data that follows it. Without the header the whole blob is the
FlatBuffer. Constants are either byte ranges of that constant data or keys into the program's
named data (`ConstantDataOffset.named_key`).

The models are made from the generated layouts rather than written out: the schema has ~30
tables whose fields are plain scalars and id lists, and a hand copy would only drift from it.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

from etlab.errors import FormatError
from etlab.schema._codec import TableCodec, make_enum
from etlab.schema._generated.layouts import LAYOUTS

_NS = "xnnpack"
HEADER_MAGIC = b"XH00"
IDENTIFIERS = (b"XN01", b"XN00")
_HEADER = struct.Struct("<4s4sHIIIQ")  # zeros, magic, header length, fb offset, fb size, const offset, const size
UINT64_MAX = (1 << 64) - 1
INVALID_VALUE_ID = (1 << 32) - 1
FLAG_EXTERNAL_INPUT, FLAG_EXTERNAL_OUTPUT = 1, 2

XNNDatatype = make_enum(f"{_NS}.XNNDatatype")
NODE_KINDS: tuple[str, ...] = tuple(LAYOUTS["union_tags"][f"{_NS}.NodeUnion"])  # tag i + 1 -> NODE_KINDS[i]


def _model_class(table: str, rows: list) -> type:
    """A dataclass for one table, with the table's field names (all optional, as in the buffer)."""
    fields = []
    for name, _slot, kind, typ, _align, _default in rows:
        is_bytes = kind == "vector" and typ == ("scalar", "B")
        fields.append((name, "bytes | None" if is_bytes else "object", dataclasses.field(default=None)))
        if kind == "union" and typ in LAYOUTS["union_tags"]:
            fields.append((name + "_type", "int", dataclasses.field(default=0)))
    cls = dataclasses.make_dataclass(table, fields)
    cls.__module__ = __name__
    return cls


MODELS: dict[str, type] = {t: _model_class(t, rows) for t, rows in LAYOUTS["tables"][_NS].items()}
_CODEC = TableCodec(_NS, MODELS)


@dataclass
class XnnpackBlob:
    """A decoded delegate blob: the graph and the constant data region that follows it."""

    graph: object  # MODELS["XNNGraph"]
    constant_data: memoryview
    identifier: bytes  # the FlatBuffer's file identifier (XN01, or XN00 from older writers)


def node_kind(xnode) -> str:
    """The node's union tag name (`XNNAdd`, `XNNConv2d`, ...), the name XNNPACK users know it by."""
    tag = xnode.xnode_union_type
    return NODE_KINDS[tag - 1] if 0 < tag <= len(NODE_KINDS) else f"<union tag {tag}>"


def _split(view: memoryview, what: str) -> tuple[memoryview, memoryview]:
    """(flatbuffer, constant data) views of the blob, every offset and length checked."""
    if len(view) >= 8 and bytes(view[4:8]) == HEADER_MAGIC:
        if len(view) < _HEADER.size:
            raise FormatError(f"{what}: XNNPACK header is truncated ({len(view)} bytes, needs {_HEADER.size})")
        _zeros, _magic, length, fb_off, fb_size, const_off, const_size = _HEADER.unpack_from(view, 0)
        if length < _HEADER.size:
            raise FormatError(f"{what}: XNNPACK header claims {length} bytes, at least {_HEADER.size} needed")
        if fb_size == 0 or fb_off < length or fb_off + fb_size > len(view):
            raise FormatError(f"{what}: XNNPACK header puts the graph at [{fb_off}, {fb_off + fb_size}), "
                              f"outside the blob's {len(view)} bytes (after its {length}-byte header)")
        if const_off < fb_off + fb_size or const_off + const_size > len(view):
            raise FormatError(f"{what}: XNNPACK header puts constant data at [{const_off}, {const_off + const_size}), "
                              f"which overlaps the graph or runs past the blob's {len(view)} bytes")
        return view[fb_off:fb_off + fb_size], view[const_off:const_off + const_size]
    return view, view[0:0]


def deserialize_xnnpack(data, *, what: str = "XNNPACK delegate") -> XnnpackBlob:
    """Verifies and decodes an XNNPACK delegate blob; FormatError naming `what` if it is malformed.

    Only the container is checked here (header ranges, the FlatBuffer against the schema); what
    the graph means (value ids, shapes, constant ranges) is checked by whoever runs it.
    """
    view = memoryview(data).cast("B")
    flatbuffer, constants = _split(view, what)
    ident = bytes(flatbuffer[4:8]) if len(flatbuffer) >= 8 else b""
    if ident not in IDENTIFIERS:
        raise FormatError(f"{what}: XNNPACK graph identifier is {ident!r}, expected one of "
                          f"{[i.decode() for i in IDENTIFIERS]} (not an XNNPACK delegate blob)")
    graph = _CODEC.decode(flatbuffer, what=what, check_identifier=False)
    return XnnpackBlob(graph, constants, ident)


def serialize_xnnpack(graph, constant_data: bytes = b"") -> bytes:
    """Writes a blob as upstream's serializer lays it out (header, graph, constants, 16-byte aligned)."""
    flatbuffer = _CODEC.encode(graph)
    header_size = -(-_HEADER.size // 16) * 16
    padded_fb = -(-len(flatbuffer) // 16) * 16
    header = _HEADER.pack(b"\0" * 4, HEADER_MAGIC, _HEADER.size, header_size, len(flatbuffer),
                          header_size + padded_fb, len(constant_data))
    return b"".join([header.ljust(header_size, b"\0"), flatbuffer.ljust(padded_fb, b"\0"), bytes(constant_data)])
