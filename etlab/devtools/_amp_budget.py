"""The accuracy budget `auto_mixed_precision` must meet, measured over a dataset.

A budget compares the quantized program's outputs with the float model's, sample by sample, and
reduces them to one number for the whole dataset:

- `top1`: top-1 agreement, the fraction of rows (every index but the last dimension of the first
  output) whose argmax is the float model's; `top1>=0.99`, `top1>=99%`;
- `cosine`: the mean over samples of the cosine similarity of all outputs flattened; `min_cosine`:
  the worst sample's;
- `sqnr`: the dataset's signal-to-quantization-noise ratio in dB (sum of squares of the float
  outputs over the sum of squares of the error, all samples); `min_sqnr`: the worst sample's;
- `mse`: mean squared error over all output elements (lower is better: `mse<=1e-4`);
- a callable `metric(reference_outputs, quantized_outputs) -> float` on the two lists of per-sample
  model outputs, for what only the user can define (mAP, WER): `AccuracyBudget(metric=fn, threshold=0.5,
  name="mAP")`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten

# metric -> (higher is better, lower bound, upper bound) of a valid threshold
_METRICS: dict[str, tuple[bool, float, float]] = {
    "top1": (True, 0.0, 1.0), "cosine": (True, -1.0, 1.0), "min_cosine": (True, -1.0, 1.0),
    "sqnr": (True, -math.inf, math.inf), "min_sqnr": (True, -math.inf, math.inf), "mse": (False, 0.0, math.inf),
}
_ALIASES = {"top1_agreement": "top1", "top-1": "top1", "acc": "top1", "agreement": "top1"}
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_PATTERN = re.compile(rf"^\s*([A-Za-z_][\w-]*)\s*(>=|<=|>|<)\s*({_NUMBER})\s*(%|dB|db)?\s*$")
_FORMS = "'top1>=0.99', 'top1>=99%', 'cosine>=0.999', 'min_cosine>=0.99', 'sqnr>=30dB', 'min_sqnr>=25', 'mse<=1e-4'"


@dataclass(frozen=True)
class AccuracyBudget:
    """`metric` (a name of the module docstring or a callable) compared with `threshold`: met when the
    dataset's value is >= threshold (> when `strict`), or <= / < for a lower-is-better metric."""

    metric: str | Callable[[list, list], float]
    threshold: float
    higher_is_better: bool | None = None  # None: the named metric's own direction (a callable: True)
    strict: bool = False
    name: str = ""

    def __post_init__(self):
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                or math.isnan(float(self.threshold)):
            raise ValueError(f"budget: threshold must be a number, got {self.threshold!r}")
        if callable(self.metric):
            object.__setattr__(self, "higher_is_better", True if self.higher_is_better is None
                               else bool(self.higher_is_better))
            if not self.name:
                object.__setattr__(self, "name", getattr(self.metric, "__name__", "metric"))
            return
        if not isinstance(self.metric, str):
            raise TypeError(f"budget: metric must be a name ({', '.join(_METRICS)}) or a callable "
                            f"metric(reference_outputs, quantized_outputs) -> float, got {type(self.metric).__name__}")
        metric = _ALIASES.get(self.metric.lower(), self.metric.lower())
        if metric not in _METRICS:
            raise ValueError(f"budget: unknown metric {self.metric!r}; known: {', '.join(_METRICS)} "
                             "(or pass a callable)")
        higher, lo, hi = _METRICS[metric]
        if self.higher_is_better is not None and bool(self.higher_is_better) != higher:
            better = "higher" if higher else "lower"
            raise ValueError(f"budget: {metric} is better when {better}; write {metric}{'>=' if higher else '<='}"
                             f"{self.threshold}")
        if not lo <= float(self.threshold) <= hi:
            raise ValueError(f"budget: a {metric} threshold must lie in [{lo}, {hi}], got {self.threshold}"
                             + (" (write a percentage as 99%)" if metric == "top1" and self.threshold > 1 else ""))
        object.__setattr__(self, "metric", metric)
        object.__setattr__(self, "higher_is_better", higher)
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "name", self.name or metric)

    # -- construction ----------------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> AccuracyBudget:
        """'top1>=0.99', 'top1>=99%', 'sqnr>=30dB', 'mse<=1e-4', ... (see the module docstring)."""
        if not isinstance(text, str):
            raise TypeError(f"budget: expected a string such as 'top1>=0.99', got {type(text).__name__}")
        m = _PATTERN.match(text)
        if m is None:
            raise ValueError(f"budget: cannot read {text!r}; write <metric><op><number>, e.g. {_FORMS}")
        name, op, number, unit = m.groups()
        metric = _ALIASES.get(name.lower(), name.lower())
        if metric not in _METRICS:
            raise ValueError(f"budget {text!r}: unknown metric {name!r}; known: {', '.join(_METRICS)}")
        value = float(number)
        if unit == "%":
            if metric != "top1":
                raise ValueError(f"budget {text!r}: a percentage applies to top1 only")
            value /= 100.0
        elif unit and metric not in ("sqnr", "min_sqnr"):
            raise ValueError(f"budget {text!r}: dB applies to sqnr and min_sqnr only")
        higher = _METRICS[metric][0]
        if (op in (">=", ">")) != higher:
            raise ValueError(f"budget {text!r}: {metric} is better when {'higher' if higher else 'lower'}; "
                             f"write {metric}{'>=' if higher else '<='}{number}{unit or ''}")
        return cls(metric, value, higher, strict=op in (">", "<"))

    # -- measuring -------------------------------------------------------------------------------------
    def measure(self, reference: Sequence, quantized: Sequence) -> float:
        """The metric over the dataset: `reference` and `quantized` are lists of per-sample model outputs."""
        if len(reference) != len(quantized) or not reference:
            raise ValueError(f"budget {self}: {len(reference)} reference outputs and {len(quantized)} quantized "
                             "outputs; need the same non-zero number")
        if callable(self.metric):
            value = self.metric(list(reference), list(quantized))
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"budget {self.name}: the metric returned {type(value).__name__}, "
                                "expected a number") from None
            if math.isnan(value):
                raise ValueError(f"budget {self.name}: the metric returned NaN")
            return value
        return _named_metric(self.metric, reference, quantized)

    def met(self, value: float) -> bool:
        """Whether a measured value meets the budget (strictly when `strict`); NaN never does."""
        if math.isnan(value):
            return False
        if self.higher_is_better:
            return value > self.threshold if self.strict else value >= self.threshold
        return value < self.threshold if self.strict else value <= self.threshold

    def margin(self, value: float) -> float:
        """How far `value` is on the good side of the threshold (negative: missed by that much)."""
        return (value - self.threshold) if self.higher_is_better else (self.threshold - value)

    def better(self, a: float, b: float) -> bool:
        """Whether value `a` is further on the good side of the threshold than `b` (how the search ranks candidates)."""
        return self.margin(a) > self.margin(b)

    def __str__(self) -> str:
        op = (">" if self.strict else ">=") if self.higher_is_better else ("<" if self.strict else "<=")
        unit = " dB" if self.metric in ("sqnr", "min_sqnr") else ""
        return f"{self.name}{op}{self.threshold:g}{unit}"


