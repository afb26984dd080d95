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
from etlab.schema._generated.layouts import LAYOUTS

_EMPTY = np.zeros(0, dtype=np.int64)


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
        raise FormatError(f"{self.what}: {msg}")

    def spend(self, nbytes: int, ctx: str):
        self.budget -= int(nbytes)
        if self.budget < 0:
            self.fail(f"{ctx}: offsets alias one another far more than any writer does (decode would "
                      "be out of proportion to the file)")

    def _view(self, dtype: str) -> np.ndarray:
        v = self._views.get(dtype)
        if v is None:
            w = np.dtype(dtype).itemsize
            end = self.base + self.n
            v = self._views[dtype] = self.file[: end - end % w].view(dtype)
        return v

    def read(self, pos: np.ndarray, dtype: str, ctx: str) -> np.ndarray:
        """The little-endian `dtype` values at each position in `pos` (int64 array)."""
        w = np.dtype(dtype).itemsize
        if pos.size == 0:
            return np.zeros(0, dtype=dtype)
        lo, hi = pos.min(), pos.max()
        if lo < 0 or hi > self.n - w:
            bad = int(lo if lo < 0 else hi)
            self.fail(f"{ctx} at offset {bad} lies outside the buffer ({self.n} bytes)")
        if w == 1:
            return self.data[pos].view(dtype)
        at = pos + self.base if self.base else pos
        if not (at & (w - 1)).any():  # aligned, as every conforming writer leaves it
            return self._view(dtype)[at // w]
        idx = pos[:, None] + np.arange(w)
        return np.ascontiguousarray(self.data[idx]).view(dtype)[:, 0]

    def tables(self, pos: np.ndarray, ns: str, tname: str) -> Tables:
        """Checks the tables at `pos` (their vtables and sizes) and returns an accessor."""
        ctx = f"{tname} table"
        pos = np.asarray(pos, dtype=np.int64)
        vt = pos - self.read(pos, "<i4", ctx).astype(np.int64)
        vt_size = self.read(vt, "<u2", f"{ctx} vtable").astype(np.int64)
        t_size = self.read(vt + 2, "<u2", f"{ctx} vtable").astype(np.int64)
        bad = (vt_size < 4) | (vt_size & 1).astype(bool) | (vt + vt_size > self.n)
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(f"{ctx} at offset {pos[i]} has a malformed vtable (size {vt_size[i]})")
        bad = (t_size < 4) | (pos + t_size > self.n)
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(f"{ctx} at offset {pos[i]} claims {t_size[i]} bytes, past the end of the buffer")
        return Tables(self, tname, _fields(ns, tname), pos, vt, vt_size, t_size)

    def vectors(self, pos: np.ndarray, width: int, ctx: str) -> tuple[np.ndarray, np.ndarray]:
        """(first element position, length) of the vectors at `pos` (-1 = absent)."""
        present = pos >= 0
        start = np.full(pos.shape, -1, dtype=np.int64)
        length = np.zeros(pos.shape, dtype=np.int64)
        p = pos[present]
        n = self.read(p, "<u4", ctx).astype(np.int64)
        if (p + 4 + n * width > self.n).any():
            i = int(np.argmax(p + 4 + n * width > self.n))
            self.fail(f"{ctx}: vector of {n[i]} elements at offset {p[i]} runs past the end of the buffer")
        start[present], length[present] = p + 4, n
        return start, length

    def offset_vectors(self, pos: np.ndarray, ctx: str) -> tuple[np.ndarray, np.ndarray]:
        """Targets of the offset vectors at `pos`, flattened, and each vector's start in that array."""
        start, length = self.vectors(pos, 4, ctx)
        flat = _csr_positions(start, length, 4)
        self.spend(4 * len(flat), ctx)
        targets = flat + self.read(flat, "<u4", ctx).astype(np.int64)
        return targets, np.concatenate([[0], np.cumsum(length)])

    def scalar_vectors(self, pos: np.ndarray, dtype: str, ctx: str) -> tuple[np.ndarray, np.ndarray]:
        """Elements of the scalar vectors at `pos`, flattened, and each vector's start in that array."""
        w = np.dtype(dtype).itemsize
        start, length = self.vectors(pos, w, ctx)
        flat = _csr_positions(start, length, w)
        self.spend(w * len(flat), ctx)
        return self.read(flat, dtype, ctx), np.concatenate([[0], np.cumsum(length)])

    def strings(self, pos: np.ndarray, ctx: str) -> tuple[np.ndarray, list[str]]:
        """Decodes the strings at `pos` (-1 = absent) -> (codes into the list, -1 = absent; distinct strings)."""
        codes = np.full(pos.shape, -1, dtype=np.int32)
        present = pos >= 0
        if not present.any():
            return codes, []
        upos, inverse = np.unique(pos[present], return_inverse=True)
        lengths = self.read(upos, "<u4", ctx).astype(np.int64)
        over = upos + 4 + lengths > self.n
        if over.any():
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
        ucodes, uniques = pd.factorize(np.array(texts, dtype=object), sort=False)
        codes[present] = ucodes[inverse]
        return codes, list(uniques)

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


@cache
def _fields(ns: str, tname: str) -> dict:
    return {name: (slot, kind, typ) for name, slot, kind, typ, *_ in LAYOUTS["tables"][ns][tname]}


def _csr_positions(start: np.ndarray, length: np.ndarray, width: int) -> np.ndarray:
    """Positions of every element of several vectors, concatenated."""
    keep = length > 0
    start, length = start[keep], length[keep]
    total = int(length.sum())
    if total == 0:
        return _EMPTY
    first = np.repeat(start - width * np.concatenate([[0], np.cumsum(length)[:-1]]), length)
    return first + width * np.arange(total, dtype=np.int64)


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

    def __len__(self) -> int:
        return len(self.pos)

    def __post_init__(self):
        self._voffs: np.ndarray | None = None

    def _all_voffsets(self) -> np.ndarray:
        """(tables, slots) field offsets from every vtable, read in one gather; 0 = field absent."""
        if self._voffs is None:
            slots = 1 + max((f[0] for f in self.fields.values()), default=-1)
            entry = 4 + 2 * np.arange(slots, dtype=np.int64)
            has = entry[None, :] + 2 <= self.vt_size[:, None]
            at = np.where(has, self.vt[:, None] + entry[None, :], self.vt[:, None])  # vt itself is in bounds
            raw = self.fb.read(at.ravel(), "<u2", f"{self.tname} vtable").reshape(at.shape)
            self._voffs = np.where(has, raw, 0).astype(np.int64)
        return self._voffs

    def _voffset(self, name: str, width: int) -> np.ndarray:
        voff = self._all_voffsets()[:, self.fields[name][0]]
        over = (voff > 0) & (voff + width > self.t_size)
        if over.any():
            i = int(np.argmax(over))
            self.fb.fail(f"{self.tname}.{name} at offset {self.pos[i] + voff[i]} overruns its table")
        return voff

    def scalar(self, name: str, dtype: str, default=0) -> np.ndarray:
        """The field's values, `default` where a table leaves it out."""
        voff = self._voffset(name, np.dtype(dtype).itemsize)
        out = np.full(len(self.pos), default, dtype=dtype)
        has = voff > 0
        out[has] = self.fb.read(self.pos[has] + voff[has], dtype, f"{self.tname}.{name}")
        return out

    def present(self, name: str) -> np.ndarray:
        return self._voffset(name, 1) > 0

    def ref(self, name: str) -> np.ndarray:
        """Positions of the string/vector/table the field points to, -1 where absent."""
        voff = self._voffset(name, 4)
        out = np.full(len(self.pos), -1, dtype=np.int64)
        has = voff > 0
        at = self.pos[has] + voff[has]
        out[has] = at + self.fb.read(at, "<u4", f"{self.tname}.{name}").astype(np.int64)
        return out
