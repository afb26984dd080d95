"""Named data: blobs backends share by key (upstream's NamedDataStore), stored in the .pte or in .ptd files.

A backend's `preprocess` adds the bytes its payload refers to by name (XNNPACK's weights, keyed by
their SHA-256) to a `NamedDataStore` and returns its output as `PreprocessResult.data_store_output`.
`to_executorch` merges the outputs of every lowered module: a key names one blob program-wide, and
equal bytes under different keys are stored once. Entries without an external tag become segments of
the .pte (`Program.named_data`); tagged entries go to the .ptd file named by the tag.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from torch.export import ExportedProgram

from etlab.compiler._constants import DEFAULT_EXTERNAL_FILE, ConstantStore
from etlab.facts.lowered import DataEntry, NamedDataStoreOutput, lowered_modules
from etlab.schema import flat_tensor as FT
from etlab.schema import program as P


class NamedDataStore:
    """Keyed blobs, deduplicated by content. A key given twice must name the same bytes (the first
    placement, in the .pte or a .ptd, stands); a buffer several keys share keeps the least common
    multiple of their alignments."""

    def __init__(self) -> None:
        self.buffers: list[bytes] = []
        self.pte_data: dict[str, DataEntry] = {}
        self.external_data: dict[str, dict[str, DataEntry]] = {}
        self._by_size: dict[int, list[int]] = {}  # byte length -> indices of the buffers that long
        self._key_buffer: dict[str, int] = {}

    def add_named_data(self, key: str, data, alignment: int | None = 1, external_tag: str | None = None,
                       tensor_layout: Any = None) -> None:
        """Adds `data` (bytes-like) under `key`; `external_tag` names the .ptd it goes to (None: the .pte)."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"NamedDataStore: a key must be a non-empty str, got {key!r}")
        if external_tag is not None and (not isinstance(external_tag, str) or not external_tag
                                         or "/" in external_tag or "\\" in external_tag or external_tag in (".", "..")):
            raise ValueError(f"NamedDataStore: external tag {external_tag!r} of {key!r} is not a file name")
        alignment = 1 if alignment is None else alignment
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0:
            raise ValueError(f"NamedDataStore: alignment of {key!r} must be a positive int, got {alignment!r}")
        raw = data if type(data) is bytes else bytes(memoryview(data).cast("B"))  # bytes are kept, not copied
        known = self._key_buffer.get(key)
        if known is not None:
            if not self._same(self.buffers[known], raw):
                raise ValueError(f"NamedDataStore: key {key!r} is already stored with different data "
                                 f"({len(self.buffers[known])} bytes there, {len(raw)} bytes now)")
            return
        same_size = self._by_size.setdefault(len(raw), [])
        index = next((i for i in same_size if self._same(self.buffers[i], raw)), None)
        if index is None:
            index = len(self.buffers)
            self.buffers.append(raw)
            same_size.append(index)
        target = self.pte_data if external_tag is None else self.external_data.setdefault(external_tag, {})
        target[key] = DataEntry(index, alignment, tensor_layout)
        self._key_buffer[key] = index

    @staticmethod
    def _same(stored: bytes, raw: bytes) -> bool:
        """Equal contents, compared directly (no digest: hashing every weight again cost more than the
        comparisons, which only buffers of equal length need and which stop at the first differing byte)."""
        return stored is raw or stored == raw

    def merge_named_data_store(self, other: NamedDataStoreOutput) -> None:
        """Adds every entry of another store's output (a lowered module's), keys and tags kept."""
        for key, entry in other.pte_data.items():
            self.add_named_data(key, other.buffers[entry.buffer_index], entry.alignment, None, entry.tensor_layout)
        for tag, entries in other.external_data.items():
            for key, entry in entries.items():
                self.add_named_data(key, other.buffers[entry.buffer_index], entry.alignment, tag,
                                    entry.tensor_layout)

    def get_named_data_store_output(self) -> NamedDataStoreOutput:
        """A snapshot of the store for serialization: the deduplicated buffers, the keys placed in the .pte, and per
        external tag the keys written to that tag's .ptd (tags without data are left out)."""
        return NamedDataStoreOutput(list(self.buffers), dict(self.pte_data),
                                    {tag: dict(v) for tag, v in self.external_data.items() if v})


def buffer_alignments(entries: dict[str, DataEntry]) -> dict[int, int]:
    """buffer index -> the alignment its segment needs (lcm over the keys sharing it), in key order."""
    out: dict[int, int] = {}
    for entry in entries.values():
        out[entry.buffer_index] = math.lcm(out.get(entry.buffer_index, 1), entry.alignment)
    return out


def collect_named_data(programs: Iterable[ExportedProgram]) -> NamedDataStoreOutput:
    """The named data of every lowered module of the programs (nested graphs too), merged in order."""
    store = NamedDataStore()
    for ep in programs:
        for _, _, module in lowered_modules(ep.graph_module):
            output = getattr(module, "named_data_store_output", None)
            if output:
                store.merge_named_data_store(output)
    return store.get_named_data_store_output()


def place_named_data(program: P.Program, segments: list[bytes], named: NamedDataStoreOutput) -> int:
    """Appends one segment per buffer the .pte's keys use (after the constant and delegate segments)
    and lists the keys in `program.named_data`; returns the alignment those segments need."""
    segment_of: dict[int, int] = {}
    entries = []
    for key, entry in named.pte_data.items():
        if entry.buffer_index not in segment_of:
            segment_of[entry.buffer_index] = len(segments)
            segments.append(named.buffers[entry.buffer_index])
        entries.append(P.NamedData(key=key, segment_index=segment_of[entry.buffer_index]))
    program.named_data = entries or None
    return math.lcm(1, *buffer_alignments(named.pte_data).values())


def ptd_files(constants: ConstantStore, named: NamedDataStoreOutput) -> dict[str, bytes]:
    """The .ptd files by name: the emitter's external constants (`_default_external_constant`, with
    their tensor layouts) and each external tag's named data (opaque blobs) merged per name."""
    tags = list(dict.fromkeys(([DEFAULT_EXTERNAL_FILE] if constants.external_data else [])
                              + list(named.external_data)))
    files = {}
    for tag in tags:
        entries: list[FT.NamedData] = []
        segments: list[bytes] = []
        alignment = max(constants.alignment, 16)
        if tag == DEFAULT_EXTERNAL_FILE:
            for name, (data, layout) in constants.external_data.items():
                entries.append(FT.NamedData(key=name, segment_index=len(segments), tensor_layout=layout))
                segments.append(bytes(data))
        taken = {e.key for e in entries}
        segment_of: dict[int, int] = {}
        for key, entry in named.external_data.get(tag, {}).items():
            if key in taken:
                raise ValueError(f"external data file {tag!r}: key {key!r} names both a constant of the program "
                                 "and a delegate's named data")
            if entry.buffer_index not in segment_of:
                segment_of[entry.buffer_index] = len(segments)
                segments.append(named.buffers[entry.buffer_index])
            entries.append(FT.NamedData(key=key, segment_index=segment_of[entry.buffer_index],
                                        tensor_layout=entry.tensor_layout))
            alignment = math.lcm(alignment, entry.alignment)
        files[tag] = FT.serialize_ptd(FT.FlatTensor(version=0, named_data=entries), segments,
                                      segment_alignment=alignment)
    return files
