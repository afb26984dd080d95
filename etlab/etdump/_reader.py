"""Reads an .etdp file into columns: one numpy array per event field, all events of all runs.

`read_etdump` is the fast path the Inspector uses; `ETDumpColumns.to_model()` rebuilds the
`etlab.schema.etdump.ETDump` dataclasses from the columns, which lets tests prove the two
readers agree field for field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from etlab.errors import FormatError
from etlab.etdump._flat import FlatBuffer
from etlab.schema import LAYOUTS, read_bytes
from etlab.schema import etdump as schema

_NS = "etdump"
_VALUE_TYPES = LAYOUTS["enums"]["etdump.ValueType"]["values"]
_SCALAR_TYPES = set(LAYOUTS["enums"]["scalar_type.ScalarType"]["values"].values())


def _valid_int8(codes) -> np.ndarray:
    """Lookup table over an int8's 256 bit patterns (index with `.view(np.uint8)`): is it a code."""
    table = np.zeros(256, dtype=bool)
    for c in codes:
        if -128 <= c < 128:
            table[c & 0xFF] = True
    return table


_VALUE_TYPE_OK = _valid_int8(_VALUE_TYPES.values())
_SCALAR_TYPE_OK = _valid_int8(_SCALAR_TYPES)
_SCALAR_VALUES = tuple((fname, tname, dtype, LAYOUTS["tables"][_NS][tname][0][0]) for fname, tname, dtype in (
    ("int_value", "Int", "<i8"), ("float_value", "Float", "<f4"), ("double_value", "Double", "<f8"),
    ("bool_value", "Bool", "<u1")))
_EMPTY = np.zeros(0, dtype=np.int64)


class EventKind(enum.IntEnum):
    """Which of an Event's tables is set; a profile event wins over a debug event over an allocation."""

    EMPTY = 0
    PROFILE = 1
    DEBUG = 2
    ALLOCATION = 3


@dataclass
class RunInfo:
    """One RunData block: a method load, or one execution of a method."""

    name: str | None
    bundled_input_index: int
    allocator_names: list[str | None] | None
    first_event: int   # events of this run are rows [first_event, first_event + num_events)
    num_events: int
    has_events: bool   # False when the `events` vector is absent (as opposed to empty)
    threads: int = 0   # etlab only: intra-op threads the block ran with (0: not recorded)


@dataclass
class TensorColumns:
    """Tensor tables referenced by debug values; sizes/strides are flattened (CSR)."""

    scalar_type: np.ndarray   # int8
    offset: np.ndarray        # int64, byte offset into the debug buffer
    sizes: np.ndarray         # int64, all tensors' sizes concatenated
    sizes_start: np.ndarray   # int64, len = tensors + 1
    has_sizes: np.ndarray     # bool
    strides: np.ndarray
    strides_start: np.ndarray
    has_strides: np.ndarray

    def shape(self, i: int) -> list[int]:
        """The sizes of tensor `i` (a slice of the flat `sizes` column)."""
        return self.sizes[self.sizes_start[i] : self.sizes_start[i + 1]].tolist()

    def stride(self, i: int) -> list[int]:
        """The strides of tensor `i` (a slice of the flat `strides` column)."""
        return self.strides[self.strides_start[i] : self.strides_start[i + 1]].tolist()


@dataclass
class ValueColumns:
    """The debug_entry Value of every debug event (rows align with the debug event rows)."""

    present: np.ndarray       # bool: the event has a debug_entry
    val: np.ndarray           # int8 ValueType
    is_output: np.ndarray     # bool: Value.output is set and true
    has_output: np.ndarray    # bool: Value.output is set
    tensor: np.ndarray        # int64 index into tensors, -1 if none
    has_tensor_list: np.ndarray  # bool: the Value has a tensor_list table
    tensor_list: list[list[int] | None]  # per row: indices into tensors, None if that table has no vector
    scalar: list              # per row: the int/float/double/bool payload, or None
    scalar_tables: dict[str, np.ndarray]  # which scalar sub-tables are present, by field name
    tensors: TensorColumns


