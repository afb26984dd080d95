"""Dataclass models <-> FlatBuffers, through the flatc-generated code, with a verifier in front.

Every format module declares dataclasses named after its schema's tables, with the schema's
field names, and gets a `TableCodec` for its namespace. Encoding walks a model and calls the
generated builder functions (`Start`, `Add<Field>`, `End`); decoding first verifies the buffer
against `layouts.LAYOUTS`, then unpacks it with the generated object API and converts to models.

Absent fields decode to None (not to an empty value) so that a decoded file re-encodes exactly
as it was written; models built in code default their vectors to empty lists. A union whose tags
alias one table type (`XNNAdd: _XNNNode2x1`) needs a `<field>_type` model field for its tag.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import struct
from functools import cache

import flatbuffers
import numpy as np

from etlab.errors import FormatError
from etlab.schema._generated.layouts import LAYOUTS

_GEN = "etlab.schema._generated"
_SIZE = {"?": 1, "b": 1, "B": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "f": 4, "d": 8}
_NP = {c: np.dtype(c).newbyteorder("<") if c != "?" else np.dtype(np.bool_) for c in _SIZE}
_U8, _U16, _U32, _I32 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<i")
_SCALAR = {c: struct.Struct("<" + c) for c in _SIZE}
MAX_DEPTH = 64


@cache
def _camel(name: str) -> str:
    """snake_case field name -> the generated code's camelCase (cached: called per field per object)."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _scalar_info(kind: str, typ) -> str:
    """struct code of a scalar or enum field."""
    return typ if kind == "scalar" else LAYOUTS["enums"][typ]["base"]


@cache
@cache
def make_enum(qualified: str) -> type[enum.IntEnum]:
    """The IntEnum for a schema enum ("program.TensorShapeDynamism"), built from the layouts; one class per
    enum, however many schema modules ask for it (program, etdump and flat_tensor all use ScalarType)."""
    schema, name = qualified.rsplit(".", 1)
    cls = enum.IntEnum(name, LAYOUTS["enums"][qualified]["values"])
    cls.__doc__ = f"The {name} enum of upstream's {schema}.fbs, with its numbering (what the files store)."
    return cls


@cache
def _enum_values(qualified: str) -> frozenset[int]:
    return frozenset(LAYOUTS["enums"][qualified]["values"].values())


