"""ETRecord mutation: one node of the manifest's JSON changed and the archive re-zipped, or the zip's
own headers damaged; upstream records also get their torch.save members' pickles grafted
(mutate_pickle)."""

from __future__ import annotations

import copy
import io
import json
import random
import warnings
import zipfile

from tests.fuzz.mutate_bytes import int_value, mutate_bytes, pack_int
from tests.fuzz.mutate_pickle import replace_torch_pickle, shared_reference_pickle, torch_pickle

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
        v = int_value(rng, old, 8, True)
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
        pack_int(buf, at + off, width, int_value(rng, old, width, False))
    return None


def _find_all(buf: bytearray, sig: bytes) -> list[int]:
    out, i = [], buf.find(sig)
    while i >= 0 and len(out) < 64:
        out.append(i)
        i = buf.find(sig, i + 1)
    return out


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
