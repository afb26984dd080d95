"""A lowered module's named data in an ETRecord: the keyed blobs its payload refers to (XNNPACK's weights,
keyed by SHA-256), without which the recorded payload cannot be emitted or run again from the record.

Two layouts, one value (`facts.lowered.NamedDataStoreOutput`):
- etlab's record: a delegate entry's "named_data" = {"buffers": [byte-store index, ...], "pte_data":
  [[key, buffer index, alignment, layout], ...], "external_data": [[tag, [[key, ...], ...]], ...]},
  layout None or [scalar type, sizes, dim order]; the bytes live once in the record's store;
- upstream's record (exir.serde): the lowered module's "named_data_store" field, a JSON string of
  {"buffers": [base64, ...], "pte_data": {key: {"buffer_index", "alignment", "tensor_layout"}},
  "external_data": {tag: {key: {...}}}}.
Both readers check every index, alignment and name before anything is built from them.
"""

from __future__ import annotations

import base64
import binascii
import json

from etlab.errors import FormatError
from etlab.facts.lowered import DataEntry, NamedDataStoreOutput
from etlab.schema import flat_tensor as FT

_MAX_KEY = 1024
_MAX_ALIGNMENT = 1 << 20


# -- etlab's record ----------------------------------------------------------------------------------


def named_data_doc(out: NamedDataStoreOutput | None, store, what: str) -> dict | None:
    """The "named_data" entry of a delegate (None when the module has none); bytes go to `store`."""
    if not out:
        return None
    return {
        "buffers": [store.add_bytes(bytes(b), f"{what}: named data buffer {i}") for i, b in enumerate(out.buffers)],
        "pte_data": [_entry_doc(key, e) for key, e in out.pte_data.items()],
        "external_data": [[tag, [_entry_doc(key, e) for key, e in entries.items()]]
                          for tag, entries in out.external_data.items()],
    }


def _entry_doc(key: str, entry: DataEntry) -> list:
    layout = entry.tensor_layout
    shape = None if layout is None else [int(layout.scalar_type), list(layout.sizes or []),
                                         list(layout.dim_order or [])]
    return [key, int(entry.buffer_index), int(entry.alignment), shape]


def named_data_from_doc(doc, tensors, where: str) -> NamedDataStoreOutput | None:
    """The NamedDataStoreOutput a "named_data" entry records; FormatError naming what is malformed."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), list)
                                            for k in ("buffers", "pte_data", "external_data")):
        raise FormatError(f"{where}: named data must hold 'buffers', 'pte_data' and 'external_data' lists")
    buffers = [tensors.raw_bytes(tensors.check_index(i, f"{where}: named data buffer"), "named data buffer")
               for i in doc["buffers"]]
    pte = _entries_from_doc(doc["pte_data"], len(buffers), where)
    external: dict[str, dict[str, DataEntry]] = {}
    for item in doc["external_data"]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], list)):
            raise FormatError(f"{where}: a named data external_data entry is not a [tag, entries] pair")
        external[_tag(item[0], where)] = _entries_from_doc(item[1], len(buffers), where)
    return _checked(NamedDataStoreOutput(buffers, pte, external), where)


def _entries_from_doc(items: list, buffers: int, where: str) -> dict[str, DataEntry]:
    out = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 4):
            raise FormatError(f"{where}: a named data entry is not [key, buffer index, alignment, layout]")
        key, index, alignment, layout = item
        if key in out:
            raise FormatError(f"{where}: named data key {str(key)[:80]!r} is listed twice")
        out[_key(key, where)] = _entry(index, alignment, _layout_from_list(layout, where), buffers, where)
    return out


# -- upstream's record -------------------------------------------------------------------------------


def upstream_named_data(out: NamedDataStoreOutput | None) -> str | None:
    """The lowered module's "named_data_store" string as upstream's serializer writes it (None: none)."""
    if not out:
        return None

    def entry(e: DataEntry) -> dict:
        layout = e.tensor_layout
        return {"buffer_index": int(e.buffer_index), "alignment": int(e.alignment),
                "tensor_layout": None if layout is None else {
                    "scalar_type": int(layout.scalar_type), "sizes": list(layout.sizes or []),
                    "dim_order": list(layout.dim_order or [])}}

    return json.dumps({
        "buffers": [base64.b64encode(bytes(b)).decode("ascii") for b in out.buffers],
        "pte_data": {key: entry(e) for key, e in out.pte_data.items()},
        "external_data": {tag: {key: entry(e) for key, e in entries.items()}
                          for tag, entries in out.external_data.items()},
    })


def parse_upstream_named_data(text, where: str) -> NamedDataStoreOutput | None:
    """The NamedDataStoreOutput of upstream's "named_data_store" string (None or absent: None)."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise FormatError(f"{where}: named_data_store is a {type(text).__name__}, not a JSON string")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise FormatError(f"{where}: named_data_store is not valid JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("buffers"), list) or \
            not isinstance(doc.get("pte_data"), dict) or not isinstance(doc.get("external_data"), dict):
        raise FormatError(f"{where}: named_data_store must hold 'buffers' (list), 'pte_data' and 'external_data'")
    buffers = []
    for i, b in enumerate(doc["buffers"]):
        if not isinstance(b, str):
            raise FormatError(f"{where}: named data buffer {i} is not a base64 string")
        try:
            buffers.append(base64.b64decode(b.encode("ascii"), validate=True))
        except (binascii.Error, UnicodeEncodeError):
            raise FormatError(f"{where}: named data buffer {i} is not valid base64") from None

    def entries(table: dict) -> dict[str, DataEntry]:
        out = {}
        for key, e in table.items():
            if not isinstance(e, dict):
                raise FormatError(f"{where}: named data entry {str(key)[:80]!r} is not an object")
            layout = e.get("tensor_layout")
            if layout is not None:
                if not isinstance(layout, dict):
                    raise FormatError(f"{where}: named data entry {str(key)[:80]!r} has a malformed tensor_layout")
                layout = [layout.get("scalar_type"), layout.get("sizes"), layout.get("dim_order")]
            out[_key(key, where)] = _entry(e.get("buffer_index"), e.get("alignment"),
                                           _layout_from_list(layout, where), len(buffers), where)
        return out

    external = {}
    for tag, table in doc["external_data"].items():
        if not isinstance(table, dict):
            raise FormatError(f"{where}: named data external_data[{str(tag)[:80]!r}] is not an object")
        external[_tag(tag, where)] = entries(table)
    return _checked(NamedDataStoreOutput(buffers, entries(doc["pte_data"]), external), where)