class _Verifier:
    """Bounds-checks one FlatBuffer against the layouts before anything reads it.

    Besides offsets and lengths it bounds nesting depth and the total work a decode can do:
    offsets may alias (many vector entries naming one table), so without a budget a small
    file could decode into something enormous.
    """

    def __init__(self, buf: memoryview, ns: str, what: str):
        self.buf, self.n, self.ns, self.what = buf, len(buf), ns, what
        self.objects = self.n // 4 + 64   # honest files hold at most one object per 4 bytes
        self.payload = self.n + 1024      # bytes of strings and scalar vectors to be decoded

    def fail(self, msg: str):
        raise FormatError(f"{self.what}: {msg}")

    def read(self, st: struct.Struct, pos: int, ctx: str) -> int:
        if pos < 0 or pos + st.size > self.n:
            self.fail(f"{ctx} at offset {pos} lies outside the buffer ({self.n} bytes)")
        return st.unpack_from(self.buf, pos)[0]

    def spend(self, objects: int, payload: int, ctx: str):
        self.objects -= objects
        self.payload -= payload
        if self.objects < 0 or self.payload < 0:
            self.fail(f"{ctx}: offsets alias one another far more than any writer does (decode would "
                      "be out of proportion to the file)")

    def table(self, pos: int, tname: str, depth: int):
        ctx = f"{tname} table"
        if depth > MAX_DEPTH:
            self.fail(f"{ctx} nested deeper than {MAX_DEPTH}")
        self.spend(1, 0, ctx)
        vt = pos - self.read(_I32, pos, ctx)
        vt_size = self.read(_U16, vt, f"{ctx} vtable")
        t_size = self.read(_U16, vt + 2, f"{ctx} vtable")
        if vt_size < 4 or vt_size % 2 or vt + vt_size > self.n:
            self.fail(f"{ctx} at offset {pos} has a malformed vtable (size {vt_size})")
        if t_size < 4 or pos + t_size > self.n:
            self.fail(f"{ctx} at offset {pos} claims {t_size} bytes, past the end of the buffer")

        def field(slot: int) -> int:
            return self.read(_U16, vt + 4 + 2 * slot, ctx) if 4 + 2 * slot + 2 <= vt_size else 0

        for name, slot, kind, typ, _align, _default in LAYOUTS["tables"][self.ns][tname]:
            voff = field(slot)
            fctx = f"{tname}.{name}"
            if kind == "union":
                # The reader fetches a union's type tag even when its value is absent.
                tag_off = field(slot - 1)
                if tag_off and tag_off + 1 > t_size:
                    self.fail(f"{fctx} type tag at offset {pos + tag_off} overruns its table")
                tag = self.read(_U8, pos + tag_off, fctx) if tag_off else 0
                members = LAYOUTS["unions"][typ]
                if tag > len(members):
                    self.fail(f"{fctx} has union tag {tag}, but {typ} has {len(members)} members")
            if not voff:
                continue
            width = _SIZE[_scalar_info(kind, typ)] if kind in ("scalar", "enum") else 4
            if voff + width > t_size:
                self.fail(f"{fctx} at offset {pos + voff} overruns its table")
            if kind == "enum":
                # Checked here, not while building models, so that a bad file fails before any
                # object is allocated (peak memory of a failing parse stays near the file size).
                self.enum(typ, self.read(_SCALAR[_scalar_info(kind, typ)], pos + voff, fctx), fctx)
            if kind in ("scalar", "enum"):
                continue
            target = pos + voff + self.read(_U32, pos + voff, fctx)
            if kind == "string":
                self.string(target, fctx)
            elif kind == "table":
                self.table(target, typ, depth + 1)
            elif kind == "union":
                if tag:
                    self.table(target, members[tag - 1], depth + 1)
            else:
                self.vector(target, typ, fctx, depth)

    def enum(self, typ: str, value: int, ctx: str):
        if value not in _enum_values(typ):
            self.fail(f"{ctx} has value {value}, which is not a {typ}")

    def string(self, pos: int, ctx: str):
        length = self.read(_U32, pos, ctx)
        if pos + 4 + length > self.n:
            self.fail(f"{ctx}: string of {length} bytes at offset {pos} runs past the end of the buffer")
        self.spend(1, length, ctx)
        try:
            str(self.buf[pos + 4 : pos + 4 + length], "utf-8")  # decodes in place, no bytes copy
        except UnicodeDecodeError as e:
            self.fail(f"{ctx}: string at offset {pos} is not UTF-8 ({e.reason})")

    def vector(self, pos: int, typ, ctx: str, depth: int):
        ekind, etype = typ
        length = self.read(_U32, pos, ctx)
        width = _SIZE[_scalar_info(ekind, etype)] if ekind in ("scalar", "enum") else 4
        if pos + 4 + length * width > self.n:
            self.fail(f"{ctx}: vector of {length} elements at offset {pos} runs past the end of the buffer")
        if ekind in ("scalar", "enum"):
            self.spend(0, length * width, ctx)  # (no schema has enum vectors; _model checks them if one does)
            return
        for j in range(length):
            at = pos + 4 + 4 * j
            target = at + self.read(_U32, at, ctx)
            if ekind == "string":
                self.string(target, f"{ctx}[{j}]")
            else:
                self.table(target, etype, depth + 1)


