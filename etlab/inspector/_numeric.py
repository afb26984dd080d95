"""Numeric comparisons: output vs reference (compare_results) and runtime intermediates vs the
recorded graph's intermediates, matched by debug handle (numeric gap)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from etlab.errors import FormatError
from etlab.schema.etdump import OPERATOR_CALL

if TYPE_CHECKING:
    import torch

    from etlab.inspector._inspector import Inspector

DebugHandle = tuple[int, ...]


def _as_float(x) -> torch.Tensor:
    import torch

    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise ValueError("tensor has no data (meta device): give the Inspector the debug buffer")
        return x.detach().to(torch.float64)
    if isinstance(x, (bool, int, float)):
        return torch.tensor(float(x), dtype=torch.float64)
    raise TypeError(f"cannot compare a {type(x).__name__}")


def _pair(a, b) -> tuple[torch.Tensor, torch.Tensor]:
    ta, tb = _as_float(a), _as_float(b)
    if ta.shape != tb.shape:
        raise ValueError(f"shapes differ: {tuple(ta.shape)} vs {tuple(tb.shape)}")
    return ta, tb


def mse(reference, value) -> float:
    """Mean squared error."""
    import torch

    a, b = _pair(reference, value)
    return float(torch.mean((a - b) ** 2)) if a.numel() else 0.0


def l1(reference, value) -> float:
    """Sum of absolute differences."""
    import torch

    a, b = _pair(reference, value)
    return float(torch.sum(torch.abs(a - b)))


def snr(reference, value) -> float:
    """Signal-to-noise ratio in dB: 10 log10(power(reference) / power(reference - value)); inf when equal."""
    import torch

    a, b = _pair(reference, value)
    if a.numel() == 0:
        return math.inf
    noise = float(torch.mean((a - b) ** 2))
    signal = float(torch.mean(a**2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def cosine_similarity(reference, value) -> float:
    """Cosine of the angle between the two flattened tensors: 1.0 for the same direction (and for two zeros),
    0.0 when one side alone is zero."""
    import torch

    a, b = _pair(reference, value)
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(torch.sum(a * b)) / (na * nb)


DISTANCES: dict[str, Callable[[Any, Any], float]] = {"MSE": mse, "L1": l1, "SNR": snr}
METRICS: dict[str, Callable[[Any, Any], float]] = {"snr": snr, "mse": mse, "l1": l1,
                                                    "cosine_similarity": cosine_similarity}


def compare_results(reference_output: Sequence, run_output: Sequence, metrics: Sequence[str] | None = None,
                    plot: bool = False) -> dict[str, list[float | None]]:
    """Compares two lists of outputs pairwise: metric name -> one value per pair (None where a
    pair is not numeric). Metrics: snr, mse, l1, cosine_similarity (default: all). With
    plot=True, also shows a bar chart per metric (plotly)."""
    import torch

    if reference_output is None or run_output is None:
        raise ValueError("compare_results: both reference_output and run_output are needed")
    if len(reference_output) != len(run_output):
        raise ValueError(f"compare_results: {len(reference_output)} reference outputs but "
                         f"{len(run_output)} run outputs")
    names = list(METRICS) if metrics is None else [m.lower() for m in metrics]
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise ValueError(f"compare_results: unknown metric(s) {unknown}; choose from {list(METRICS)}")
    results: dict[str, list[float | None]] = {}
    for m in names:
        vals = []
        for i, (ref, out) in enumerate(zip(reference_output, run_output)):
            if not (isinstance(ref, (torch.Tensor, int, float)) and isinstance(out, (torch.Tensor, int, float))):
                vals.append(None)
                continue
            try:
                vals.append(METRICS[m](ref, out))
            except ValueError as e:
                raise ValueError(f"compare_results: output {i}: {e}") from None
        results[m] = vals
    if plot:
        _plot(results)
    return results


def _plot(results: dict[str, list]) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(results), subplot_titles=list(results))
    for i, (name, vals) in enumerate(results.items(), start=1):
        fig.add_trace(go.Bar(x=list(range(len(vals))), y=vals, name=name), row=1, col=i)
    fig.update_layout(showlegend=False, title="compare_results: per output index")
    fig.show()


# -- numeric gap --------------------------------------------------------------------------------


@dataclass
class RuntimeIntermediate:
    """One logged runtime output paired with what it computes: the debug handles, the instruction, the values and the
    op names."""

    handles: DebugHandle
    instruction: int
    output: Any          # the event's debug_data (a list of values)
    num_outputs: int
    op_names: list[str]


def merge_overlapping(entries: list[RuntimeIntermediate]) -> list[RuntimeIntermediate]:
    """Runtime entries sharing any debug handle become one (e.g. a delegate and the op inside
    it): handles ordered by instruction, the value of the latest instruction kept."""
    parent = list(range(len(entries)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, e in enumerate(entries):
        for h in e.handles:
            if h in owner:
                parent[find(i)] = find(owner[h])
            else:
                owner[h] = i
    groups: dict[int, list[RuntimeIntermediate]] = {}
    for i, e in enumerate(entries):
        groups.setdefault(find(i), []).append(e)
    merged = []
    for members in groups.values():
        members.sort(key=lambda e: e.instruction)
        handles: list[int] = []
        for e in members:
            handles = [h for h in handles if h not in e.handles] + [h for h in dict.fromkeys(e.handles)]
        last = members[-1]
        names = [n for e in members for n in e.op_names]
        merged.append(RuntimeIntermediate(tuple(handles), last.instruction, last.output, last.num_outputs, names))
    return merged


def _pick_runtime_value(runtime_output, aot_value, num_outputs: int, index: int):
    import torch

    if not isinstance(runtime_output, (list, tuple)):
        return runtime_output
    if not runtime_output:
        return None
    if num_outputs == 1 and len(runtime_output) > 1 and isinstance(aot_value, torch.Tensor):
        # ops with extra outputs (layer norm's mean/rstd, dropout's mask): pick the one that fits
        fits = [v for v in runtime_output if isinstance(v, torch.Tensor) and v.shape == aot_value.shape]
        if len(fits) > 1:
            fits = [v for v in fits if v.dtype == aot_value.dtype] or fits
        if len(fits) == 1:
            return fits[0]
    return runtime_output[-(index + 1)] if index < len(runtime_output) else None


def _primary_outputs(aot_value, r: RuntimeIntermediate, index: int) -> tuple[Any, Any]:
    """(AOT value, runtime value) to compare for the index-th output of runtime entry r. An AOT node
    with several outputs (batch norm's output, mean and inverse std; max's values and indices) is
    compared by its first, the op's result (upstream compares the ATen-level op, e.g. batch_norm, whose
    only output that is): the runtime's first output when it logged as many, else the one runtime
    output of that shape; (None, None) when there is no such pair."""
    if not isinstance(aot_value, (list, tuple)):
        return aot_value, _pick_runtime_value(r.output, aot_value, r.num_outputs, index)
    if not aot_value:
        return None, None
    primary = aot_value[0]
    if len(aot_value) == 1:
        return primary, _pick_runtime_value(r.output, primary, r.num_outputs, index)
    outs = list(r.output) if isinstance(r.output, (list, tuple)) else [r.output]
    if len(outs) == len(aot_value) and r.num_outputs == 1:
        return primary, outs[0]
    shape = getattr(primary, "shape", None)
    fits = [v for v in outs if shape is not None and getattr(v, "shape", None) == shape]
    return (primary, fits[0]) if len(fits) == 1 else (None, None)


def match_intermediates(aot: dict[DebugHandle, Any], runtime: list[RuntimeIntermediate]) -> list[tuple]:
    """(aot handles, aot value, runtime entry, runtime value) for each runtime output that maps to
    the recorded graph: the AOT value is the one whose handle is the runtime entry's last (or, for
    the i-th of several outputs, i-th from last). Entries whose AOT handles are not all covered by
    the runtime entry are skipped; an AOT node with several outputs is compared by its first
    (`_primary_outputs`)."""
    by_handle: dict[int, DebugHandle] = {}
    for key in aot:
        for h in key:
            by_handle.setdefault(h, key)
    out = []
    for r in merge_overlapping(runtime):
        covered = {k for h in r.handles if (k := by_handle.get(h)) is not None}
        if not covered or not all(set(k) <= set(r.handles) for k in covered):
            continue
        for i in range(r.num_outputs):
            if i >= len(r.handles):
                break
            key = by_handle.get(r.handles[-(i + 1)])
            if key is None:
                continue
            aot_value, value = _primary_outputs(aot[key], r, i)
            if value is not None:
                out.append((r.handles, aot_value, r, value))
    return out


def _check_same_shape(inspector: Inspector, handles: DebugHandle, ops, aot_value, value) -> None:
    """FormatError naming the run's files when a logged intermediate does not have the shape the
    recorded graph computes for its debug handles: the ETDump (or its debug buffer) and the ETRecord
    are not of one program, and a distance between them would mean nothing."""
    import torch

    if isinstance(value, torch.Tensor) and isinstance(aot_value, torch.Tensor) and value.shape != aot_value.shape:
        files = inspector._columns.what + (f" (debug buffer {inspector._buffer.what})" if inspector._buffer else "")
        names = ", ".join(op.name for op in ops) or "no node"
        raise FormatError(f"{files}: debug handle {list(handles)} ({names}): the run logged a {tuple(value.shape)} "
                          f"tensor, the ETRecord's graph computes {tuple(aot_value.shape)}; the run and the ETRecord "
                          "are not of one program")


def _latest_per_handle(entries: list[RuntimeIntermediate]) -> dict[DebugHandle, RuntimeIntermediate]:
    """One entry per handle tuple: the latest instruction carrying it, whether or not it logged a value (on a
    tie, one that did). The nodes one op decomposes into share its handle (linear: permute the weight, then
    addmm); only the last instruction's output is the handle's. When that instruction's value was not logged
    (the debug buffer was full), the handle has no runtime value: an earlier instruction's output (the
    permuted weight) would be compared with the graph's result of another shape. Entries without a value are
    then dropped."""
    latest: dict[DebugHandle, RuntimeIntermediate] = {}
    for e in entries:
        cur = latest.get(e.handles)
        if cur is None or (e.instruction, bool(e.output)) > (cur.instruction, bool(cur.output)):
            latest[e.handles] = e
    return {k: e for k, e in latest.items() if e.output}


def numeric_gap(inspector: Inspector, distance) -> pd.DataFrame:
    """Per matched op, the distance between the eager model's intermediate output and the runtime's (`distance`:
    'MSE', 'L1', 'SNR' or a function (aot, runtime) -> float); a ValueError when the Inspector has no recorded
    program."""
    import torch

    program = inspector._program
    if program is None:
        raise ValueError("calculate_numeric_gap needs the recorded program: create the Inspector with an etrecord")
    if isinstance(distance, str):
        if distance.strip().upper() not in DISTANCES:
            raise ValueError(f"calculate_numeric_gap: unknown distance {distance!r}; use one of {list(DISTANCES)} "
                             "or a function (aot, runtime) -> float")
        fn = DISTANCES[distance.strip().upper()]
    elif callable(distance):
        fn = distance
    else:
        raise TypeError("distance must be 'MSE', 'L1', 'SNR' or a function (aot, runtime) -> float")
    rows = []
    per_method: dict[int, tuple] = {}
    for block in inspector.event_blocks:
        method = program.method_for_block(block.name)
        if method is None:
            continue
        entries = per_method.setdefault(id(method), (method, []))[1]
        for e in block.events:
            # events that logged nothing stay in: see _latest_per_handle
            if e.name == OPERATOR_CALL or not e.op_types or e.debug_handles is None:
                continue
            handles = (e.debug_handles,) if isinstance(e.debug_handles, int) else tuple(e.debug_handles)
            entries.append(RuntimeIntermediate(handles, e.instruction_id or 0, e.debug_data or [], e.num_outputs,
                                               [e.name]))
    for method, entries in per_method.values():
        latest = _latest_per_handle(entries)
        aot = method.aot_intermediate_outputs
        if callable(aot):
            aot = method.aot_intermediate_outputs = aot()
        if not aot:
            raise ValueError("calculate_numeric_gap: the ETRecord has no intermediate outputs of the recorded "
                             "program (it needs representative inputs)")
        aot = {(k,) if isinstance(k, int) else tuple(k): v for k, v in aot.items()}
        for handles, aot_value, r, value in match_intermediates(aot, list(latest.values())):
            ops = [op for h in handles for op in method.ops.get(h, ())]
            if (isinstance(value, torch.Tensor) and isinstance(aot_value, torch.Tensor)
                    and value.shape != aot_value.shape and value.numel() == aot_value.numel()):
                # The nodes one op decomposes into share its handle, views included (linear on 3-D
                # input ends in a reshape): the runtime may log the data before the final view.
                value = value.reshape(aot_value.shape)
            _check_same_shape(inspector, handles, ops, aot_value, value)
            rows.append({
                "aot_debug_handle": handles,
                "aot_ops": [op.name for op in ops],
                "aot_intermediate_output": aot_value,
                "runtime_debug_handle": r.handles,
                "runtime_ops": r.op_names,
                "runtime_intermediate_output": value,
                "gap": [fn(aot_value, value)],
                "stacktraces": {op.name: op.stack_trace for op in ops},
            })
    return pd.DataFrame(rows, columns=["aot_debug_handle", "aot_ops", "aot_intermediate_output",
                                       "runtime_debug_handle", "runtime_ops", "runtime_intermediate_output",
                                       "gap", "stacktraces"])
