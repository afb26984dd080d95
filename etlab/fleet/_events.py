"""One ETDump's profile events as fleet rows: run, op, debug handle, duration, delegate, plus tags.

The store keeps one row per profile event. Debug and allocation events carry no duration and are
counted, not stored; what the allocation events add up to is stored per block and owner (category
memory). An event whose end is before its start (or past int64) cannot be a duration:
it is dropped and counted, never stored as a huge number.

Every row gets a `category` so that queries do not double count nested timings:

    kernel         native_call_<op>: the kernel of one instruction (op = "<op>")
    operator_call  OPERATOR_CALL around a kernel (same instruction; op = the kernel's op)
    operator       OPERATOR_CALL with no kernel inside: a primitive operator
    delegate_call  DELEGATE_CALL: a whole delegate blob
    delegate       an event logged by a backend (delegate debug id set), nested in a DELEGATE_CALL
    framework      Method::execute, Method::init, Program::load_method, etlab::dropped_debug_values
                   (`schema.etdump.FRAMEWORK_EVENT_NAMES`)
    other          MOVE_CALL, JF_CALL, FREE_CALL and anything unnamed or unknown
    memory         not an event: what a block's allocation events add up to (etlab.inspector.memory_summary),
                   one row per block and owner (op: "planned:1", "temp", "delegate:<backend>", "unplanned",
                   "rss", ...; each run block also "tracked", its tracked peak), `bytes` its peak there,
                   `instruction` where (-1: none), duration 0

`OP_CATEGORIES` are the ones that are "an op" for per-op statistics; the stored boolean `is_op`
says so per row (cheaper to filter on than the category string).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etlab.etdump import ETDumpColumns
from etlab.fleet._tags import FileTags
from etlab.schema.etdump import DELEGATE_CALL, FRAMEWORK_EVENT_NAMES, OPERATOR_CALL, kernel_of_event

CATEGORIES = ("kernel", "operator_call", "operator", "delegate_call", "delegate", "framework", "other", "memory")
OP_CATEGORIES = ("kernel", "operator", "delegate_call", "delegate")
_CAT = {c: i for i, c in enumerate(CATEGORIES)}
_IS_OP = np.array([c in OP_CATEGORIES for c in CATEGORIES])
UNNAMED = "<unnamed>"

_STR = pa.dictionary(pa.int32(), pa.string())
# Stored columns, in file order. program and build are not stored in the files: they are the
# Hive partition directories (program=<hash>/build=<name>), which every engine reads as columns.
EVENT_SCHEMA = pa.schema([
    ("file_id", pa.int64()), ("run", pa.int32()), ("run_name", _STR), ("event", _STR), ("op", _STR),
    ("category", _STR), ("chain", pa.int32()), ("instruction", pa.int32()), ("debug_handle", pa.int32()),
    ("delegate_id", pa.int32()), ("delegate_id_str", _STR), ("delegated", pa.bool_()), ("is_op", pa.bool_()),
    ("start_ns", pa.int64()),
    ("duration_ns", pa.int64()), ("bytes", pa.int64()), ("method", _STR), ("device", _STR), ("device_class", _STR),
    ("labels", _STR),
])
PLAIN_EVENT_SCHEMA = pa.schema([pa.field(f.name, pa.string() if f.type == _STR else f.type) for f in EVENT_SCHEMA])
PARTITION_COLUMNS = ("program", "build")


@dataclass
class FileEvents:
    """The stored rows of one file before tagging: codes index `strings` (-1 = null)."""

    file_id: int
    tags: FileTags
    strings: list[str]
    run: np.ndarray
    run_name: np.ndarray
    event: np.ndarray
    op: np.ndarray
    category: np.ndarray      # int8 index into CATEGORIES
    chain: np.ndarray
    instruction: np.ndarray
    debug_handle: np.ndarray
    delegate_id: np.ndarray
    delegate_id_str: np.ndarray
    start_ns: np.ndarray
    duration_ns: np.ndarray
    bytes: np.ndarray         # memory rows: the owner's peak bytes in the block; 0 for events
    runs: int
    dropped: int              # profile events with end < start or times past int64
    not_profile: int          # debug/allocation/empty events (no duration; not stored)

    def __len__(self) -> int:
        return len(self.run)


def _classify(name: str | None, delegated: bool) -> tuple[int, str]:
    """(category, op) of one distinct event name; see the module docstring."""
    if delegated:
        return _CAT["delegate"], name or UNNAMED
    if name is None:
        return _CAT["other"], UNNAMED
    kernel = kernel_of_event(name)
    if kernel is not None:
        return _CAT["kernel"], kernel
    if name == OPERATOR_CALL:
        return _CAT["operator"], name
    if name == DELEGATE_CALL:
        return _CAT["delegate_call"], name
    if name in FRAMEWORK_EVENT_NAMES:
        return _CAT["framework"], name
    return _CAT["other"], name


def _instruction_key(run, chain, instr) -> np.ndarray:
    """One int64 per (run, chain, instruction); only used to pair an OPERATOR_CALL with its kernel."""
    return ((run.astype(np.int64) & 0xFFFFF) << 42) | ((chain.astype(np.int64) & 0x1FFFFF) << 21) | (
        instr.astype(np.int64) & 0x1FFFFF)


def file_events(cols: ETDumpColumns, file_id: int, tags: FileTags) -> FileEvents:
    """The profile events of one read ETDump as coded columns (pure; no I/O)."""
    prof = cols.has_profile
    start, end = cols.start_time[prof], cols.end_time[prof]
    ok = (end >= start) & (end < np.uint64(1 << 63))
    rows = np.flatnonzero(prof)[ok]
    name_code = cols.name_code[rows]
    did_int = cols.delegate_id_int[rows]
    did_str = cols.delegate_id_str_code[rows]
    delegated = (did_int >= 0) | (did_str >= 0)

    # Distinct (name, delegated) pairs -> category and op string, then fanned out by code.
    strings = list(cols.strings)
    index = {s: i for i, s in enumerate(strings)}

    def code(s: str) -> int:
        if s not in index:
            index[s] = len(strings)
            strings.append(s)
        return index[s]

    pair = (name_code.astype(np.int64) + 1) * 2 + delegated
    uniq, inverse = np.unique(pair, return_inverse=True)
    cat_u, op_u = np.empty(len(uniq), np.int8), np.empty(len(uniq), np.int32)
    for j, p in enumerate(uniq.tolist()):
        nc = p // 2 - 1
        cat, op = _classify(None if nc < 0 else strings[nc], bool(p & 1))
        cat_u[j], op_u[j] = cat, code(op)
    category, op = cat_u[inverse], op_u[inverse]
    run = cols.run[rows]
    chain = cols.chain_index[rows].astype(np.int32)
    instr = cols.instruction_id[rows]
    if delegated.any():  # unnamed backend events take their string id as op
        unnamed = delegated & (name_code < 0) & (did_str >= 0)
        op[unnamed] = did_str[unnamed]

    # An OPERATOR_CALL around a kernel gets the kernel's op and is marked as the duplicate timing.
    is_kernel, is_opcall = category == _CAT["kernel"], category == _CAT["operator"]
    if is_kernel.any() and is_opcall.any():
        kkeys = _instruction_key(run[is_kernel], chain[is_kernel], instr[is_kernel])
        order = np.argsort(kkeys, kind="stable")
        kkeys, kops = kkeys[order], op[is_kernel][order]
        okeys = _instruction_key(run[is_opcall], chain[is_opcall], instr[is_opcall])
        pos = np.minimum(np.searchsorted(kkeys, okeys), len(kkeys) - 1)
        hit = kkeys[pos] == okeys
        where = np.flatnonzero(is_opcall)[hit]
        op[where] = kops[pos[hit]]
        category[where] = _CAT["operator_call"]

    name_codes = {n: -1 if n is None else code(n) for n in {r.name for r in cols.runs}}
    run_names = np.array([name_codes[r.name] for r in cols.runs] or [-1], dtype=np.int32)
    instr = instr.astype(np.int32)
    n = len(rows)
    mem = _memory_rows(cols, code)
    m = len(mem["run"])

    def both(events: np.ndarray, memory, dtype) -> np.ndarray:
        return np.concatenate([events.astype(dtype), np.broadcast_to(np.asarray(memory, dtype=dtype), (m,))])

    mem_run = np.asarray(mem["run"], dtype=np.int32)
    return FileEvents(
        file_id=file_id, tags=tags, strings=strings, run=both(run, mem_run, np.int32),
        run_name=both(run_names[run], run_names[mem_run] if m else [], np.int32),
        event=both(name_code, code(MEMORY_EVENT) if m else -1, np.int32), op=both(op, mem["op"], np.int32),
        category=both(category, _CAT["memory"], np.int8), chain=both(chain, -1, np.int32),
        instruction=both(instr, mem["instruction"], np.int32),
        debug_handle=both(np.where(delegated, did_int, instr), mem["instruction"], np.int32),
        delegate_id=both(did_int, -1, np.int32), delegate_id_str=both(did_str, -1, np.int32),
        start_ns=both(start[ok], 0, np.int64), duration_ns=both(end[ok] - start[ok], 0, np.int64),
        bytes=both(np.zeros(n, np.int64), mem["bytes"], np.int64), runs=len(cols.runs),
        dropped=int(prof.sum() - len(rows)), not_profile=int(len(cols) - prof.sum()),
    )


MEMORY_EVENT = "memory"  # the event name of memory rows


def _memory_rows(cols: ETDumpColumns, code) -> dict[str, list]:
    """The memory rows of one ETDump (see the module docstring): empty without allocation events."""
    out: dict[str, list] = {"run": [], "op": [], "instruction": [], "bytes": []}
    if not cols.has_allocation.any():
        return out
    from etlab.inspector import memory_summary

    for r in memory_summary(cols).blocks.itertuples(index=False):
        out["run"].append(int(r.block))
        out["op"].append(code(str(r.owner)))
        out["instruction"].append(int(r.instruction))
        out["bytes"].append(int(r.bytes))
    return out


def _dict_column(codes: np.ndarray, dictionary: list[str]) -> pa.DictionaryArray:
    mask = codes < 0
    idx = pa.array(np.where(mask, 0, codes).astype(np.int32), mask=mask if mask.any() else None)
    return pa.DictionaryArray.from_arrays(idx, pa.array(dictionary or [""], pa.string()))


def events_table(files: list[FileEvents]) -> pa.Table:
    """The rows of several files (one partition) as one Arrow table of EVENT_SCHEMA, strings
    dictionary-encoded against one table shared by all of them."""
    index: dict[str, int] = {}
    remaps, per_file = [], []
    for f in files:
        remaps.append(np.array([index.setdefault(s, len(index)) for s in f.strings] + [-1], dtype=np.int32))
        t = f.tags
        per_file.append([index.setdefault(v, len(index)) for v in (t.method, t.device, t.device_class,
                                                                   t.labels_json())])
    dictionary = list(index)
    counts = np.array([len(f) for f in files], dtype=np.int64)

    def strings(attr: str) -> pa.DictionaryArray:
        # code -1 maps through the remap's last slot (-1), so nulls stay null
        return _dict_column(np.concatenate([r[getattr(f, attr)] for f, r in zip(files, remaps)]
                                           or [np.zeros(0, np.int32)]), dictionary)

    def numbers(attr: str, dtype) -> np.ndarray:
        return np.concatenate([getattr(f, attr) for f in files] or [np.zeros(0, dtype)]).astype(dtype)

    def constant(k: int) -> pa.DictionaryArray:
        return _dict_column(np.repeat(np.array([p[k] for p in per_file] or [0], np.int32)[: len(files)], counts),
                            dictionary)

    category = numbers("category", np.int8)
    columns = {
        "file_id": np.repeat(np.array([f.file_id for f in files], np.int64), counts),
        "run": numbers("run", np.int32), "run_name": strings("run_name"), "event": strings("event"),
        "op": strings("op"),
        "category": pa.DictionaryArray.from_arrays(pa.array(category.astype(np.int32)), pa.array(CATEGORIES)),
        "chain": numbers("chain", np.int32), "instruction": numbers("instruction", np.int32),
        "debug_handle": numbers("debug_handle", np.int32), "delegate_id": numbers("delegate_id", np.int32),
        "delegate_id_str": strings("delegate_id_str"), "delegated": category == _CAT["delegate"],
        "is_op": _IS_OP[category],
        "start_ns": numbers("start_ns", np.int64), "duration_ns": numbers("duration_ns", np.int64),
        "bytes": numbers("bytes", np.int64),
        "method": constant(0), "device": constant(1), "device_class": constant(2), "labels": constant(3),
    }
    return pa.Table.from_pydict(columns, schema=EVENT_SCHEMA)