@dataclass
class ETDumpColumns:
    """All events of an ETDump as columns; row i is the i-th event in file order."""

    what: str
    version: int
    runs: list[RunInfo]
    strings: list[str]                 # distinct strings; *_code columns index into it (-1 = absent)
    run: np.ndarray                    # int32 run index of each event
    kind: np.ndarray                   # int8 EventKind
    has_profile: np.ndarray
    has_debug: np.ndarray
    has_allocation: np.ndarray
    name_code: np.ndarray              # int32 (profile or debug name)
    chain_index: np.ndarray            # int64 (a debug event's ulong -1 reads as -1)
    instruction_id: np.ndarray         # int32
    delegate_id_int: np.ndarray        # int32
    delegate_id_str_code: np.ndarray   # int32
    start_time: np.ndarray             # uint64 (profile events)
    end_time: np.ndarray               # uint64
    metadata_start: np.ndarray         # int64 position of delegate_debug_metadata bytes, -1 if absent
    metadata_len: np.ndarray           # int64
    allocator_id: np.ndarray           # int32 (allocation events)
    allocation_size: np.ndarray        # uint64
    values: ValueColumns | None        # debug entries, rows = np.flatnonzero(has_debug)
    buffer: np.ndarray = field(repr=False, default=None)  # the FlatBuffer bytes (metadata is read from it)
    has_run_data: bool = True          # False when the root's run_data vector is absent (not just empty)
    # etlab's binding to the debug buffer written with this ETDump (None in upstream's files)
    debug_buffer_digest: schema.DebugBufferDigest | None = None

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def debug_rows(self) -> np.ndarray:
        """The row indices of the debug events (logged intermediate or output values), in file order."""
        return np.flatnonzero(self.has_debug)

    def string(self, code: int) -> str | None:
        """The string a name column's code stands for; None for -1 (no name)."""
        return None if code < 0 else self.strings[code]

    def metadata(self, i: int) -> bytes | None:
        """The delegate_debug_metadata bytes of event i, None if absent."""
        s = int(self.metadata_start[i])
        return None if s < 0 else self.buffer[s : s + int(self.metadata_len[i])].tobytes()

    def to_model(self) -> schema.ETDump:
        """The same file as `etlab.schema.etdump` dataclasses (for cross-checks; slow)."""
        from etlab.etdump._model import columns_to_model

        return columns_to_model(self)


