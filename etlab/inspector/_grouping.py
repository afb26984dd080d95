"""Groups an ETDump's events into event blocks, vectorized over all events at once.

The grouping follows upstream's Inspector so that both tools show the same rows:

1. Within a run, profile and (non-output) debug events are collected per instruction key
   (instruction id, chain index, delegate int id, delegate string id), in order of first
   appearance.
2. Each profile event of a key becomes one event signature (its name, ids, and the name of the
   key's first debug event); a key with debug events only gives one signature. A signature seen
   twice in a run keeps its first position and its last occurrence's data.
3. Runs with the same name, bundled input index and signature sequence form one block; each
   signature's timings over those runs become that event's perf data.

Everything is numpy over columns; Python loops only over runs and blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from etlab.etdump import ETDumpColumns, EventKind

_U32_WRAP = 1 << 32
_SMALL = 4096


@dataclass
class BlockTable:
    """One event block as columns: m events, observed in R runs."""

    name: str
    bundled_input_index: int
    runs: np.ndarray            # (R,) run indices (into ETDumpColumns.runs)
    rows: np.ndarray            # (R, m) the event row behind each (run, event)
    names: list[str]            # (m,)
    instruction_id: np.ndarray  # (m,)
    chain_index: np.ndarray     # (m,)
    delegate_id: list           # (m,) int | str | None
    is_delegated: np.ndarray    # (m,) bool
    has_perf: np.ndarray        # (m,) bool
    durations: np.ndarray       # (R, m) float64 in the target time scale, NaN without perf data
    debug_rows: list[np.ndarray]  # (m,) event rows of the debug events attached to each event (first run)
    output_rows: np.ndarray     # event rows of the run's output debug events (first run)

    def __len__(self) -> int:
        return len(self.names)


def _first_seen_codes(*cols: np.ndarray) -> np.ndarray:
    """Group id of each row over the given key columns, numbered in order of first appearance."""
    if len(cols[0]) < _SMALL:  # a dict beats many vectorized passes on small inputs
        keys = list(zip(*[c.tolist() for c in cols]))
        code = {k: i for i, k in enumerate(dict.fromkeys(keys))}  # dicts keep first-seen order
        return np.fromiter(map(code.__getitem__, keys), dtype=np.int64, count=len(keys))
    code = None
    for col in cols:
        c, uniq = pd.factorize(col, sort=False)
        if code is None:
            code = c.astype(np.int64)
        else:
            code, _ = pd.factorize(code * len(uniq) + c, sort=False)
            code = code.astype(np.int64)
    return code


def _first_index(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """Index of each code's first occurrence (-1 if it never occurs)."""
    first = np.full(n_codes, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    first[first == len(codes)] = -1
    return first


def _last_index(codes: np.ndarray, n_codes: int) -> np.ndarray:
    last = np.full(n_codes, -1, dtype=np.int64)
    np.maximum.at(last, codes, np.arange(len(codes)))
    return last


def elapsed_ticks(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """end - start as float64; a start after the end is a 32-bit clock that wrapped (NaN when the
    values do not fit 32 bits, i.e. cannot be a wrap)."""
    start, end = start.astype(np.uint64), end.astype(np.uint64)
    out = (end - start).astype(np.float64)  # uint64 arithmetic: valid where end >= start
    back = start > end
    if back.any():
        small = back & (start < _U32_WRAP) & (end < _U32_WRAP)
        out[back] = np.nan
        out[small] = (_U32_WRAP - start[small].astype(np.float64)) + end[small].astype(np.float64)
    return out


def group_events(c: ETDumpColumns, scale_factor: float,
                 delegate_time_scale_converter: Callable | None = None) -> list[BlockTable]:
    """The event blocks of an ETDump; durations are divided by `scale_factor` (source/target)."""
    n = len(c)
    name, did_str = c.name_code.copy(), c.delegate_id_str_code.copy()
    if "" in c.strings:  # an empty string means the same as an absent one
        empty = c.strings.index("")
        name[name == empty], did_str[did_str == empty] = -1, -1
    is_output = np.zeros(n, dtype=bool)
    if c.values is not None:
        is_output[c.has_debug] = c.values.is_output
    prof = c.kind == EventKind.PROFILE
    dbg = (c.kind == EventKind.DEBUG) & ~is_output

    # 1. instruction keys, then rows sorted by key (keys are numbered in first-seen order, and
    #    runs are contiguous, so this keeps runs in order too)
    sel = np.flatnonzero(prof | dbg)
    ik = _first_seen_codes(c.run[sel], c.instruction_id[sel], c.chain_index[sel], c.delegate_id_int[sel],
                           did_str[sel])
    order = np.argsort(ik, kind="stable")
    sel, ik = sel[order], ik[order]
    n_ik = int(ik.max()) + 1 if len(ik) else 0
    is_p = prof[sel]
    dbg_pos = np.flatnonzero(~is_p)
    first_dbg = np.full(n_ik, -1, dtype=np.int64)
    fi = _first_index(ik[dbg_pos], n_ik)
    first_dbg[fi >= 0] = sel[dbg_pos[fi[fi >= 0]]]
    key_has_prof = np.zeros(n_ik, dtype=bool)
    key_has_prof[ik[is_p]] = True
    dbg_by_key_start = np.searchsorted(ik[dbg_pos], np.arange(n_ik + 1))
    dbg_sorted = sel[dbg_pos]
    key_of_row = np.full(n, -1, dtype=np.int64)
    key_of_row[sel] = ik

    # 2. signatures
    keep = is_p | (~key_has_prof[ik] & (sel == first_dbg[ik]))
    srow, sik = sel[keep], ik[keep]
    fd = first_dbg[sik]
    dbg_name = np.where(fd >= 0, name[np.maximum(fd, 0)], -3)   # -3: no debug event, -1: unnamed
    prof_name = np.where(is_p[keep], name[srow], -2)            # -2: debug-only signature
    sig = _first_seen_codes(c.instruction_id[srow], c.delegate_id_int[srow], did_str[srow], prof_name, dbg_name)
    pair = _first_seen_codes(c.run[srow], sig)
    n_pairs = int(pair.max()) + 1 if len(pair) else 0
    p_first, p_last = _first_index(pair, n_pairs), _last_index(pair, n_pairs)
    pair_sig, pair_row = sig[p_first], srow[p_last]
    pair_run = c.run[srow[p_first]]
    run_pair_start = np.searchsorted(pair_run, np.arange(len(c.runs) + 1))

    # 3. runs -> blocks
    blocks: dict[tuple, list[int]] = {}
    for r, info in enumerate(c.runs):
        if not info.has_events:
            continue
        seq = pair_sig[run_pair_start[r] : run_pair_start[r + 1]]
        blocks.setdefault((info.name, info.bundled_input_index, seq.tobytes()), []).append(r)

    out_rows = np.flatnonzero(is_output & c.has_debug)
    out_start = np.searchsorted(c.run[out_rows], np.arange(len(c.runs) + 1))
    tables = []
    for (bname, bundled, _), runs in blocks.items():
        runs = np.asarray(runs, dtype=np.int64)
        r0 = int(runs[0])
        m = int(run_pair_start[r0 + 1] - run_pair_start[r0])
        rows = pair_row[run_pair_start[runs][:, None] + np.arange(m)]
        first = rows[0]
        delegated = (c.delegate_id_int[first] != -1) | (did_str[first] >= 0)
        has_perf = prof[first]
        ids, names = _names(c, first, delegated, has_perf, name, did_str, first_dbg[key_of_row[first]])
        durations = np.full(rows.shape, np.nan)
        if has_perf.any():
            pr = rows[:, has_perf]
            start, end = c.start_time[pr], c.end_time[pr]
            durations[:, has_perf] = elapsed_ticks(start, end) / scale_factor
            dcols = delegated[has_perf]
            if dcols.any():  # delegates may run on their own clock
                conv = delegate_time_scale_converter
                pnames = [n for n, h in zip(names, has_perf) if h]
                for j in np.flatnonzero(dcols).tolist():
                    if conv is None:
                        s, e = start[:, j] / scale_factor, end[:, j] / scale_factor
                    else:
                        s = np.array([conv(pnames[j], int(x)) for x in start[:, j]], dtype=np.float64)
                        e = np.array([conv(pnames[j], int(x)) for x in end[:, j]], dtype=np.float64)
                    durations[:, np.flatnonzero(has_perf)[j]] = _elapsed_float(s, e)
        keys = key_of_row[first]
        debug_rows = [dbg_sorted[dbg_by_key_start[k] : dbg_by_key_start[k + 1]] for k in keys.tolist()]
        tables.append(BlockTable(
            name=bname, bundled_input_index=bundled, runs=runs, rows=rows, names=names,
            instruction_id=c.instruction_id[first].astype(np.int64), chain_index=c.chain_index[first],
            delegate_id=ids, is_delegated=delegated, has_perf=has_perf, durations=durations,
            debug_rows=debug_rows, output_rows=out_rows[out_start[r0] : out_start[r0 + 1]],
        ))
    return tables


def _elapsed_float(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    out = e - s
    back = s > e
    if back.any():
        ok = back & (s < _U32_WRAP) & (e < _U32_WRAP)
        out[back] = np.nan
        out[ok] = (_U32_WRAP - s[ok]) + e[ok]
    return out


def _names(c: ETDumpColumns, first: np.ndarray, delegated: np.ndarray, has_perf: np.ndarray,
           name: np.ndarray, did_str: np.ndarray, first_dbg: np.ndarray) -> tuple[list, list[str]]:
    """(delegate ids, event names): a delegated event is named by its delegate id; otherwise the
    profile event's name, unless the key's first debug event has a name of its own."""
    table = np.array([*c.strings, ""], dtype=object)  # code -1 -> ""
    names = table[np.where(has_perf, name[first], -1)]
    dname = table[np.where(first_dbg >= 0, name[np.maximum(first_dbg, 0)], -1)]
    override = dname != ""
    names[override] = dname[override]
    ids: list = [None] * len(first)
    for j in np.flatnonzero(delegated).tolist():
        i = int(first[j])
        did = int(c.delegate_id_int[i])
        ids[j] = did if did != -1 else c.strings[did_str[i]]
        names[j] = str(ids[j])
    return ids, names.tolist()
