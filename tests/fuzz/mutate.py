"""Structure-aware mutators: where offsets, lengths, enums and counts live, and values that break them.

Random bytes rarely get past a FlatBuffer verifier or a zip's CRC, so most mutations here know
the file's structure:

- `FlatMap`: every field of a seed's FlatBuffer found by walking it with the schema layouts
  (`etlab.schema._generated.layouts`): table offsets, vtable slots, vector lengths, union tags,
  enums and scalars, each with its position and width. Mutations overwrite one such field with a
  boundary value, aim an offset at another object (aliasing, cycles) or resize a vector.
- Model mutations: decode the seed into the schema dataclasses, change one leaf (an index, a
  size, an enum, a list) and encode it again: a well-formed file with hostile meaning, the
  input that reaches the runtime's and the Inspector's checks behind the verifier.
- JSON and zip mutations for ETRecords: change one node of the manifest and re-zip, or damage
  the zip's own headers.
- Byte mutations (flips, boundary words, splices, truncation) on top, for anything else.

Everything is driven by one `random.Random`, so a worker's stream of inputs is reproducible.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import io
import json
import random
import struct
import warnings
import zipfile
from dataclasses import dataclass

from etlab.schema._generated.layouts import LAYOUTS

_SIZE = {"?": 1, "b": 1, "B": 1, "h": 2, "H": 2, "i": 4, "I": 4, "q": 8, "Q": 8, "f": 4, "d": 8}
_INT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
BOUNDARY_INTS = (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 4095, 4096, 65535, 65536,
                 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)
BOUNDARY_FLOATS = (0.0, -0.0, 1.0, -1.0, 1e-45, 3.4e38, 1e308, float("inf"), float("-inf"), float("nan"))
MAX_INPUT = 4 << 20  # mutations never grow an input past this


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
                self._add(at, _SIZE[code], kind, code)
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
                self._add(pos + 4 + j * _SIZE[code], _SIZE[code], ekind, code)
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


# -- primitive value choices ----------------------------------------------------------------------


def _int_value(rng: random.Random, old: int, width: int, signed: bool) -> int:
    """A value for an integer field of `width` bytes: a boundary, a neighbour of the old value, or random."""
    bits = 8 * width
    r = rng.random()
    if r < 0.45:
        v = rng.choice(BOUNDARY_INTS)
        v = -v if signed and rng.random() < 0.3 else v
    elif r < 0.8:
        v = old + rng.choice((-1, 1, -2, 2, -4, 4, 8, 16, -16, 64, 1024))
    elif r < 0.9:
        v = old * rng.choice((2, 3, 256, 65536)) if old else rng.randrange(1 << min(bits, 20))
    else:
        v = rng.getrandbits(bits)
    return v & ((1 << bits) - 1)  # stored as raw bits, two's complement for signed fields


def _pack_int(buf: bytearray, pos: int, width: int, value: int) -> None:
    struct.pack_into("<" + _INT_CODES[width], buf, pos, value & ((1 << 8 * width) - 1))


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
        new = _int_value(rng, old, f.width, f.code.islower())
    _pack_int(buf, f.pos, f.width, new)
    return None


def mutate_bytes(rng: random.Random, buf: bytearray) -> None:
    """One blind byte-level change: bit flip, boundary word, copy, insert, delete or truncate."""
    n = len(buf)
    if n == 0:
        buf.extend(rng.randbytes(rng.randrange(1, 64)))
        return
    op = rng.randrange(8)
    at = rng.randrange(n)
    if op == 0:
        buf[at] ^= 1 << rng.randrange(8)
    elif op == 1:
        buf[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
    elif op == 2 and n >= 8:
        width = rng.choice((2, 4, 8))
        at = rng.randrange(n - width + 1)
        _pack_int(buf, at, width, _int_value(rng, 0, width, True))
    elif op == 3:  # copy a chunk over another place
        length = rng.randrange(1, min(64, n) + 1)
        src, dst = rng.randrange(n - length + 1), rng.randrange(n - length + 1)
        buf[dst : dst + length] = buf[src : src + length]
    elif op == 4 and n < MAX_INPUT:
        buf[at:at] = rng.randbytes(rng.randrange(1, 32)) if rng.random() < 0.5 else buf[at : at + rng.randrange(1, 256)]
    elif op == 5:
        del buf[at : at + rng.randrange(1, 64)]
    elif op == 6:
        del buf[rng.randrange(n):]
    else:
        buf[at : at + 4] = rng.randbytes(4)


# -- model-level mutation -------------------------------------------------------------------------


def _leaves(obj, out: list, depth: int = 0) -> list:
    """(container, key) of every mutable leaf of a dataclass tree: ints, floats, enums, strings, lists."""
    if depth > 40:
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, (memoryview, bytes, bytearray)):
                out.append((obj, f.name))
            elif isinstance(v, list) or dataclasses.is_dataclass(v) or isinstance(v, (int, float, str)) or v is None:
                out.append((obj, f.name))
                if isinstance(v, list) or dataclasses.is_dataclass(v):
                    _leaves(v, out, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:256]):
            out.append((obj, i))
            if dataclasses.is_dataclass(v) or isinstance(v, list):
                _leaves(v, out, depth + 1)
    return out


def _get(container, key):
    return container[key] if isinstance(container, list) else getattr(container, key)


def _set(container, key, value) -> None:
    if isinstance(container, list):
        container[key] = value
    else:
        setattr(container, key, value)


def _new_leaf(rng: random.Random, old, donors: list):
    """A replacement for one leaf value that keeps its Python type (so the encoder accepts it)."""
    if isinstance(old, bool):
        return not old
    if isinstance(old, enum.IntEnum):
        members = list(type(old))
        return rng.choice(members)
    if isinstance(old, int):
        v = _int_value(rng, old, 8, True)
        v = v - (1 << 64) if v >= 1 << 63 else v
        return rng.choice((v, old + 1, old - 1, -1, 0, old * 2, 2**31 - 1, 2**32 - 1, -(2**31)))
    if isinstance(old, float):
        return rng.choice(BOUNDARY_FLOATS)
    if isinstance(old, str):
        return rng.choice(("", old + "x", old[: len(old) // 2], "../../x", "\u00e9" * 3, old * 2,
                           rng.choice(donors) if donors else old))
    if isinstance(old, (memoryview, bytes, bytearray)):
        b = bytearray(old)
        mutate_bytes(rng, b)
        return bytes(b)
    if isinstance(old, list):
        lst = list(old)
        op = rng.randrange(5)
        if op == 0 or not lst:
            return []
        if op == 1:
            del lst[rng.randrange(len(lst))]
        elif op == 2:
            lst.insert(rng.randrange(len(lst) + 1), copy.deepcopy(rng.choice(lst)))
        elif op == 3:
            rng.shuffle(lst)
        else:
            lst.extend(copy.deepcopy(lst[: rng.randrange(1, 4)]))
        return lst
    if old is None or dataclasses.is_dataclass(old):
        return None if old is not None else old
    return old


class ModelMutator:
    """Decodes a seed once; each call changes one to three leaves, encodes, and restores the seed.

    Why restore instead of copying: deep-copying a decoded program per input would cost more
    than the loader under test; a change and its undo are cheap.
    """

    def __init__(self, decode, encode, data: bytes):
        self.model = decode(data)
        self.encode = encode
        # Every change is undone before the next call, so the leaves found once stay valid.
        self.leaves = _leaves(self.model, [])
        self.donors = [v for c, k in self.leaves if isinstance(v := _get(c, k), str)][:64]

    def __call__(self, rng: random.Random) -> bytes | None:
        leaves = self.leaves
        undo = []
        try:
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                container, key = rng.choice(leaves)
                old = _get(container, key)
                undo.append((container, key, old))
                _set(container, key, _new_leaf(rng, old, self.donors))
            return self.encode(self.model)
        except Exception:  # the encoder refuses values it cannot store: not an input
            return None
        finally:
            for container, key, old in reversed(undo):
                _set(container, key, old)


# -- JSON and zip (ETRecord) ------------------------------------------------------------------------


def _json_nodes(obj, out: list, depth: int = 0) -> list:
    if depth > 60 or len(out) > 200_000:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((obj, k))
            _json_nodes(v, out, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((obj, i))
            _json_nodes(v, out, depth + 1)
    return out


def _new_json(rng: random.Random, old, donors: list):
    r = rng.random()
    if r < 0.1:
        return None
    if r < 0.2:
        return rng.choice(donors) if donors else old  # a value from elsewhere in the file
    if isinstance(old, bool):
        return rng.choice((not old, 0, "true"))
    if isinstance(old, int):
        v = _int_value(rng, old, 8, True)
        return rng.choice((v - (1 << 64) if v >= 1 << 63 else v, -old - 1, old + 1, 2**70, 1.5, str(old)))
    if isinstance(old, float):
        return rng.choice((1e308, -1e308, 0.0, 1, str(old)))
    if isinstance(old, str):
        return rng.choice(("", old + "_", "aten.from_file.default", "torch.float64", "sparse_coo", "../x",
                           old * 3, 7, [old]))
    if isinstance(old, list):
        lst = list(old)
        if not lst or rng.random() < 0.2:
            return rng.choice(([], {}, "x", 0))
        op = rng.randrange(3)
        if op == 0:
            del lst[rng.randrange(len(lst))]
        elif op == 1:
            lst.append(copy.deepcopy(rng.choice(lst)))
        else:
            rng.shuffle(lst)
        return lst
    if isinstance(old, dict):
        d = dict(old)
        if d and rng.random() < 0.6:
            del d[rng.choice(list(d))]
        else:
            d[rng.choice(("x", "", "__class__", *list(d)[:3]))] = rng.choice((0, "x", [], None))
        return d
    return old


class EtrecordMutator:
    """Mutates an ETRecord zip: one manifest node (then re-zipped), the tensor blob, or the zip itself."""

    def __init__(self, data: bytes):
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            self.entries = {i.filename: zf.read(i) for i in zf.infolist()}
        self.manifest = json.loads(self.entries["etrecord.json"])
        self.nodes = _json_nodes(self.manifest, [])
        self.donors = [c[k] for c, k in self.nodes[:: max(1, len(self.nodes) // 500)]
                       if not isinstance(c[k], (dict, list))]
        self.data = data

    def _zip(self, rng: random.Random, entries: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        method = rng.choice((zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED))
        with zipfile.ZipFile(buf, "w", compression=method) as zf:
            for name, data in entries.items():
                zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data, compress_type=method)
        return buf.getvalue()

    def __call__(self, rng: random.Random) -> bytes:
        r = rng.random()
        if r < 0.6:  # one manifest node
            container, key = rng.choice(self.nodes)
            old = container[key]
            container[key] = _new_json(rng, old, self.donors)
            try:
                text = json.dumps(self.manifest, separators=(",", ":")).encode()
            finally:
                container[key] = old
            return self._zip(rng, {**self.entries, "etrecord.json": text})
        if r < 0.7:  # the tensor blob: truncated or changed
            blob = bytearray(self.entries.get("tensors.bin", b""))
            mutate_bytes(rng, blob)
            return self._zip(rng, {**self.entries, "tensors.bin": bytes(blob)})
        if r < 0.8:  # entries: renamed, duplicated, dropped, added
            entries = list(self.entries.items())
            op = rng.randrange(4)
            if op == 0:
                entries.append(entries[0])
            elif op == 1 and entries:
                entries.pop(rng.randrange(len(entries)))
            elif op == 2:
                entries.append((rng.choice(("../evil.pth", "/abs", "x", "ETRECORD_V0", "etrecord.json/")), b"x"))
            else:
                i = rng.randrange(len(entries))
                entries[i] = (rng.choice(("tensors.bin", "etrecord.json", "a/../etrecord.json")), entries[i][1])
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as zf, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Duplicate name" is the point here
                for name, data in entries:
                    zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
            return buf.getvalue()
        # the zip's own headers (sizes, CRCs, offsets, methods): byte-level on the original
        buf = bytearray(self.data)
        for _ in range(rng.randrange(1, 4)):
            mutate_zip_header(rng, buf)
        return bytes(buf)


_ZIP_FIELDS = {  # signature -> (offset, width) of the integer fields worth breaking
    b"PK\x03\x04": ((6, 2), (8, 2), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2)),
    b"PK\x01\x02": ((8, 2), (10, 2), (16, 4), (20, 4), (24, 4), (28, 2), (30, 2), (32, 2), (42, 4)),
    b"PK\x05\x06": ((8, 2), (10, 2), (12, 4), (16, 4), (20, 2)),
}


def mutate_zip_header(rng: random.Random, buf: bytearray) -> None:
    """Overwrites one integer field of a local header, central directory entry or end record."""
    spots = [(i, f) for sig, fields in _ZIP_FIELDS.items() for i in _find_all(buf, sig) for f in fields]
    if not spots:
        return mutate_bytes(rng, buf)
    at, (off, width) = rng.choice(spots)
    if at + off + width <= len(buf):
        old = int.from_bytes(buf[at + off : at + off + width], "little")
        _pack_int(buf, at + off, width, _int_value(rng, old, width, False))
    return None


def _find_all(buf: bytearray, sig: bytes) -> list[int]:
    out, i = [], buf.find(sig)
    while i >= 0 and len(out) < 64:
        out.append(i)
        i = buf.find(sig, i + 1)
    return out


# -- upstream ETRecords: torch.save members with pickles that share containers -------------------------

_GRAFT_MEMO = 900_000  # a memo index the member's own pickle never uses (torch.save numbers from 0)


def shared_reference_pickle(rng: random.Random, base: bytes | None = None) -> bytes:
    """A protocol-2 pickle whose containers hold earlier ones many times over (memo gets): a few
    bytes per level, refs**levels elements as a tree. Deep and narrow (2 refs, up to 80 levels) or
    shallow and wide (thousands of refs), lists, tuples or dicts, sometimes a container that holds
    itself. With `base` (a member's own pickle), its value is the leaf every level refers to, so the
    member's tensors are shared too. Why: the issue-24 hang (a walk that revisits shared objects)
    is invisible to byte mutations; this builds the shape on purpose."""
    if base is not None and base.endswith(b".") and base[:2] == b"\x80\x02":
        out = bytearray(base[:-1])  # its value on the stack
    else:
        out = bytearray(b"\x80\x02" + rng.choice((b"N", b"K\x07", b"]", b")", b"}")))
    put = b"r" + _GRAFT_MEMO.to_bytes(4, "little")
    out += put
    levels = rng.choice((rng.randrange(1, 8), rng.randrange(8, 30), rng.randrange(30, 81)))
    refs = rng.choice((2, 2, 3, rng.randrange(2, 16), rng.randrange(100, 5000)))
    if refs > 16:
        levels = min(levels, rng.randrange(1, 5))
    for i in range(1, levels + 1):
        get = b"j" + (_GRAFT_MEMO + i - 1).to_bytes(4, "little")
        kind = rng.choice(("list", "list", "tuple", "dict"))
        out += b"0"  # POP the previous level (it stays in the memo)
        if kind == "list":
            out += b"]" + b"r" + (_GRAFT_MEMO + i).to_bytes(4, "little") + b"(" + get * refs + b"e"
            if rng.random() < 0.05:  # the list also holds itself
                out += b"j" + (_GRAFT_MEMO + i).to_bytes(4, "little") + b"a"
        elif kind == "tuple":
            out += b"(" + get * refs + b"t" + b"r" + (_GRAFT_MEMO + i).to_bytes(4, "little")
        else:
            out += b"}" + b"r" + (_GRAFT_MEMO + i).to_bytes(4, "little") + b"("
            for k in range(refs):
                out += b"J" + k.to_bytes(4, "little") + get
            out += b"u"
    return bytes(out + b".")


def replace_torch_pickle(member: bytes, pkl: bytes) -> bytes | None:
    """A torch.save zip with its data.pkl replaced (its storages kept); None if `member` is not one."""
    try:
        with zipfile.ZipFile(io.BytesIO(member)) as zf:
            entries = [(i.filename, zf.read(i)) for i in zf.infolist()]
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    if not any(n.endswith("/data.pkl") for n, _ in entries):
        return None
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in entries:
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)),
                        pkl if name.endswith("/data.pkl") else data)
    return buf.getvalue()


def torch_pickle(member: bytes) -> bytes | None:
    """The data.pkl of a torch.save zip, or None."""
    try:
        with zipfile.ZipFile(io.BytesIO(member)) as zf:
            name = next((n for n in zf.namelist() if n.endswith("/data.pkl")), None)
            return zf.read(name) if name else None
    except (zipfile.BadZipFile, OSError, ValueError):
        return None


class UpstreamEtrecordMutator:
    """Mutates an ETRecord in upstream's layout (torch.export JSON and torch.save members): a
    torch.save member's pickle rebuilt to share containers (`shared_reference_pickle`) or damaged
    byte-wise, one node of a JSON entry, or the zip's headers."""

    def __init__(self, data: bytes):
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            self.entries = {i.filename: zf.read(i) for i in zf.infolist()}
        self.data = data
        self.members = [n for n, b in self.entries.items() if torch_pickle(b) is not None]
        self.json = {}
        for name, raw in self.entries.items():
            try:
                value = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(value, (dict, list)):
                nodes = _json_nodes(value, [])
                if nodes:
                    self.json[name] = (value, nodes)

    def _zip(self, entries: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for name, data in entries.items():
                zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
        return buf.getvalue()

    def with_pickle(self, name: str, pkl: bytes) -> bytes:
        """The ETRecord with torch.save member `name`'s pickle replaced by `pkl`."""
        return self._zip({**self.entries, name: replace_torch_pickle(self.entries[name], pkl)})

    def __call__(self, rng: random.Random) -> bytes:
        r = rng.random()
        if self.members and r < 0.7:  # a torch.save member's pickle
            name = rng.choice(self.members)
            base = torch_pickle(self.entries[name])
            if r < 0.5:
                pkl = shared_reference_pickle(rng, base if rng.random() < 0.5 else None)
            else:
                damaged = bytearray(base)
                for _ in range(rng.choice((1, 1, 2, 4))):
                    mutate_bytes(rng, damaged)
                pkl = bytes(damaged)
            return self.with_pickle(name, pkl)
        if self.json and r < 0.9:  # one node of a JSON entry (a program, a map)
            name = rng.choice(sorted(self.json))
            value, nodes = self.json[name]
            container, key = rng.choice(nodes)
            old = container[key]
            container[key] = _new_json(rng, old, [])
            try:
                text = json.dumps(value, separators=(",", ":")).encode()
            finally:
                container[key] = old
            return self._zip({**self.entries, name: text})
        buf = bytearray(self.data)
        for _ in range(rng.randrange(1, 4)):
            mutate_zip_header(rng, buf)
        return bytes(buf)
