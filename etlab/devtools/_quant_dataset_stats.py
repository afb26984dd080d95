"""Streaming statistics of quantization error over a dataset, in memory that does not grow with it.

A per-layer report over N inputs keeps, per layer and metric, a count, a sum, the extremes with the
input they came from, and a histogram on fixed bins: SQNR in 0.1 dB steps, max-abs error in 1/100 of
a decade. Percentiles (the p95 a budget is written against) come from the histogram, exact to one
bin; mean, min and max are exact. Memory is per layer and metric, whatever N is.

The per-input numbers are computed for a whole batch at once (`batch_metrics`): the norms of
`error_metrics` per row of a (batch, -1) view, a large layer's input by input so that its row stays in
cache from the subtraction to the last reduction over it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from etlab.devtools._quant_debug import error_metrics

SQNR_EDGES = np.round(np.arange(-60.0, 200.0 + 1e-9, 0.1), 1)  # dB; below / above: the first / last bin
MAX_ABS_EDGES = 10.0 ** np.round(np.arange(-12.0, 8.0 + 1e-9, 0.01), 2)  # 1/100 decade
TINY = 1e-6  # a float value below this in magnitude makes SQNR meaningless (see degenerate_reason)


@dataclass
class Stream:
    """One metric over a stream of inputs: exact count, mean (of the finite values), min/max and the input
    each came from, and a histogram on `edges` for percentiles. +-inf and NaN are counted apart."""

    edges: np.ndarray
    n: int = 0
    total: float = 0.0
    finite: int = 0
    low: float = math.inf
    low_input: int = -1
    high: float = -math.inf
    high_input: int = -1
    nan: int = 0
    counts: np.ndarray = field(default=None)  # len(edges) + 1: [< edges[0]], [edges[i-1], edges[i]), [>= edges[-1]]

    def __post_init__(self):
        if self.counts is None:
            self.counts = np.zeros(len(self.edges) + 1, dtype=np.int64)

    def add(self, values: np.ndarray, inputs: np.ndarray) -> None:
        """Adds one value per input (`inputs`: their indices in the dataset)."""
        values = np.asarray(values, dtype=np.float64)
        nan = np.isnan(values)
        self.nan += int(nan.sum())
        values, inputs = values[~nan], np.asarray(inputs)[~nan]
        if not values.size:
            return
        self.n += values.size
        fin = np.isfinite(values)
        self.finite += int(fin.sum())
        self.total += float(values[fin].sum())
        i, j = int(values.argmin()), int(values.argmax())
        if values[i] < self.low:
            self.low, self.low_input = float(values[i]), int(inputs[i])
        if values[j] > self.high:
            self.high, self.high_input = float(values[j]), int(inputs[j])
        self.counts += np.bincount(np.searchsorted(self.edges, values, side="right"), minlength=len(self.counts))

    @property
    def mean(self) -> float:
        """Mean of the finite values (NaN when none); an exact layer's +inf SQNR is left out, see `quantile`."""
        return self.total / self.finite if self.finite else math.nan

    def quantile(self, q: float) -> float:
        """The value a fraction q of the inputs are at or below, to one bin (the bin's middle, within the
        exact extremes); +-inf when the quantile falls among infinite values."""
        if not self.n:
            return math.nan
        rank = q * (self.n - 1)
        k = int(np.searchsorted(np.cumsum(self.counts), rank, side="right"))
        if k == 0:
            return self.low
        if k >= len(self.edges):
            return self.high
        mid = 0.5 * (self.edges[k - 1] + self.edges[k])
        return float(min(max(mid, self.low), self.high))

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(bin left edges, counts) of the occupied span, for drawing a distribution."""
        nz = np.nonzero(self.counts)[0]
        if not nz.size:
            return np.array([]), np.array([], dtype=np.int64)
        lo, hi = nz[0], nz[-1] + 1
        left = np.concatenate([[-np.inf], self.edges])[lo:hi]
        return left, self.counts[lo:hi]


def sqnr_stream() -> Stream:
    """A Stream for SQNR values (0.1 dB bins from -60 to 200 dB)."""
    return Stream(SQNR_EDGES)


def max_abs_stream() -> Stream:
    """A Stream for max-abs errors (1/100-decade bins from 1e-12 to 1e8)."""
    return Stream(MAX_ABS_EDGES)


def rows(x: torch.Tensor, batch: int | None = None) -> torch.Tensor:
    """x as (batch, n), one row per input, without a copy where the layout allows (contiguous, or channels-last
    as the converted graph's convolutions leave it). Element order within a row follows the layout: only for
    reductions that ignore it (norms, extremes), never to pair two tensors element by element."""
    batch = x.shape[0] if batch is None else batch
    if x.dim() == 4 and x.shape[0] == batch and not x.is_contiguous() \
            and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).reshape(batch, -1)
    return x.reshape(batch, -1)


def _squared_norms(x: torch.Tensor) -> np.ndarray:
    """Per-row squared L2 norms of a (batch, n) tensor, as float64 (one vectorised pass: a row-wise dot
    product through bmm or a multiply-and-sum is several times slower on CPU)."""
    return torch.linalg.vector_norm(x, dim=1).to(torch.float64).numpy() ** 2


def raw_ranges(x: torch.Tensor, batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (min, max) of a batch, NaN and infinities included (amin and amax: aminmax(dim=) is 10x slower,
    vector_norm's inf-norm 40x)."""
    flat = rows(x.detach(), batch)
    if flat.shape[1] == 0:
        nan = np.full(flat.shape[0], math.nan)
        return nan, nan.copy()
    return flat.amin(1).to(torch.float64).numpy(), flat.amax(1).to(torch.float64).numpy()


def _max_abs(x: torch.Tensor) -> np.ndarray:
    """Per-row max |x| of a (batch, n) tensor."""
    lo, hi = raw_ranges(x)
    return np.maximum(-lo, hi)


class Scratch:
    """One reusable buffer for the per-layer differences: a new tensor of a large activation is a new mapping
    of memory, faulted in page by page, which costs about as much as the subtraction that fills it."""

    def __init__(self):
        self.buffer = torch.empty(0)

    def like(self, x: torch.Tensor) -> torch.Tensor | None:
        """A float32 tensor of x's shape and layout backed by the buffer (overwritten by the next call), or None
        for another dtype or layout."""
        if x.dtype != torch.float32:
            return None
        n = x.numel()
        if self.buffer.numel() < n:
            self.buffer = torch.empty(n)
        flat = self.buffer[:n]
        if x.is_contiguous():
            return flat.view(x.shape)
        if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
            b, c, h, w = x.shape
            return flat.view(b, h, w, c).permute(0, 3, 1, 2)
        return None


GROUP = 1 << 18  # elements (1 MB of float32) a layer is measured at a time: as many inputs (rows) as fit, at least one


def _paired_rows(a: torch.Tensor, b: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(batch, n) views of a and b that pair the same elements (both contiguous, or both channels-last), or
    None (another layout: the caller pairs them through a broadcasting subtraction)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    if a.is_contiguous() and b.is_contiguous():
        return a.view(batch, -1), b.view(batch, -1)
    cl = torch.channels_last
    if a.dim() == 4 and a.shape[0] == batch and a.is_contiguous(memory_format=cl) and b.is_contiguous(memory_format=cl):
        return rows(a, batch), rows(b, batch)
    return None


def _by_groups(a: torch.Tensor, b: torch.Tensor, with_b: bool, extremes: bool, scratch: Scratch,
               ranges: bool = False) -> tuple[np.ndarray, ...]:
    """Squared norms of a - b, a and b, the extremes of a - b, and (ranges) a's own extremes, for a few inputs
    (rows) at a time: the rows of about `GROUP` elements stay in cache from the subtraction to the last
    reduction over them, where the whole batch's difference would be read back from memory once per reduction
    (~1.5x the time), and a small layer's inputs share each call (one row at a time, the calls' own cost was
    ~10 ms per MobileNetV2 input). Every reduction is per row, bit for bit what it gives on that row alone."""
    batch, n = a.shape
    k = max(1, min(batch, GROUP // max(n, 1)))
    if a.dtype == torch.float32:
        if scratch.buffer.numel() < k * n:
            scratch.buffer = torch.empty(k * n)
        buffer = scratch.buffer
    else:
        buffer = torch.empty(k * n, dtype=a.dtype)
    vn = torch.linalg.vector_norm
    parts = []
    for first in range(0, batch, k):
        ai, bi = a[first:first + k], b[first:first + k]
        d = torch.sub(ai, bi, out=buffer[:ai.numel()].view(ai.shape))
        cols = [vn(d, dim=1), vn(ai, dim=1)]
        if with_b:
            cols.append(vn(bi, dim=1))
        if ranges:
            cols += [ai.amin(1), ai.amax(1)] if k > 1 else list(torch.aminmax(ai[0]))
        if extremes:  # one row: one pass for both (aminmax(dim=) is 10x slower than amin and amax)
            if k > 1:
                cols += [-d.amin(1), d.amax(1)]
            else:
                lo, hi = torch.aminmax(d[0])
                cols += [-lo, hi]
        parts.append(torch.stack([c.reshape(-1) for c in cols], 1))
    m = torch.cat(parts).to(torch.float64).numpy()
    noise, signal = m[:, 0] ** 2, m[:, 1] ** 2
    b_sum = m[:, 2] ** 2 if with_b else None
    max_abs = np.maximum(m[:, -2], m[:, -1]) if extremes else np.full(len(m), math.nan)
    j = 2 + with_b
    a_range = (m[:, j].copy(), m[:, j + 1].copy()) if ranges else None
    return noise, signal, b_sum, max_abs, a_range


def batch_metrics(reference: torch.Tensor, value: torch.Tensor, batch: int | None = None, *,
                  value_norm: np.ndarray | None = None, extremes: bool = True,
                  scratch: Scratch | None = None, ranges: bool = False) -> dict[str, np.ndarray]:
    """`error_metrics` for every row of a batch (dim 0 = input): sqnr, cosine, max_abs, mse, and `b_zero`
    (the value is all zero: rounded away). One difference and three norms per row and the difference's
    extremes, each a single pass in the tensors' own layout; the cosine comes from the norms
    (|a|^2 + |b|^2 - |a-b|^2 = 2 a.b), whose rounding is far below the 5 digits shown. Rows with a non-finite
    norm go through `error_metrics` itself, which knows what a matching -inf mask means. batch: rows (default
    dim 0; 1 for a value without a batch dim). value_norm: the value's squared norms when already known (a
    layer's value is compared with two references: total and local). extremes=False: no max_abs (NaN; one
    pass fewer over the difference when only the SQNR is wanted). scratch: where the difference is written.
    ranges: also the reference's `raw_ranges` ("lo", "hi"), taken while its rows are in cache."""
    batch = reference.shape[0] if batch is None else batch
    dtype = torch.float64 if torch.float64 in (reference.dtype, value.dtype) else torch.float32
    a, b = reference.detach().to(dtype), value.detach().to(dtype)
    n = a.numel() // batch if batch else 0
    if n == 0:
        ones = np.ones(batch)
        out = {"sqnr": ones * math.inf, "cosine": ones, "max_abs": ones * 0.0, "mse": ones * 0.0,
               "b_zero": np.zeros(batch, dtype=bool), "signal": ones * 0.0, "noise": ones * 0.0, "b_norm": ones * 0.0}
        return {**out, "lo": ones * math.nan, "hi": ones * math.nan} if ranges else out
    paired = _paired_rows(a, b, batch) if scratch is not None else None
    a_range = None
    if paired is not None:
        noise, signal, b_sum, max_abs, a_range = _by_groups(*paired, value_norm is None, extremes, scratch, ranges)
        b_sum = b_sum if value_norm is None else value_norm.copy()
    else:
        buffer = scratch.like(a) if scratch is not None and a.shape == b.shape else None
        d = rows(torch.sub(a, b, out=buffer) if buffer is not None else a - b, batch)
        noise, signal = _squared_norms(d), _squared_norms(rows(a, batch))
        b_sum = _squared_norms(rows(b, batch)) if value_norm is None else value_norm.copy()
        max_abs = _max_abs(d) if extremes else np.full(batch, math.nan)
        del d, buffer
        a_range = raw_ranges(a, batch) if ranges else None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        sqnr = np.where(noise == 0, math.inf, np.where(signal == 0, -math.inf, 10.0 * np.log10(signal / noise)))
        norm = np.sqrt(signal) * np.sqrt(b_sum)
        cross = 0.5 * (signal + b_sum - noise)
        cosine = np.where(norm > 0, np.clip(cross / norm, -1.0, 1.0), np.where(signal == b_sum, 1.0, 0.0))
    out = {"sqnr": sqnr, "cosine": cosine, "max_abs": max_abs, "mse": noise / n, "b_zero": b_sum == 0,
           "signal": signal, "noise": noise, "b_norm": b_sum}
    if a_range is not None:
        out["lo"], out["hi"] = a_range
    bad = ~(np.isfinite(noise) & np.isfinite(signal) & np.isfinite(b_sum))
    if bad.any():  # rare: infinities, NaN, float32 overflow (rows paired element by element: one layout)
        a2, b2 = a.reshape(batch, -1), b.reshape(batch, -1)
        for i in np.nonzero(bad)[0]:
            m = error_metrics(a2[i], b2[i])
            out["sqnr"][i], out["cosine"][i], out["max_abs"][i], out["mse"][i] = m.sqnr, m.cosine, m.max_abs, m.mse
            out["b_zero"][i] = not bool(b2[i].any())
    return out


def row_ranges(x: torch.Tensor, batch: int | None = None,
               raw: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (min, max) of a batch over its finite elements (NaN for a row with none). raw: `raw_ranges`
    of x when already computed."""
    lo, hi = raw_ranges(x, batch) if raw is None else (raw[0].copy(), raw[1].copy())
    bad = ~(np.isfinite(lo) & np.isfinite(hi))
    if bad.any():
        flat = rows(x.detach(), batch)
        for i in np.nonzero(bad)[0]:
            row = flat[i][torch.isfinite(flat[i])]
            lo[i], hi[i] = (float(row.min()), float(row.max())) if row.numel() else (math.nan, math.nan)
    return lo, hi


@dataclass
class CoverageBatch:
    """One batch's values at a quantize node: per input its finite range and clipped element count."""

    lo: np.ndarray
    hi: np.ndarray
    clipped: np.ndarray
    elements: int


@dataclass
class Coverage:
    """The range a static quantize node can represent (from the scale and zero point the quantizer's
    observers chose on the calibration data) against the values that reached it over the dataset."""

    node: str
    scale: float
    zero_point: int
    lo: float  # (quant_min - zero_point) * scale
    hi: float  # (quant_max - zero_point) * scale
    seen_min: float = math.inf
    seen_max: float = -math.inf
    clipped: int = 0  # elements beyond half a step outside [lo, hi]
    elements: int = 0
    clipped_inputs: int = 0
    inputs: int = 0
    first_clipped_input: int = -1

    def measure(self, x: torch.Tensor, batch: int | None = None,
                raw: tuple[np.ndarray, np.ndarray] | None = None) -> CoverageBatch:
        """A batch (dim 0 = input) of the values that enter the quantize node, measured (see `commit`).
        raw: `raw_ranges` of x when already computed."""
        batch = x.shape[0] if batch is None else batch
        lo, hi = row_ranges(x, batch, raw)
        clipped = np.zeros(batch, dtype=np.int64)
        half = 0.5 * self.scale
        outside = (lo < self.lo - half) | (hi > self.hi + half)
        if outside.any():  # counted only where a row's range says there is something to count
            flat = rows(x.detach(), batch)
            for i in np.nonzero(outside)[0]:
                clipped[i] = int(((flat[i] < self.lo - half) | (flat[i] > self.hi + half)).sum())
        return CoverageBatch(lo, hi, clipped, x.numel())

    def commit(self, m: CoverageBatch, first_input: int) -> None:
        """Adds a measured batch whose first input is `first_input` in the dataset."""
        self.seen_min = float(np.nanmin([self.seen_min, *m.lo]))
        self.seen_max = float(np.nanmax([self.seen_max, *m.hi]))
        self.inputs += len(m.lo)
        self.elements += m.elements
        self.clipped += int(m.clipped.sum())
        hit = np.nonzero(m.clipped)[0]
        self.clipped_inputs += hit.size
        if hit.size and self.first_clipped_input < 0:
            self.first_clipped_input = first_input + int(hit[0])

    def add(self, x: torch.Tensor, first_input: int) -> None:
        """Adds a batch (dim 0 = input) of the values that enter the quantize node."""
        self.commit(self.measure(x), first_input)

    def row(self) -> dict:
        """The coverage as a table row: the representable range, the range seen, and how often inputs were clipped."""
        span = self.hi - self.lo
        seen = self.seen_max - self.seen_min if self.inputs else math.nan
        return {"range_lo": self.lo, "range_hi": self.hi, "seen_min": self.seen_min if self.inputs else math.nan,
                "seen_max": self.seen_max if self.inputs else math.nan,
                "clipped": self.clipped / self.elements if self.elements else math.nan,
                "clipped_inputs": self.clipped_inputs / self.inputs if self.inputs else math.nan,
                "first_clipped_input": self.first_clipped_input,
                "range_used": seen / span if span > 0 and math.isfinite(seen) else math.nan}