# -- shared checks -----------------------------------------------------------------------------------


def _key(key, where: str) -> str:
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY or "\x00" in key:
        raise FormatError(f"{where}: named data key {str(key)[:80]!r} is not a non-empty string of at most "
                          f"{_MAX_KEY} characters")
    return key


def _tag(tag, where: str) -> str:
    if not isinstance(tag, str) or not tag or len(tag) > 255 or any(c in tag for c in "/\\\x00") or tag in (".", ".."):
        raise FormatError(f"{where}: named data file tag {str(tag)[:80]!r} is not a plain file name")
    return tag


def _entry(index, alignment, layout, buffers: int, where: str) -> DataEntry:
    if type(index) is not int or not 0 <= index < buffers:
        raise FormatError(f"{where}: named data buffer index {index!r} is not among the {buffers} buffers")
    if type(alignment) is not int or alignment < 1 or alignment > _MAX_ALIGNMENT or alignment & (alignment - 1):
        raise FormatError(f"{where}: named data alignment {alignment!r} is not a power of two up to {_MAX_ALIGNMENT}")
    return DataEntry(index, alignment, layout)


def _layout_from_list(layout, where: str):
    if layout is None:
        return None
    if not (isinstance(layout, list) and len(layout) == 3 and type(layout[0]) is int
            and all(isinstance(v, list) and all(type(x) is int and x >= 0 for x in v) for v in layout[1:])):
        raise FormatError(f"{where}: a named data tensor layout is not [scalar type, sizes, dim order]")
    try:
        scalar_type = FT.ScalarType(layout[0])
    except ValueError:
        raise FormatError(f"{where}: named data tensor layout has unknown scalar type {layout[0]}") from None
    if sorted(layout[2]) != list(range(len(layout[1]))):
        raise FormatError(f"{where}: named data tensor layout dim order {layout[2]} does not match sizes {layout[1]}")
    return FT.TensorLayout(scalar_type, list(layout[1]), list(layout[2]))


def _checked(out: NamedDataStoreOutput, where: str) -> NamedDataStoreOutput:
    keys = list(out.pte_data) + [k for entries in out.external_data.values() for k in entries]
    if len(keys) != len(set(keys)):
        raise FormatError(f"{where}: a named data key is listed twice")
    return out
