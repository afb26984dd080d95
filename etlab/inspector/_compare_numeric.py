"""The numeric side of `compare`: which output of each side stands for a row, and how far apart the two are.

A row's value on one side is the output of its latest unit that is not a dequantize of an input (so
a quantized layer's value is its output quantize's, dequantized with that op's scale and zero point);
the two values are paired by shape (`_output_pair`) and measured as max-abs and relative L2
difference, SQNR and cosine similarity.
"""

from __future__ import annotations

import math

from etlab.inspector._numeric import _pair, cosine_similarity, snr


def max_abs_difference(reference, value) -> float:
    """Largest element-wise |value - reference|."""
    import torch

    a, b = _pair(reference, value)
    return float(torch.max(torch.abs(a - b))) if a.numel() else 0.0


def relative_difference(reference, value) -> float:
    """||value - reference|| / ||reference|| (L2); inf when the reference is zero and they differ."""
    import torch

    a, b = _pair(reference, value)
    diff, ref = float(torch.linalg.vector_norm(a - b)), float(torch.linalg.vector_norm(a))
    if diff == 0.0:
        return 0.0
    return diff / ref if ref > 0 else math.inf


def _tensors(outputs) -> list:
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return []
    return [v for v in (outputs or []) if isinstance(v, torch.Tensor) and v.device.type != "meta" and v.numel()]


def _output_pair(out_a: list, out_b: list):
    """The output of A and of B that are the same value: A's largest tensor (the last of equal
    size: an op's extra outputs, such as batch norm's saved statistics, are smaller), and B's last
    tensor of that shape (a delegate call logs its inputs before its output), else of that size."""
    ta, tb = _tensors(out_a), _tensors(out_b)
    if not ta or not tb:
        return None
    a = max(reversed(ta), key=lambda t: t.numel())
    same = [t for t in tb if tuple(t.shape) == tuple(a.shape)]
    if same:
        return a, same[-1]
    size = [t for t in tb if t.numel() == a.numel()]
    return (a, size[-1].reshape(a.shape)) if size else None


def _last_output(units: list, handles: list[int]) -> tuple:
    """The unit that logged the row's last value: the latest one with outputs, if it covers the
    row's last node (with handles), else None and why."""
    logged = [u for u in units if _tensors(u.outputs) and u.role != "in"]
    if not logged:
        shapes_only = any(getattr(v, "device", None) is not None and v.device.type == "meta"
                          for u in units for v in u.outputs)
        return None, "no tensor data (give the debug buffer)" if shapes_only else "no output logged"
    last = max(logged, key=lambda u: u.order)
    if handles and last.handles and handles[-1] not in last.handles:
        return None, "the last node's output was not logged"
    return last, ""


def _output_handles(units: list) -> list[int]:
    """The handles of a side's units that produce the row's value (not the dequantizes of its inputs)."""
    return sorted({h for u in units if u.role != "in" for h in u.handles})


def _dequantized(unit) -> list:
    """A unit's outputs, integer codes of a quantize turned back into values with its scale and zero point."""
    if unit.qparams is None:
        return unit.outputs
    scale, zero_point = unit.qparams
    codes = lambda v: hasattr(v, "dtype") and not v.dtype.is_floating_point and v.device.type != "meta"
    return [(v.float() - zero_point) * scale if codes(v) else v for v in unit.outputs]


def _numerics(row, a: list, b: list) -> None:
    ua, why_a = _last_output(a, _output_handles(a))
    ub, why_b = _last_output(b, _output_handles(b))
    if ua is None or ub is None:
        row.numeric_note = f"{'A' if ua is None else 'B'}: {why_a or why_b}"
        return
    pair = _output_pair(_dequantized(ua), _dequantized(ub))
    if pair is None:
        row.numeric_note = "outputs differ in shape"
        return
    ref, val = pair
    if ref.dtype.is_floating_point != val.dtype.is_floating_point:
        # a quantized build logs integer codes where the float build logs values: not comparable as is
        row.numeric_note = f"dtypes differ ({str(ref.dtype)[6:]} vs {str(val.dtype)[6:]})"
        return
    row.max_abs = max_abs_difference(ref, val)
    row.relative = relative_difference(ref, val)
    row.sqnr = snr(ref, val)
    row.cosine = cosine_similarity(ref, val)
