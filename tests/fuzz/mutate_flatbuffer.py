"""FlatBuffer-aware mutation: `FlatMap` finds every field of a seed by walking it with the schema
layouts (etlab.schema._generated.layouts); `mutate_field` overwrites one with a boundary value, aims an
offset at another object (aliasing, cycles) or resizes a vector."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from etlab.schema._generated.layouts import LAYOUTS
from tests.fuzz.mutate_bytes import BOUNDARY_FLOATS, int_value, mutate_bytes, pack_int

SIZE = {"?": 1, "b": 1, "B": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "f": 4, "d": 8}


@dataclass(frozen=True)
class Field:
    """One FlatBuffer field of a seed: where it is, how wide, and what it means."""

    pos: int
    width: int
    kind: str   # "uoffset" | "soffset" | "vtslot" | "vlen" | "tag" | "enum" | "scalar"
    code: str   # struct code of its value ("I", "q", "d", ...)


class FlatMap:
    """The fields of one valid FlatBuffer, found by walking it with the schema layouts.

    Why: overwriting bytes at random mostly hits string contents and padding; a map of where the
    offsets and lengths are lets every mutation land on something a reader trusts.
    """

    def __init__(self, buf: bytes, ns: str, base: int = 0):
        self.buf, self.ns = buf, ns
        self.fields: list[Field] = []
        self.objects: list[int] = []  # positions of tables, vectors and strings (offset targets)
        self._seen: set[int] = set()
        root_table = LAYOUTS["roots"][ns][0]
        self._add(base, 4, "uoffset", "I")
        self._table(base + self._u32(base), root_table, 0)

    def _u32(self, pos: int) -> int:
        return struct.unpack_from("<I", self.buf, pos)[0]

    def _add(self, pos: int, width: int, kind: str, code: str) -> None:
        if 0 <= pos and pos + width <= len(self.buf):
            self.fields.append(Field(pos, width, kind, code))

    def _table(self, pos: int, tname: str, depth: int) -> None:
        if pos in self._seen or depth > 64 or not 0 <= pos <= len(self.buf) - 4:
            return
        self._seen.add(pos)
        self.objects.append(pos)
        self._add(pos, 4, "soffset", "i")
        vt = pos - struct.unpack_from("<i", self.buf, pos)[0]
        if not 0 <= vt <= len(self.buf) - 4:
            return
        vt_size = struct.unpack_from("<H", self.buf, vt)[0]
        self._add(vt, 2, "vtslot", "H")
        self._add(vt + 2, 2, "vtslot", "H")

        def slot(i: int) -> int:
            at = vt + 4 + 2 * i
            inside = 4 + 2 * i + 2 <= vt_size and at + 2 <= len(self.buf)
            return struct.unpack_from("<H", self.buf, at)[0] if inside else 0

        for _name, i, kind, typ, _align, _default in LAYOUTS["tables"][self.ns][tname]:
            self._add(vt + 4 + 2 * i, 2, "vtslot", "H") if 4 + 2 * i + 2 <= vt_size else None
            off = slot(i)
            if not off:
                continue
            at = pos + off
            if kind in ("scalar", "enum"):
                code = typ if kind == "scalar" else LAYOUTS["enums"][typ]["base"]
                self._add(at, SIZE[code], kind, code)
                continue
            if kind == "union":
                tag_off = slot(i - 1)
                if tag_off:
                    self._add(pos + tag_off, 1, "tag", "B")
                    tag = self.buf[pos + tag_off]
                    members = LAYOUTS["unions"][typ]
                    self._add(at, 4, "uoffset", "I")
                    if 0 < tag <= len(members) and at + 4 <= len(self.buf):
                        self._table(at + self._u32(at), members[tag - 1], depth + 1)
                continue
            self._add(at, 4, "uoffset", "I")
            if at + 4 > len(self.buf):
                continue
            target = at + self._u32(at)
            if kind == "string":
                self._vector_head(target)
            elif kind == "table":
                self._table(target, typ, depth + 1)
            elif kind == "vector":
                self._vector(target, typ, depth)

    def _vector_head(self, pos: int) -> int:
        if not 0 <= pos <= len(self.buf) - 4:
            return 0
        self.objects.append(pos)
        self._add(pos, 4, "vlen", "I")
        return self._u32(pos)

    def _vector(self, pos: int, typ, depth: int) -> None:
        ekind, etype = typ
        n = self._vector_head(pos)
        if ekind in ("scalar", "enum"):
            code = etype if ekind == "scalar" else LAYOUTS["enums"][etype]["base"]
            for j in range(min(n, 64)):  # a few elements are enough: they all mean the same
                self._add(pos + 4 + j * SIZE[code], SIZE[code], ekind, code)
            return
        for j in range(min(n, 4096)):
            at = pos + 4 + 4 * j
            if at + 4 > len(self.buf):
                return
            self._add(at, 4, "uoffset", "I")
            target = at + self._u32(at)
            if ekind == "string":
                self._vector_head(target)
            else:
                self._table(target, etype, depth + 1)


def mutate_field(rng: random.Random, buf: bytearray, fmap: FlatMap) -> None:
    """Overwrites one mapped field with a value chosen for what the field is."""
    if not fmap.fields:
        return mutate_bytes(rng, buf)
    f = rng.choice(fmap.fields)
    if f.pos + f.width > len(buf):
        return mutate_bytes(rng, buf)
    if f.code in ("f", "d"):
        struct.pack_into("<" + f.code, buf, f.pos, rng.choice(BOUNDARY_FLOATS))
        return None
    old = int.from_bytes(buf[f.pos : f.pos + f.width], "little", signed=f.code.islower())
    if f.kind == "uoffset" and fmap.objects and rng.random() < 0.5:
        # Aim at another object: aliasing, a cycle back to an ancestor, or a table of the wrong type.
        new = rng.choice(fmap.objects) - f.pos
    elif f.kind == "vlen" and rng.random() < 0.5:
        new = rng.choice((0, old + 1, old - 1, old * 2, 2**31 - 1, 2**32 - 1, len(buf), len(buf) // 4))
    elif f.kind == "tag":
        new = rng.randrange(0, 16)
    elif f.kind == "enum":
        new = rng.choice((rng.randrange(-3, 32), old + 1, old - 1, 127, -128))
    else:
        new = int_value(rng, old, f.width, f.code.islower())
    pack_int(buf, f.pos, f.width, new)
    return None
