"""The report of quantization debugging over a dataset (`DatasetQuantReport`): what the streaming pass of
`_quant_dataset` leaves, as dataframes, with the rankings and summaries a user reads it through."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from torch.fx import GraphModule

from etlab.devtools._quant_dataset_stats import Stream

P95 = 0.05  # "p95 SQNR": the SQNR 95% of the inputs reach, i.e. the 5th percentile (low SQNR is bad)

LAYER_COLUMNS = [
    "order", "layer", "op", "module", "source", "quantized", "ranked", "inputs", "degenerate_inputs",
    "local_sqnr_p95", "local_sqnr_mean", "local_sqnr_min", "local_worst_input",
    "sqnr_p95", "sqnr_mean", "sqnr_min", "sqnr_worst_input", "input_sqnr_p95", "input_sqnr_mean",
    "cosine_mean", "cosine_min", "max_abs_p95", "max_abs_max", "max_abs_worst_input",
    "range_lo", "range_hi", "seen_min", "seen_max", "clipped", "clipped_inputs",
    "first_clipped_input", "range_used", "folded", "quantized_node",
]
COVERAGE_COLUMNS = ["node", "layer", "scale", "zero_point", "range_lo", "range_hi", "seen_min", "seen_max",
                    "range_used", "clipped", "clipped_inputs", "first_clipped_input"]


# --- the report -----------------------------------------------------------------------------------------


@dataclass
class DatasetQuantReport:
    """Quantization error over a dataset (see the module doc).

    `layers`: one row per joined layer (LAYER_COLUMNS): `local_sqnr_*` the error a layer introduced (its float
    op on the quantized inputs), `sqnr_*` the error accumulated up to it, `input_sqnr_*` the error it
    inherited; `*_p95` is the SQNR 95% of the inputs reach (the 5th percentile: the bad tail), `*_min` the
    worst input (`*_worst_input` its index); `range_lo/hi` the range its output quantizer can hold,
    `seen_min/max` the range that reached it, `clipped` the share of elements beyond it, `clipped_inputs`
    the share of inputs with any. `per_input`: one row per input (output SQNR/cosine, `top1_agree` with the
    float model, `program_vs_torch`, the user's metrics). `coverage`: every calibrated quantize node.
    `distributions[layer]`: the streams behind the percentiles (histograms for the views).
    """

    layers: pd.DataFrame
    per_input: pd.DataFrame
    coverage: pd.DataFrame
    distributions: dict[str, dict[str, Stream]]
    backend: str | None
    batch_size: int
    seconds: float
    float_graph: GraphModule | None = None
    quantized_graph: GraphModule | None = None
    label: str = ""
    notes: list[str] = field(default_factory=list)
    shipped: str = ""  # the program run on etlab's runtime ("the xnnpack program", a .pte path); "": none
    output_sqnr_pooled: float = math.nan  # the dataset's SQNR: all outputs' signal over all their noise (dB)

    @property
    def inputs(self) -> int:
        """How many dataset inputs the report covers."""
        return len(self.per_input)

    def worst(self, k: int = 5, by: str = "local_sqnr_p95") -> pd.DataFrame:
        """The k ranked layers (quantization changed their output meaningfully) with the lowest `by`: a
        local_sqnr_* column (what a layer introduced; default its p95 over the inputs) or an sqnr_* one."""
        allowed = [c for c in LAYER_COLUMNS if c.startswith(("local_sqnr_", "sqnr_")) and "worst" not in c]
        if by not in allowed:
            raise ValueError(f"worst: rank by one of {allowed}, got {by!r}")
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"worst: k must be a non-negative int, got {k!r}")
        ranked = self.layers[self.layers["ranked"].astype(bool)]
        return ranked.sort_values([by, "local_sqnr_mean"], na_position="last", kind="stable").head(k)

    @property
    def output(self) -> dict[str, float]:
        """The dataset's output metrics: top-1 agreement (share of inputs, averaged), output SQNR mean / p95
        (the 5th percentile), cosine mean / min, the program's largest distance to the converted graph, and
        the mean of each user metric."""
        p = self.per_input
        out = {"inputs": float(len(p)), "top1_agreement": _nanmean(p["top1_agree"]),
               "output_sqnr_mean": _nanmean(p["output_sqnr"][np.isfinite(p["output_sqnr"])]),
               "output_sqnr_p95": float(np.nanquantile(p["output_sqnr"], P95)) if len(p) else math.nan,
               "output_sqnr_pooled": self.output_sqnr_pooled,
               "output_cosine_mean": _nanmean(p["output_cosine"]),
               "output_cosine_min": float(p["output_cosine"].min()) if len(p) else math.nan,
               "program_vs_torch_max": float(p["program_vs_torch"].max()) if len(p) else math.nan}
        for name in p.columns[len(PER_INPUT_COLUMNS):]:
            out[name] = _nanmean(p[name])
        return out

    def clipped(self) -> pd.DataFrame:
        """Calibrated quantizers that clipped on some input, the most-clipped inputs first."""
        c = self.coverage
        return c[c["clipped_inputs"] > 0].sort_values(["clipped_inputs", "clipped"], ascending=False)

    def summary(self) -> str:
        """One paragraph: how many inputs through which program, top-1 agreement and output SQNR, and the worst
        layers."""
        o = self.output
        where = f"{self.shipped} on etlab's runtime" if self.shipped else "the converted graph in torch"
        text = f"{self.inputs} inputs through {where}: "
        if not math.isnan(o["top1_agreement"]):
            text += f"top-1 agreement {100 * o['top1_agreement']:.2f}%, "
        text += (f"output SQNR mean {o['output_sqnr_mean']:.2f} dB (p95 {o['output_sqnr_p95']:.2f}), cosine mean "
                 f"{o['output_cosine_mean']:.5f} (min {o['output_cosine_min']:.5f})")
        worst = self.worst(1)
        if len(worst):
            r = worst.iloc[0]
            text += (f"; most error introduced by {r['layer']} ({r['op']}{', ' + r['module'] if r['module'] else ''}):"
                     f" local SQNR p95 {r['local_sqnr_p95']:.2f} dB, mean {r['local_sqnr_mean']:.2f} dB")
        clipped = self.clipped()
        if len(clipped):
            r = clipped.iloc[0]
            text += (f"; {len(clipped)} of {len(self.coverage)} calibrated ranges clipped on some input (most: "
                     f"{r['layer'] or r['node']} on {100 * r['clipped_inputs']:.1f}% of inputs)")
        return text

    def __repr__(self) -> str:
        return f"DatasetQuantReport({self.label + ': ' if self.label else ''}{self.summary()})"

    def to_dataframe(self) -> pd.DataFrame:
        """The per-layer table (a copy)."""
        return self.layers.copy()

    def _repr_html_(self):
        from etlab.facts import display

        return display.html(self) or f"<pre>{self.summary()}</pre>"

    def show(self, **kwargs):
        """The DatasetQuantizationView of this report (etlab.visualizer)."""
        from etlab.facts import display

        return display.show(self, **kwargs)


PER_INPUT_COLUMNS = ["input", "output_sqnr", "output_cosine", "top1_agree", "program_vs_torch"]


def _pooled_sqnr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _nanmean(values) -> float:
    a = np.asarray(values, dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.mean()) if a.size else math.nan