def read_etdump(source, *, what: str | None = None) -> ETDumpColumns:
    """Reads a size-prefixed .etdp (path, bytes or memoryview) into columns, verifying as it goes."""
    view, name = read_bytes(source, what=what)
    if len(view) < 12:
        raise FormatError(f"{name}: {len(view)} bytes is too short for an ETDump")
    declared = int.from_bytes(view[0:4], "little")
    if declared + 4 > len(view):
        raise FormatError(f"{name}: size prefix says {declared} bytes but only {len(view) - 4} follow")
    if bytes(view[8:12]) != b"ED00":
        raise FormatError(f"{name}: file identifier is {bytes(view[8:12])!r}, expected b'ED00' (not an .etdp ETDump)")
    whole = np.frombuffer(view, dtype=np.uint8, count=declared + 4)
    data = whole[4:]
    fb = FlatBuffer(data, name, file=whole, base=4)
    root = fb.tables(fb.read(np.zeros(1, np.int64), "<u4", "root offset").astype(np.int64), _NS, "ETDump")
    version, run_data, digest_pos = root.read(("version", "<u4", 0), ("run_data", None, None),
                                              ("debug_buffer", None, None))
    version = int(version[0])
    digest = _read_digest(fb, digest_pos) if digest_pos[0] >= 0 else None
    run_pos, _ = fb.offset_vectors(run_data, "ETDump.run_data")
    runs_t = fb.tables(run_pos, _NS, "RunData")
    run_name_pos, bundled, alloc_vec, events_vec, threads = runs_t.read(
        ("name", None, None), ("bundled_input_index", "<i4", -1), ("allocators", None, None), ("events", None, None),
        ("threads", "<u4", 0))
    run_names, run_strings = fb.strings(run_name_pos, "RunData.name")
    has_alloc_vec = alloc_vec >= 0
    if has_alloc_vec.any():
        alloc_pos, alloc_start = fb.offset_vectors(alloc_vec, "RunData.allocators")
        alloc_names, alloc_strings = fb.strings(fb.tables(alloc_pos, _NS, "Allocator").ref("name"), "Allocator.name")
        alloc_names, alloc_start = alloc_names.tolist(), alloc_start.tolist()
    event_pos, event_start = fb.offset_vectors(events_vec, "RunData.events")
    runs = []
    starts = event_start.tolist()
    for r, (nm, bi, ha, he, th) in enumerate(zip(run_names.tolist(), bundled.tolist(), has_alloc_vec.tolist(),
                                                  (events_vec >= 0).tolist(), threads.tolist())):
        names = None
        if ha:
            names = [None if c < 0 else alloc_strings[c] for c in alloc_names[alloc_start[r] : alloc_start[r + 1]]]
        runs.append(RunInfo(
            name=None if nm < 0 else run_strings[nm], bundled_input_index=bi, allocator_names=names,
            first_event=starts[r], num_events=starts[r + 1] - starts[r], has_events=he, threads=int(th),
        ))
    n = len(event_pos)
    run_of_event = np.repeat(np.arange(len(runs), dtype=np.int32), np.diff(event_start))
    events = fb.tables(event_pos, _NS, "Event")
    prof_pos, dbg_pos, alloc_ev_pos = events.read(("profile_event", None, None), ("debug_event", None, None),
                                                  ("allocation_event", None, None))
    has_p, has_d, has_a = prof_pos >= 0, dbg_pos >= 0, alloc_ev_pos >= 0
    several = has_p.astype(np.int8) + has_d + has_a > 1
    if several.any():
        i = int(np.flatnonzero(several)[0])
        r = int(run_of_event[i])
        raise FormatError(f"{name}: run {r} event {i - starts[r]} {schema.SEVERAL_KINDS}")
    kind = np.full(n, EventKind.EMPTY, dtype=np.int8)
    kind[has_a] = EventKind.ALLOCATION
    kind[has_d] = EventKind.DEBUG
    kind[has_p] = EventKind.PROFILE

    # One string table for every string column so that codes compare across columns.
    p = fb.tables(prof_pos[has_p], _NS, "ProfileEvent")
    d = fb.tables(dbg_pos[has_d], _NS, "DebugEvent")
    (p_name, p_did_str, p_chain, p_instr, p_did, p_start, p_end, p_meta) = p.read(
        ("name", None, None), ("delegate_debug_id_str", None, None), ("chain_index", "<i4", 0),
        ("instruction_id", "<i4", -1), ("delegate_debug_id_int", "<i4", -1), ("start_time", "<u8", 0),
        ("end_time", "<u8", 0), ("delegate_debug_metadata", None, None))
    (d_name, d_did_str, d_chain, d_instr, d_did, d_entry) = d.read(
        ("name", None, None), ("delegate_debug_id_str", None, None), ("chain_index", "<u8", 0),
        ("instruction_id", "<i4", -1), ("delegate_debug_id_int", "<i4", -1), ("debug_entry", None, None))
    str_pos = np.concatenate([p_name, d_name, p_did_str, d_did_str])
    str_codes, strings = fb.strings(str_pos, "event string")
    np_, nd = len(p), len(d)
    name_code = np.full(n, -1, dtype=np.int32)
    did_str = np.full(n, -1, dtype=np.int32)
    name_code[has_p], name_code[has_d & ~has_p] = str_codes[:np_], str_codes[np_ : np_ + nd][~has_p[has_d]]
    did_str[has_p] = str_codes[np_ + nd : 2 * np_ + nd]
    did_str[has_d & ~has_p] = str_codes[2 * np_ + nd :][~has_p[has_d]]

    def merged(col_p, col_d, dtype, default):
        out = np.full(n, default, dtype=dtype)
        out[has_d] = col_d
        out[has_p] = col_p  # profile wins where an event (oddly) sets both
        return out

    chain = merged(p_chain.astype(np.int64), d_chain.view(np.int64), np.int64, 0)
    instr = merged(p_instr, d_instr, np.int32, -1)
    did = merged(p_did, d_did, np.int32, -1)
    start = np.zeros(n, dtype=np.uint64)
    end = np.zeros(n, dtype=np.uint64)
    start[has_p], end[has_p] = p_start, p_end
    meta_start = np.full(n, -1, dtype=np.int64)
    meta_len = np.zeros(n, dtype=np.int64)
    if (p_meta >= 0).any():
        meta_start[has_p], meta_len[has_p] = fb.vectors(p_meta, 1, "ProfileEvent.delegate_debug_metadata")
    allocator_id = np.zeros(n, dtype=np.int32)
    allocation_size = np.zeros(n, dtype=np.uint64)
    if has_a.any():
        a = fb.tables(alloc_ev_pos[has_a], _NS, "AllocationEvent")
        allocator_id[has_a], allocation_size[has_a] = a.read(("allocator_id", "<i4", 0), ("allocation_size", "<u8", 0))
    values = _read_values(fb, d_entry) if nd else None
    return ETDumpColumns(
        what=name, version=version, runs=runs, strings=strings, run=run_of_event, kind=kind,
        has_profile=has_p, has_debug=has_d, has_allocation=has_a, name_code=name_code, chain_index=chain,
        instruction_id=instr, delegate_id_int=did, delegate_id_str_code=did_str, start_time=start, end_time=end,
        metadata_start=meta_start, metadata_len=meta_len, allocator_id=allocator_id,
        allocation_size=allocation_size, values=values, buffer=data, has_run_data=bool(run_data[0] >= 0),
        debug_buffer_digest=digest,
    )


