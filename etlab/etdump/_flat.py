"""Vectorized, bounds-checked FlatBuffer access: read one field of many tables at once with numpy.

The generic decoder in `etlab.schema` walks a FlatBuffer object by object; for an ETDump of a
million events that is far too slow. Here every step works on an array of positions (all the
Event tables of a file, say) and keeps the verifier's guarantees: every offset followed is
checked to lie inside the buffer, vtables and tables must fit, fields must lie inside their
table, strings must be UTF-8, and the bytes decoded are budgeted so that aliased offsets cannot
blow a small file up into a huge decode. Any violation raises `FormatError` naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd

from etlab.errors import FormatError
from etlab.schema import LAYOUTS

_MIN, _MAX, _OR = np.minimum.reduce, np.maximum.reduce, np.bitwise_or.reduce
_ANY = np.logical_or.reduce  # x.any() without its Python-level wrapper (pass axis=None for 2-D)
_SHIFT = {2: 1, 4: 2, 8: 3}
_SMALL = 256
_EMPTY = np.zeros(0, dtype=np.int64)
_WIDTH: dict[str, int] = {}


def _width(dtype: str) -> int:
    w = _WIDTH.get(dtype)
    if w is None:
        w = _WIDTH[dtype] = np.dtype(dtype).itemsize
    return w


class FlatBuffer:
    """A FlatBuffer held as a uint8 array; positions are relative to the start of the buffer."""

    def __init__(self, data: np.ndarray, what: str, *, file: np.ndarray | None = None, base: int = 0):
        """`data` is the FlatBuffer; it starts `base` bytes into `file` (the size prefix comes
        first), and writers align scalars relative to the file, so aligned reads go through it."""
        self.data, self.n, self.what = data, len(data), what
        self.file, self.base = (data, 0) if file is None else (file, base)
        self._views: dict[str, np.ndarray] = {}
        # Strings and vector elements a decode may produce: an honest file holds each once.
        self.budget = self.n + 1024

    def fail(self, msg: str):
        """Raises a FormatError naming the file: every bounds check ends here."""
        raise FormatError(f"{self.what}: {msg}")

    def spend(self, nbytes: int, ctx: str):
        """Charges `nbytes` of decoding work to the file's budget; a FormatError when aliased offsets would make the
        decode out of proportion to the file."""
        self.budget -= int(nbytes)
        if self.budget < 0:
            self.fail(f"{ctx}: offsets alias one another far more than any writer does (decode would "
                      "be out of proportion to the file)")

    def _view(self, dtype: str) -> tuple[np.ndarray, int]:
        """(the buffer from its first file-aligned `dtype` on, viewed as `dtype`; that start r).
        A position p that is aligned in the file has p % w == r, and its value is view[p >> log2(w)]."""
        v = self._views.get(dtype)
        if v is None:
            w = _width(dtype)
            r = -self.base % w
            end = max(r, self.n - (self.n - r) % w)
            v = self._views[dtype] = (self.data[r:end].view(dtype), r)
        return v

    def read(self, pos: np.ndarray, dtype: str, ctx: str) -> np.ndarray:
        """The little-endian `dtype` values at each position in `pos` (int64 array)."""
        w = _width(dtype)
        if pos.size == 0:
            return np.zeros(0, dtype=dtype)
        if pos.dtype != np.int64:
            pos = pos.astype(np.int64)
        # one reduction checks both ends: a negative position is huge as an unsigned number
        if int(_MAX(pos.view(np.uint64))) > self.n - w:
            lo, hi = int(_MIN(pos)), int(_MAX(pos))
            bad = lo if lo < 0 else hi
            self.fail(f"{ctx} at offset {bad} lies outside the buffer ({self.n} bytes)")
        if w == 1:
            return self.data[pos].view(dtype)
        view, r = self._view(dtype)
        if int(_OR(pos ^ r if r else pos)) & (w - 1) == 0:  # aligned in the file, as conforming writers leave it
            return view[pos >> _SHIFT[w]]
        idx = pos[:, None] + np.arange(w)
        return np.ascontiguousarray(self.data[idx]).view(dtype)[:, 0]

    def tables(self, pos: np.ndarray, ns: str, tname: str) -> Tables:
        """Checks the tables at `pos` (their vtables and sizes) and returns an accessor; the
        vtables (header and every field offset) are read in one gather."""
        ctx = f"{tname} table"
        pos = np.asarray(pos, dtype=np.int64)
        fields, slots, entry, slot_end = _table_info(ns, tname)
        if pos.size == 0:
            z = _EMPTY
            return Tables(self, tname, fields, z, z, z, z, np.zeros((slots, 0), dtype=np.uint16))
        vt = pos - self.read(pos, "<i4", ctx)  # int64
        if int(_MAX(vt.view(np.uint64))) > self.n - 4:  # (a negative position is huge as unsigned)
            lo, hi = int(_MIN(vt)), int(_MAX(vt))
            self.fail(f"{ctx} vtable at offset {lo if lo < 0 else hi} lies outside the buffer ({self.n} bytes)")
        # header (2 entries) and field slots; entries past the buffer end are clamped to an
        # in-bounds position and masked below (they lie past the vtable, which is checked to fit)
        at = np.minimum(vt + entry, self.n - 2)
        raw = self.read(at.ravel(), "<u2", f"{ctx} vtable").reshape(at.shape)
        vt_size, t_size = raw[0], raw[1]
        bad_vt = (vt_size < 4) | ((vt_size & 1) != 0) | (vt + vt_size > self.n)
        bad_t = (t_size < 4) | (pos + t_size > self.n)
        if _ANY(bad_vt | bad_t):
            if _ANY(bad_vt):
                i = int(np.argmax(bad_vt))
                self.fail(f"{ctx} at offset {pos[i]} has a malformed vtable (size {vt_size[i]})")
            i = int(np.argmax(bad_t))
            self.fail(f"{ctx} at offset {pos[i]} claims {t_size[i]} bytes, past the end of the buffer")
        voffs = raw[2:]
        voffs[slot_end > vt_size] = 0  # slot past this vtable: absent
        return Tables(self, tname, fields, pos, vt, vt_size, t_size, voffs)

    def vectors(self, pos: np.ndarray, width: int, ctx: str) -> tuple[np.ndarray, np.ndarray]:
        """(first element position, length) of the vectors at `pos` (-1 = absent)."""
        present = pos >= 0
        p = pos[present]
        n = self.read(p, "<u4", ctx).astype(np.int64)
        over = p + 4 + n * width > self.n
        if _ANY(over):
            i = int(np.argmax(over))
            self.fail(f"{ctx}: vector of {n[i]} elements at offset {p[i]} runs past the end of the buffer")
        if len(p) == len(pos):
            return p + 4, n
        start = np.full(pos.shape, -1, dtype=np.int64)
        length = np.zeros(pos.shape, dtype=np.int64)
        start[present], length[present] = p + 4, n
        return start, length

    def offset_vectors(self, pos: np.ndarray, ctx: str) -> tuple[np.ndarray, np.ndarray]:
        """Targets of the offset vectors at `pos`, flattened, and each vector's start in that array."""
        start, length = self.vectors(pos, 4, ctx)
        flat, offsets = _csr_positions(start, length, 4)
        self.spend(4 * len(flat), ctx)
        return flat + self.read(flat, "<u4", ctx), offsets

    def scalar_vectors(self, pos: np.ndarray, dtype: str, ctx: str) -> tuple[np.ndarray, np.ndarray]:
        """Elements of the scalar vectors at `pos`, flattened, and each vector's start in that array."""
        w = _width(dtype)
        start, length = self.vectors(pos, w, ctx)
        flat, offsets = _csr_positions(start, length, w)
        self.spend(w * len(flat), ctx)
        return self.read(flat, dtype, ctx), offsets

    def strings(self, pos: np.ndarray, ctx: str) -> tuple[np.ndarray, list[str]]:
        """Decodes the strings at `pos` (-1 = absent) -> (codes into the list, -1 = absent; distinct strings)."""
        codes = np.full(pos.shape, -1, dtype=np.int32)
        present = pos >= 0
        if not _ANY(present):
            return codes, []
        upos, inverse = _unique(pos[present])
        lengths = self.read(upos, "<u4", ctx).astype(np.int64)
        over = upos + 4 + lengths > self.n
        if _ANY(over, axis=None):
            i = int(np.argmax(over))
            self.fail(f"{ctx}: string of {lengths[i]} bytes at offset {upos[i]} runs past the end of the buffer")
        self.spend(lengths.sum(), ctx)
        texts = self._decode_all(upos + 4, lengths)
        if texts is None:  # invalid UTF-8 somewhere: one at a time, for the exact error
            raw = self.data.data  # memoryview: slicing it copies nothing
            texts = []
            for p, n in zip((upos + 4).tolist(), lengths.tolist()):
                try:
                    texts.append(str(raw[p : p + n], "utf-8"))
                except UnicodeDecodeError as e:
                    self.fail(f"{ctx}: string at offset {p - 4} is not UTF-8 ({e.reason})")
        if len(texts) < _SMALL:  # a dict beats pandas' hashing on few strings (same first-seen order)
            index: dict[str, int] = {}
            ucodes = np.array([index.setdefault(t, len(index)) for t in texts], dtype=np.int64)
            uniques = list(index)
        else:
            ucodes, uniques = pd.factorize(np.array(texts, dtype=object), sort=False)
            uniques = list(uniques)
        codes[present] = ucodes[inverse]
        return codes, uniques

    def _decode_all(self, starts: np.ndarray, lengths: np.ndarray) -> list[str] | None:
        """Decodes many strings in one go: joined with NUL bytes, decoded once, split. None if any
        is not valid UTF-8 or contains a NUL itself (the caller then decodes one at a time)."""
        if len(starts) == 0:
            return []
        ends = starts + lengths
        lo = int(starts.min())
        raw = self.data[lo : int(ends.max())].tobytes()  # one copy; slicing bytes is cheaper than memoryviews
        joined = b"\0".join([raw[s:e] for s, e in zip((starts - lo).tolist(), (ends - lo).tolist())])
        try:
            parts = joined.decode("utf-8").split("\0")
        except UnicodeDecodeError:
            return None
        return parts if len(parts) == len(starts) else None


