"""Pickles for upstream ETRecords' torch.save members: graft one whose objects share containers (the
shapes the restricted loader must refuse or bound), and find or replace a member's pickle."""

from __future__ import annotations

import io
import random
import zipfile

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