def as_budget(budget) -> AccuracyBudget:
    """An AccuracyBudget from an AccuracyBudget or its text form; anything else is a TypeError naming the forms."""
    if isinstance(budget, AccuracyBudget):
        return budget
    if isinstance(budget, str):
        return AccuracyBudget.parse(budget)
    raise TypeError(f"budget must be a string such as {_FORMS}, "
                    "or an AccuracyBudget (e.g. AccuracyBudget(metric=fn, threshold=0.9)), "
                    f"got {type(budget).__name__}")


def float_leaves(output) -> list[torch.Tensor]:
    """The floating-point tensors of one model output (a tensor, tuple, dict, ...), in pytree order."""
    leaves, _ = tree_flatten(output)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _pair(ref, out, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = float_leaves(ref), float_leaves(out)
    if not a or len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise ValueError(f"budget: sample {i}: the quantized outputs do not match the float model's in number or "
                         "shape")
    return torch.cat([x.detach().double().reshape(-1) for x in a]), torch.cat([y.detach().double().reshape(-1)
                                                                               for y in b])


def sqnr_db(signal: float, noise: float) -> float:
    """Signal-to-quantization-noise ratio in dB from signal and noise powers (inf without noise, -inf without
    signal)."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _named_metric(metric: str, reference: Sequence, quantized: Sequence) -> float:
    if metric == "top1":
        agree = total = 0
        for i, (r, q) in enumerate(zip(reference, quantized)):
            a, b = float_leaves(r), float_leaves(q)
            if not a or not b or a[0].shape != b[0].shape:
                raise ValueError(f"budget top1: sample {i}: the first output differs in shape or is not a tensor")
            if a[0].ndim == 0:
                raise ValueError("budget top1: the first output is a scalar; top-1 needs logits (..., classes)")
            agree += int((a[0].argmax(-1) == b[0].argmax(-1)).sum())
            total += a[0].argmax(-1).numel()
        return agree / total
    signal = noise = 0.0
    per_sample: list[float] = []
    for i, (r, q) in enumerate(zip(reference, quantized)):
        a, b = _pair(r, q, i)
        d = a - b
        s, n = float(a @ a), float(d @ d)
        signal, noise = signal + s, noise + n
        if metric in ("cosine", "min_cosine"):
            na, nb = math.sqrt(s), float(b.norm())
            per_sample.append(float(a @ b) / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0))
        elif metric == "min_sqnr":
            per_sample.append(sqnr_db(s, n))
        elif metric == "mse":
            per_sample.append(n / max(a.numel(), 1))
    if metric == "sqnr":
        return sqnr_db(signal, noise)
    if metric in ("min_cosine", "min_sqnr"):
        return min(per_sample)
    return sum(per_sample) / len(per_sample)


def dataset_sqnr(reference: Sequence, quantized: Sequence) -> float:
    """The dataset's output SQNR in dB (the search's tie-break: smooth where top-1 is a step)."""
    return _named_metric("sqnr", reference, quantized)