def _unique(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(pos, return_inverse=True), with a dict for a few positions."""
    if len(pos) >= _SMALL:
        return np.unique(pos, return_inverse=True)
    lst = pos.tolist()
    upos = sorted(set(lst))
    where = {p: i for i, p in enumerate(upos)}
    return np.array(upos, dtype=np.int64), np.array([where[p] for p in lst], dtype=np.int64)


@dataclass(frozen=True)
class _ReadPlan:
    slots: np.ndarray         # vtable slot of each field, fields grouped by read dtype
    widths: np.ndarray        # (k, 1) bytes each field occupies in its table
    names: tuple              # field names in that order
    groups: tuple             # (read dtype, first row, end row, default (None: offsets), error context)
    inverse: tuple            # row of each requested field


_PLANS: dict = {}


def _read_plan(tname: str, fields: dict, specs: tuple) -> _ReadPlan:
    key = (tname, id(fields), specs)
    plan = _PLANS.get(key)
    if plan is None:
        by_dt: dict = {}
        for j, (_, dt, _) in enumerate(specs):
            by_dt.setdefault(dt, []).append(j)
        order = [j for js in by_dt.values() for j in js]
        groups, lo = [], 0
        for dt, js in by_dt.items():
            rd = "<u4" if dt is None else dt
            if dt is None:
                default = None
            else:
                default = np.array([specs[j][2] for j in js], dtype=dt)[:, None]
            names = ", ".join(specs[j][0] for j in js)
            groups.append((rd, lo, lo + len(js), default, f"{tname}.{names}"))
            lo += len(js)
        plan = _PLANS[key] = _ReadPlan(
            slots=np.array([fields[specs[j][0]][0] for j in order], dtype=np.intp),
            widths=np.array([4 if specs[j][1] is None else _width(specs[j][1]) for j in order],
                            dtype=np.int64)[:, None],
            names=tuple(specs[j][0] for j in order), groups=tuple(groups),
            inverse=tuple(order.index(j) for j in range(len(specs))))
    return plan


@cache
def _fields(ns: str, tname: str) -> dict:
    return {name: (slot, kind, typ) for name, slot, kind, typ, *_ in LAYOUTS["tables"][ns][tname]}


@cache
def _table_info(ns: str, tname: str) -> tuple[dict, int, np.ndarray, np.ndarray]:
    """(fields, vtable slots, byte offset of each vtable entry (2 header entries, then the slots),
    (slots, 1) vtable size needed to hold each slot)."""
    fields = _fields(ns, tname)
    slots = 1 + max((f[0] for f in fields.values()), default=-1)
    entry = 2 * np.arange(2 + slots, dtype=np.int64)
    return fields, slots, entry[:, None], (entry[2:] + 2)[:, None]


def _csr_positions(start: np.ndarray, length: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of every element of several vectors, concatenated, and each vector's start in
    that array (len(start) + 1 entries). Absent vectors have length 0 and contribute nothing."""
    offsets = np.zeros(len(length) + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return _EMPTY, offsets
    first = np.repeat(start - width * offsets[:-1], length)
    return first + width * np.arange(total, dtype=np.int64), offsets


@dataclass
class Tables:
    """Many tables of one type: field access returns one array entry per table."""

    fb: FlatBuffer
    tname: str
    fields: dict
    pos: np.ndarray
    vt: np.ndarray
    vt_size: np.ndarray
    t_size: np.ndarray
    voffs: np.ndarray  # (slots, tables) field offsets from every vtable; 0 = field absent

    def __len__(self) -> int:
        return len(self.pos)

    def read(self, *specs: tuple[str, str | None, object]) -> list[np.ndarray]:
        """Several fields of every table in one pass: each spec is (field, dtype, default) for a
        scalar (`default` where a table leaves it out), or (field, None, None) for the position of
        the string/vector/table the field points to (-1 where absent). One overrun check for all
        fields, one bounds-checked gather per dtype."""
        if not len(self.pos):
            return [_EMPTY if dt is None else np.zeros(0, dtype=dt) for _, dt, _ in specs]
        plan = _read_plan(self.tname, self.fields, specs)
        voff = self.voffs[plan.slots]                     # (k, m), fields grouped by dtype
        has = voff > 0
        over = has & (voff + plan.widths > self.t_size)
        if _ANY(over, axis=None):
            j = int(np.argmax(_ANY(over, axis=1)))
            i = int(np.argmax(over[j]))
            self.fb.fail(f"{self.tname}.{plan.names[j]} at offset {self.pos[i] + voff[j, i]} overruns its table")
        at = voff + self.pos
        rows: list[np.ndarray] = []
        for dt, lo, hi, default, ctx in plan.groups:
            h, a = has[lo:hi], at[lo:hi]
            ah = a[h]
            vals = self.fb.read(ah, dt, ctx)
            if default is None:  # offsets: positions, -1 where absent
                res = np.full(h.shape, -1, dtype=np.int64)
                res[h] = ah + vals
            else:
                res = np.empty(h.shape, dtype=dt)
                res[...] = default
                res[h] = vals
            rows.extend(res)
        return [rows[j] for j in plan.inverse]

    def scalar(self, name: str, dtype: str, default=0) -> np.ndarray:
        """The field's values, `default` where a table leaves it out."""
        return self.read((name, dtype, default))[0]

    def present(self, name: str) -> np.ndarray:
        """Per table, whether it stores field `name` (absent fields take the schema default); a FormatError when a
        field would overrun its table."""
        if not len(self.pos):
            return np.zeros(0, dtype=bool)
        voff = self.voffs[self.fields[name][0]].astype(np.int64)
        over = (voff > 0) & (voff + 1 > self.t_size)
        if _ANY(over, axis=None):
            i = int(np.argmax(over))
            self.fb.fail(f"{self.tname}.{name} at offset {self.pos[i] + voff[i]} overruns its table")
        return voff > 0

    def ref(self, name: str) -> np.ndarray:
        """Positions of the string/vector/table the field points to, -1 where absent."""
        return self.read((name, None, None))[0]
