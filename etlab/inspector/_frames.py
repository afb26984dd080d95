"""Event tables as pandas DataFrames, for display, TSV and the CLI.

Columns follow upstream's Inspector: event_block_name, event_name, raw, p10/p50/p90/avg/min/max
(with the time unit when include_units), op_types, delegate_debug_identifier, stack_traces,
module_hierarchy, is_delegated_op, delegate_backend_name, debug_data, start_time. Unlike upstream,
op_types stay complete lists in the data; only printing abbreviates long ones. As upstream's, the
stack_traces and module_hierarchy dicts are keyed by operator-graph node name (the graph node's name
plus "_"); the Event objects keep plain graph node names.
"""

from __future__ import annotations

import functools
import io
import sys
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from etlab.inspector._export import TensorFrame
from etlab.schema.etdump import OPERATOR_CALL

if TYPE_CHECKING:
    from etlab.inspector._events import EventBlock

STAT_NAMES = ("p10", "p50", "p90", "avg", "min", "max")
# Hidden when printing: bulky or only useful programmatically. Per-run lists (raw times, start
# times) make a printed grid unreadable; the dataframe keeps them.
HIDDEN_WHEN_PRINTING = ("raw", "start_time", "delegate_debug_identifier", "stack_traces", "module_hierarchy",
                        "debug_data")


def stat_columns(include_units: bool, unit: str) -> list[str]:
    """The statistic column names, with the unit when `include_units` (e.g. 'p50 (ms)')."""
    return [f"{s} ({unit})" if include_units else s for s in STAT_NAMES]


def perf_stats(durations: np.ndarray) -> np.ndarray:
    """(6, m) p10, p50, p90, avg, min, max over the runs (axis 0); NaN for events without timings."""
    m = durations.shape[1]
    if durations.shape[0] == 0 or m == 0:
        return np.full((6, m), np.nan)
    out = np.empty((6, m))
    if durations.shape[0] == 1:  # one run (a method's load, say): every statistic is its time, NaN included
        out[:] = durations[0]
        return out
    out[:3] = _percentiles(durations)
    durations.mean(axis=0, out=out[3])
    durations.min(axis=0, out=out[4])
    durations.max(axis=0, out=out[5])
    return out


_PCT = np.true_divide([10, 50, 90], 100)
_PCT_PLAN: dict[int, tuple] = {}


def _percentile_plan(n: int) -> tuple:
    """numpy's "linear" percentile method for n values, precomputed: (partition kth, lower and
    upper index, interpolation weight, where the weight is >= 0.5)."""
    plan = _PCT_PLAN.get(n)
    if plan is None:
        vi = (n - 1) * _PCT
        prev = np.floor(vi)
        nxt = prev + 1
        above = vi >= n - 1
        prev[above], nxt[above] = -1, -1
        gamma = np.asarray(vi - prev, dtype=vi.dtype)[:, None]
        lo, hi = prev.astype(np.intp), nxt.astype(np.intp)
        kth = np.unique(np.concatenate(([0, -1], lo, hi)))
        plan = _PCT_PLAN[n] = (kth, lo, hi, gamma, 1 - gamma, gamma >= 0.5)
    return plan


def _percentiles(d: np.ndarray) -> np.ndarray:
    """np.percentile(d, [10, 50, 90], axis=0) for float64 `d`, without its per-call overhead:
    the same partition, indexes and interpolation, so the same values bit for bit."""
    kth, lo, hi, gamma, one_minus, upper = _percentile_plan(d.shape[0])
    s = np.partition(d, kth, axis=0)
    a, b = s[lo], s[hi]
    with np.errstate(invalid="ignore"):
        diff = b - a
        res = a + diff * gamma
        np.subtract(b, diff * one_minus, out=res, where=upper)
    last = s[-1]
    nan = np.isnan(last)
    if nan.any():
        np.copyto(res, last, where=nan)
    return res


def frame_from_columns(cols: dict, include_units: bool, unit: str, keyed: bool = False) -> pd.DataFrame:
    """The frame of `cols`; `keyed`: its stack_traces / module_hierarchy dicts are keyed as upstream's
    already (`upstream_node_keys`; the Inspector's joins make them once per handle set).

    Every column is built with its final dtype (object arrays for lists, dicts and mixed ids; the
    string dtype pandas infers for text), so pandas need not infer, copy or check anything: on the
    small frames of most programs that inference was a fifth of the Inspector's time."""
    names = stat_columns(include_units, unit)
    stats = np.asarray(cols.pop("stats"), dtype=np.float64)
    n = len(cols["event_name"])
    arrays = [_text(cols["event_block_name"]), _text(cols["event_name"]), _objects(cols["raw"], n)]
    arrays += list(stats.reshape(6, n))
    for k in ("op_types", "delegate_debug_identifier", "stack_traces", "module_hierarchy", "is_delegated_op",
              "delegate_backend_name", "debug_data", "start_time"):
        if k == "is_delegated_op":
            arrays.append(np.fromiter(cols[k], dtype=bool, count=n))
        elif not keyed and k in ("stack_traces", "module_hierarchy"):
            arrays.append(_objects([upstream_node_keys(d) for d in cols[k]], n))
        else:  # delegate ids and backend names too: ints, strings and None stay objects, as upstream's
            arrays.append(_objects(cols[k], n))
    columns = ["event_block_name", "event_name", "raw", *names, "op_types", "delegate_debug_identifier",
               "stack_traces", "module_hierarchy", "is_delegated_op", "delegate_backend_name", "debug_data",
               "start_time"]
    return _frame(arrays, columns, n)  # a TensorFrame: to_parquet writes the debug_data tensors (_export)


