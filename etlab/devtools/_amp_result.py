"""What auto_mixed_precision returns: the choices, the explanation, the program and its cost."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
from torch.fx import GraphModule

from etlab.devtools._amp_budget import AccuracyBudget
from etlab.devtools._amp_config import PrecisionConfig


@dataclass
class MixedPrecisionResult:
    """What `auto_mixed_precision` chose and why. `met`: the budget holds on etlab's runtime over the
    dataset (`metric`); `metric_torch`: the converted model's in torch; `float_layers`: layers kept in
    float (anchor node names); `config`: JSON-able choices; `steps` / `layers`: the explanation;
    `cost`: .pte bytes and median latency (ms) of this program, all-int8 and float on the runtime."""

    budget: AccuracyBudget
    backend: str
    met: bool
    metric: float
    metric_torch: float
    int8_metric: float
    float_layers: list[str]
    config: PrecisionConfig
    steps: pd.DataFrame
    layers: pd.DataFrame
    converted: GraphModule
    program: object  # ExecutorchProgramManager
    cost: dict = field(default_factory=dict)
    evaluations: int = 0
    _make_quantizer: Callable[[], object] | None = None

    def quantizer(self):
        """A fresh PT2E quantizer with the chosen configuration (its observers, not fixed ranges: it
        calibrates again on whatever data prepare_pt2e's model sees)."""
        return self._make_quantizer()

    def summary(self) -> str:
        """One paragraph: whether the budget was met on etlab's runtime, the metric against all-int8, and which
        layers stayed in float."""
        status = "met" if self.met else "NOT met"
        text = (f"budget {self.budget} {status} on etlab's {self.backend} runtime: {self.budget.name} "
                f"{self.metric:.4g} (all int8: {self.int8_metric:.4g}); {len(self.float_layers)} layer(s) in float")
        if self.float_layers:
            text += f" ({', '.join(self.float_layers)})"
        extras = [f"{len(self.config.int16)} value(s) with 16-bit activations" if self.config.int16 else "",
                  f"{len(self.config.per_channel)} layer(s) with per-channel weights" if self.config.per_channel
                  else ""]
        text += "".join(f"; {e}" for e in extras if e)
        c = self.cost
        if c.get("int8_pte_bytes"):
            text += (f"; .pte {c['pte_bytes'] / 1024:.1f} KB (int8 {c['int8_pte_bytes'] / 1024:.1f}, float "
                     f"{c['float_pte_bytes'] / 1024:.1f})")
        elif c.get("pte_bytes"):
            text += f"; .pte {c['pte_bytes'] / 1024:.1f} KB"
        if c.get("latency_ms"):
            text += (f"; latency {c['latency_ms']:.3f} ms (int8 {c['int8_latency_ms']:.3f}, float "
                     f"{c['float_latency_ms']:.3f})")
        return text

    def explain(self) -> str:
        """The summary, the search's steps and the per-layer choices as text."""
        with pd.option_context("display.max_colwidth", 80, "display.width", 200):
            return "\n\n".join([self.summary(), self.steps.to_string(index=False),
                                self.changed_layers().to_string(index=False)])

    def __repr__(self) -> str:
        return f"MixedPrecisionResult({self.summary()})"

    def _repr_html_(self) -> str:
        return (f"<p>{self.summary()}</p><h4>Search</h4>{self.steps.to_html(index=False)}"
                f"<h4>Layers not plain int8</h4>{self.changed_layers().to_html(index=False)}")

    def changed_layers(self) -> pd.DataFrame:
        """The rows of `layers` the search changed (float, 16-bit, per-channel weights, another observer)."""
        return self.layers[(self.layers["precision"] != "int8") | (self.layers["why"] != "")]