@dataclasses.dataclass
class TableCodec:
    """Encodes and decodes the dataclass models of one schema namespace.

    `models` maps table name -> dataclass; names and fields follow the .fbs file.
    """

    ns: str
    models: dict[str, type]

    def __post_init__(self):
        self.tables = LAYOUTS["tables"][self.ns]
        self.root, ident = LAYOUTS["roots"][self.ns]
        self.identifier = ident.encode()
        missing = set(self.tables) - set(self.models)
        if missing:
            raise TypeError(f"{self.ns}: no model class for tables {sorted(missing)}")
        self._plans: dict[str, tuple] = {}
        self._gens: dict[str, object] = {}
        self._bytes_fields = {
            t: {f.name for f in dataclasses.fields(self.models[t]) if "bytes" in str(f.type)} for t in self.tables
        }

    def _gen(self, table: str):
        """The generated module of `table` (import_module's cache lookup is not free: cached here)."""
        gen = self._gens.get(table)
        if gen is None:
            gen = self._gens[table] = importlib.import_module(f"{_GEN}.{self.ns}.{table}")
        return gen

    # -- encoding -------------------------------------------------------------------------------

    def encode(self, root, *, size_prefixed: bool = False, identifier: bool = True) -> bytes:
        """The FlatBuffer bytes of a dataclass tree (optionally size-prefixed, with or without the file identifier):
        the writing half of the codec the readers verify against."""
        builder = flatbuffers.Builder(1024)
        off = self._pack(builder, root, self.root)
        ident = self.identifier if identifier else None
        if size_prefixed:
            builder.FinishSizePrefixed(off, ident)
        else:
            builder.Finish(off, ident)
        return builder.Output()

    def _plan(self, table: str):
        """Per field of `table`: what `_pack` needs (name, kind, type, alignment, bytes?, adder, union-type
        adder), looked up once per table instead of once per field of every object written."""
        plan = self._plans.get(table)
        if plan is None:
            gen = self._gen(table)
            plan = []
            for name, _slot, kind, typ, align, _default in self.tables[table]:
                adder_name = "Add" + _camel(name)[:1].upper() + _camel(name)[1:]
                union_adder = getattr(gen, adder_name + "Type") if kind == "union" else None
                plan.append((name, kind, typ, align, name in self._bytes_fields[table], getattr(gen, adder_name),
                             union_adder))
            plan = self._plans[table] = (gen, tuple(plan))
        return plan

    def _pack(self, b: flatbuffers.Builder, obj, table: str) -> int:
        if type(obj) is not self.models[table]:
            raise TypeError(f"expected {self.models[table].__name__} for a {self.ns}.{table}, got {type(obj).__name__}")
        gen, fields = self._plan(table)
        offsets = {}
        # Children first: FlatBuffers are built back to front and tables cannot nest in-progress.
        for name, kind, typ, align, is_bytes, _adder, _union_adder in fields:
            v = getattr(obj, name)
            if v is None or kind in ("scalar", "enum"):
                continue
            if kind == "string":
                offsets[name] = b.CreateString(v)
            elif kind == "table":
                offsets[name] = self._pack(b, v, typ)
            elif kind == "union":
                member = type(v).__name__
                offsets[name] = self._pack(b, v, member)
            else:
                offsets[name] = self._vector(b, v, typ, align, is_bytes)
        gen.Start(b)
        for name, kind, typ, _align, _is_bytes, adder, union_adder in fields:
            if kind in ("scalar", "enum"):
                v = getattr(obj, name)
                if v is not None:
                    adder(b, v if kind == "scalar" and typ in "fd?" else int(v))
            elif name in offsets:
                if kind == "union":
                    tag = getattr(obj, name + "_type", None)  # set when several tags name one table
                    if not tag:
                        tag = LAYOUTS["unions"][typ].index(type(getattr(obj, name)).__name__) + 1
                    union_adder(b, tag)
                adder(b, offsets[name])
        return gen.End(b)

    def _vector(self, b: flatbuffers.Builder, v, typ, align, is_bytes: bool) -> int:
        ekind, etype = typ
        if ekind in ("scalar", "enum"):
            code = _scalar_info(ekind, etype)
            if is_bytes:
                data = np.frombuffer(v, dtype=np.uint8) if not isinstance(v, np.ndarray) else v.view(np.uint8)
                n = data.size
                b.StartVector(1, n, align or 1)
                b.head -= n
                b.Bytes[b.head : b.head + n] = data.tobytes() if n else b""
                return b.EndVector()
            arr = np.asarray(v, dtype=_NP[code])
            if align and align > arr.itemsize:
                raise ValueError("force_align is only supported on byte vectors")
            return b.CreateNumpyVector(arr.reshape(-1))
        if ekind == "string":
            offs = [b.CreateString(s) for s in v]
        else:
            offs = [self._pack(b, x, etype) for x in v]
        b.StartVector(4, len(offs), 4)
        for off in reversed(offs):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    # -- decoding -------------------------------------------------------------------------------

    def decode(self, buf, *, what: str, size_prefixed: bool = False, check_identifier: bool = True):
        """Verifies `buf` (bytes-like) and returns the root model. Byte vectors stay views of buf."""
        view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
        start = 4 if size_prefixed else 0
        if len(view) < start + 8:
            raise FormatError(f"{what}: {len(view)} bytes is too short for a FlatBuffer")
        if size_prefixed:
            declared = _U32.unpack_from(view, 0)[0]
            if declared + 4 > len(view):
                raise FormatError(f"{what}: size prefix says {declared} bytes but only {len(view) - 4} follow")
            view = view[4 : 4 + declared]
        if check_identifier and bytes(view[4:8]) != self.identifier:
            raise FormatError(
                f"{what}: file identifier is {bytes(view[4:8])!r}, expected {self.identifier!r} "
                f"(not a .{self.ns} FlatBuffer)"
            )
        root = _U32.unpack_from(view, 0)[0]
        _Verifier(view, self.ns, what).table(root, self.root, 0)
        tcls = getattr(self._gen(self.root), self.root + "T")
        try:
            t = tcls.InitFromBuf(view, root)
            return self._model(t, self.root, what)
        except FormatError:
            raise
        except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:  # verifier should prevent these
            raise FormatError(f"{what}: malformed {self.ns} buffer ({e})") from e

    def _model(self, t, table: str, what: str):
        kwargs = {}
        for name, _slot, kind, typ, _align, _default in self.tables[table]:
            v = getattr(t, _camel(name))
            if v is None:
                pass
            elif kind == "enum":
                v = self._enum(typ, v, f"{table}.{name}", what)
            elif kind == "table":
                v = self._model(v, typ, what)
            elif kind == "union":
                tag = getattr(t, _camel(name) + "Type")
                v = self._model(v, LAYOUTS["unions"][typ][tag - 1], what) if tag else None
                if typ in LAYOUTS["union_tags"]:  # aliased tags: the model keeps which one it was
                    kwargs[name + "_type"] = tag
            elif kind == "vector":
                ekind, etype = typ
                if ekind == "table":
                    v = [self._model(x, etype, what) for x in v]
                elif ekind == "string":
                    v = list(v)
                elif name in self._bytes_fields[table]:
                    v = memoryview(v) if isinstance(v, np.ndarray) else bytes(v)
                else:
                    v = v.tolist() if isinstance(v, np.ndarray) else list(v)
                    if ekind == "enum":
                        v = [self._enum(etype, x, f"{table}.{name}", what) for x in v]
            kwargs[name] = v
        return self.models[table](**kwargs)

    @staticmethod
    def _enum(typ: str, v: int, ctx: str, what: str):
        try:
            return make_enum(typ)(v)
        except ValueError:
            raise FormatError(f"{what}: {ctx} has value {v}, which is not a {typ}") from None