@functools.cache
def _text_dtype():
    """The dtype pandas gives a column of Python strings (pandas 3: its string dtype; 2.x: object)."""
    return pd.Series(["a"]).dtype


def _text(values: list) -> Any:
    dtype = _text_dtype()
    return _objects(values, len(values)) if dtype == np.dtype(object) else pd.array(values, dtype=dtype)


def _objects(values: list, n: int) -> np.ndarray:
    """A 1-D object array of `values` (lists stay cells, never a second dimension)."""
    return np.fromiter(values, dtype=object, count=n)


@functools.cache
def _column_index(columns: tuple) -> pd.Index:
    return pd.Index(columns)  # immutable: frames may share it, as pandas' own operations do


def _frame(arrays: list, columns: list[str], n: int) -> pd.DataFrame:
    """A TensorFrame of typed, equally long 1-D arrays, without pandas' per-column inference and checks
    (DataFrame._from_arrays, pandas' own constructor for such arrays; the public one if it is gone)."""
    from_arrays = getattr(TensorFrame, "_from_arrays", None)
    if from_arrays is not None:
        try:
            return from_arrays(arrays, columns=_column_index(tuple(columns)), index=pd.RangeIndex(n),
                               verify_integrity=False)
        except TypeError:  # another signature in some pandas version
            pass
    return TensorFrame(dict(zip(columns, arrays)), copy=False)


def upstream_node_keys(by_node: dict) -> dict:
    """{graph node name: v} keyed as upstream's Inspector keys its frames: by its operator-graph node
    names, which append "_" to the graph node's name (so the two tools' frames compare equal)."""
    return {f"{name}_": v for name, v in by_node.items()}


def events_to_dataframe(block: EventBlock, include_units: bool, include_delegate_debug_data: bool) -> pd.DataFrame:
    """Slow path for hand-built or inspected EventBlocks: one row per Event object."""
    ev = block.events
    stats = np.full((6, len(ev)), np.nan)
    for j, e in enumerate(ev):
        if e.perf_data is not None:
            p = e.perf_data
            stats[:, j] = [p.p10, p.p50, p.p90, p.avg, p.min, p.max]
    cols = {
        "event_block_name": [block.name] * len(ev),
        "event_name": [e.name for e in ev],
        "raw": [None if e.perf_data is None else list(e.perf_data.raw) for e in ev],
        "stats": stats,
        "op_types": [list(e.op_types) for e in ev],
        "delegate_debug_identifier": [e.delegate_debug_identifier for e in ev],
        "stack_traces": [dict(e.stack_traces) for e in ev],
        "module_hierarchy": [dict(e.module_hierarchy) for e in ev],
        "is_delegated_op": [e.is_delegated_op for e in ev],
        "delegate_backend_name": [e.delegate_backend_name for e in ev],
        "debug_data": [list(e.debug_data) for e in ev],
        "start_time": [None if e.start_time is None else list(e.start_time) for e in ev],
    }
    df = frame_from_columns(cols, include_units, block.target_time_scale.value)
    if include_delegate_debug_data:
        df = add_delegate_columns(df, [e.delegate_debug_metadatas for e in ev])
    return df


def add_delegate_columns(df: pd.DataFrame, metadatas: list) -> pd.DataFrame:
    """Adds the delegate metadata: parsed dicts spread into columns, raw lists in one column."""
    records = []
    for md in metadatas:
        if isinstance(md, dict):
            records.append(md)
        elif md is not None and len(md) > 0:
            records.append({"delegate_debug_metadata": md})
        else:
            records.append({})
    if not any(records):
        return df
    extra = pd.DataFrame.from_records(records, index=df.index)
    return pd.concat([df, extra], axis=1)


def printable(df: pd.DataFrame) -> pd.DataFrame:
    """The frame as printed: bulky columns and OPERATOR_CALL rows left out, long op lists shortened."""
    out = df.drop(columns=[c for c in HIDDEN_WHEN_PRINTING if c in df.columns])
    out = out[~out["event_name"].astype(str).str.contains(OPERATOR_CALL, regex=False)].reset_index(drop=True)
    if "op_types" in out.columns:
        out["op_types"] = [_short_list(v) for v in out["op_types"]]
    return out


def _short_list(v):
    if isinstance(v, list) and len(v) >= 5:
        return f"['{v[0]}', '{v[1]}' ... '{v[-1]}'] ({len(v)} total)"
    return v


def _notebook_shell():
    """The IPython shell when running in a notebook kernel (which renders HTML), else None."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def display_or_print(df: pd.DataFrame, file: IO[str] | None = None) -> None:
    """An HTML table in a notebook, a text grid (tabulate) elsewhere."""
    if file is None and _notebook_shell() is not None:
        from IPython.display import HTML, display

        display(HTML(df.to_html(index=False, escape=True)))
        return
    from tabulate import tabulate

    print(tabulate(df, headers="keys", tablefmt="fancy_grid", showindex=False), file=file or sys.stdout)


def tsv_text(df: pd.DataFrame) -> str:
    """The frame as tab-separated text: what `save_data_to_tsv` writes and the CLI prints for --format tsv."""
    buf = io.StringIO()
    df.to_csv(buf, sep="\t")
    return buf.getvalue()