def _read_digest(fb: FlatBuffer, pos: np.ndarray) -> schema.DebugBufferDigest:
    size, sha_pos = fb.tables(pos, _NS, "DebugBufferDigest").read(("size", "<u8", 0), ("sha256", None, None))
    sha = None
    if sha_pos[0] >= 0:
        start, length = fb.vectors(sha_pos, 1, "DebugBufferDigest.sha256")
        sha = fb.data[int(start[0]) : int(start[0]) + int(length[0])].tobytes()
    return schema.DebugBufferDigest(size=int(size[0]), sha256=sha)


def _read_values(fb: FlatBuffer, pos: np.ndarray) -> ValueColumns:
    present = pos >= 0
    v = fb.tables(pos[present], _NS, "Value")
    m = len(pos)

    def spread(col, dtype, default):
        out = np.full(m, default, dtype=dtype)
        out[present] = col
        return out

    v_val, v_output, v_tensor, v_list, *v_scalars = v.read(
        ("val", "<i1", 0), ("output", None, None), ("tensor", None, None), ("tensor_list", None, None),
        *((fname, None, None) for fname, _, _, _ in _SCALAR_VALUES))
    val = spread(v_val, np.int8, 0)
    bad = ~_VALUE_TYPE_OK[val.view(np.uint8)]
    if bad.any():
        fb.fail(f"Value.val has value {val[np.argmax(bad)]}, which is not a etdump.ValueType")
    out_pos = spread(v_output, np.int64, -1)
    has_output = out_pos >= 0
    is_output = np.zeros(m, dtype=bool)
    if has_output.any():
        is_output[has_output] = fb.tables(out_pos[has_output], _NS, "Bool").scalar("bool_val", "<u1").astype(bool)

    tensor_pos = spread(v_tensor, np.int64, -1)
    list_pos = spread(v_list, np.int64, -1)
    has_list = list_pos >= 0
    if has_list.any():
        tl_vec = fb.tables(list_pos[has_list], _NS, "TensorList").ref("tensors")
        listed_pos, listed_start = fb.offset_vectors(tl_vec, "TensorList.tensors")
    else:
        listed_pos = _EMPTY
    has_tensor = tensor_pos >= 0
    tensors = _read_tensors(fb, np.concatenate([tensor_pos[has_tensor], listed_pos]))
    tensor = np.full(m, -1, dtype=np.int64)
    n_single = int(has_tensor.sum())
    tensor[has_tensor] = np.arange(n_single)
    tensor_list: list[list[int] | None] = [None] * m
    for j, row in enumerate(np.flatnonzero(has_list).tolist()):
        tensor_list[row] = None if tl_vec[j] < 0 else list(range(n_single + listed_start[j],
                                                                 n_single + listed_start[j + 1]))
    scalar: list = [None] * m
    scalar_tables = {}
    for (fname, tname, dtype, field_name), col in zip(_SCALAR_VALUES, v_scalars):
        sp = spread(col, np.int64, -1)
        has = sp >= 0
        scalar_tables[fname] = has
        if has.any():
            got = fb.tables(sp[has], _NS, tname).scalar(field_name, dtype)
            got = got.astype(bool) if tname == "Bool" else got
            for row, x in zip(np.flatnonzero(has).tolist(), got.tolist()):
                if scalar[row] is None:
                    scalar[row] = x
    return ValueColumns(present=present, val=val, is_output=is_output, has_output=has_output, tensor=tensor,
                        has_tensor_list=has_list, tensor_list=tensor_list, scalar=scalar,
                        scalar_tables=scalar_tables, tensors=tensors)


def _read_tensors(fb: FlatBuffer, pos: np.ndarray) -> TensorColumns:
    t = fb.tables(pos, _NS, "Tensor")
    st, sizes_pos, strides_pos, offset = t.read(("scalar_type", "<i1", 0), ("sizes", None, None),
                                                ("strides", None, None), ("offset", "<i8", 0))
    bad = ~_SCALAR_TYPE_OK[st.view(np.uint8)]
    if bad.any():
        fb.fail(f"Tensor.scalar_type has value {st[np.argmax(bad)]}, which is not a scalar_type.ScalarType")
    # sizes and strides in one pass: both are int64 vectors
    nt = len(sizes_pos)
    both, both_start = fb.scalar_vectors(np.concatenate([sizes_pos, strides_pos]), "<i8", "Tensor.sizes/strides")
    split = int(both_start[nt])
    sizes, sizes_start = both[:split], both_start[: nt + 1]
    strides, strides_start = both[split:], both_start[nt:] - split
    return TensorColumns(scalar_type=st, offset=offset, sizes=sizes, sizes_start=sizes_start,
                         has_sizes=sizes_pos >= 0, strides=strides, strides_start=strides_start,
                         has_strides=strides_pos >= 0)
