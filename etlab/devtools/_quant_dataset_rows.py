"""What each batch of a report over a dataset adds: per layer its numbers committed to streaming statistics
(`LayerStats`), per input the output metrics of the shipped program (`output_rows`), and at the end one table
row per layer (`layer_row`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from etlab.devtools._quant_dataset_engine import LayerBatch, as_float
from etlab.devtools._quant_dataset_plan import _Plan
from etlab.devtools._quant_dataset_report import P95
from etlab.devtools._quant_dataset_stats import Stream, batch_metrics, max_abs_stream, sqnr_stream
from etlab.devtools._quant_debug import LayerJoin
from etlab.facts.fx import node_op_name
from etlab.facts.source import module_path, source_line


@dataclass
class LayerStats:
    """One layer's statistics over the inputs seen so far (streams: memory does not grow with the dataset)."""

    join: LayerJoin
    sqnr: Stream = field(default_factory=sqnr_stream)
    local: Stream = field(default_factory=sqnr_stream)
    inherited: Stream = field(default_factory=sqnr_stream)
    max_abs: Stream = field(default_factory=max_abs_stream)
    cosine_total: float = 0.0
    cosine_n: int = 0
    cosine_min: float = math.inf
    inputs: int = 0
    degenerate: int = 0
    exact: int = 0


def commit_layer(acc: LayerStats, m: LayerBatch, first: int, batch: int) -> None:
    """Adds one batch's numbers of a layer (its inputs are `first`.. in the dataset); degenerate inputs (see
    BatchRun.layer) count but add no SQNR."""
    rows, ok, total, local = np.arange(first, first + batch), m.ok, m.total, m.local
    acc.inputs += batch
    acc.degenerate += int((~ok).sum())
    acc.exact += int(((local if local is not None else total)["sqnr"] == math.inf).sum())
    acc.sqnr.add(total["sqnr"][ok], rows[ok])
    acc.max_abs.add(total["max_abs"], rows)
    if local is not None:
        acc.local.add(local["sqnr"][ok], rows[ok])
    if m.inherited is not None:
        acc.inherited.add(m.inherited[ok], rows[ok])
    cos = total["cosine"][~np.isnan(total["cosine"])]
    acc.cosine_total += float(cos.sum())
    acc.cosine_n += cos.size
    acc.cosine_min = min(acc.cosine_min, float(cos.min()) if cos.size else math.inf)


def top1_agreement(reference: torch.Tensor, value: torch.Tensor, batch: int) -> np.ndarray:
    """Per input (dim 0), the share of positions whose arg-max over the last dimension agrees (a classifier's
    top-1; a sequence model's per token); NaN for outputs with fewer than 2 classes."""
    if reference.dim() < (2 if batch > 1 else 1) or reference.shape[-1] < 2:
        return np.full(batch, math.nan)
    same = (reference.argmax(-1) == value.argmax(-1)).reshape(batch, -1).to(torch.float64)
    return same.mean(1).numpy()


def metric_functions(metrics) -> dict[str, Callable]:
    if metrics is None:
        return {}
    if callable(metrics):
        return {getattr(metrics, "__name__", "metric") or "metric": metrics}
    if isinstance(metrics, Mapping) and all(isinstance(k, str) and callable(v) for k, v in metrics.items()):
        return dict(metrics)
    raise TypeError("metrics must be a callable (float_outputs, quantized_outputs) -> float, or a dict of them "
                    f"by name; got {type(metrics).__name__}")


def output_rows(f_out: list, q_out: list, p_out: list[list] | None, first: int, batch: int,
                 metrics: dict[str, Callable]) -> list[dict]:
    """Per input: output SQNR/cosine (worst over the outputs), top-1 agreement with the float model, the
    shipped program's distance to the converted graph, and the user's metrics; all on the shipped program's
    outputs when there is one (`p_out`, one list per input), else on the converted graph's."""
    def row(outs: list, i: int) -> list:  # input i's outputs, as the model returns them for one input
        return outs if batch == 1 else [o[i:i + 1] if isinstance(o, torch.Tensor) else o for o in outs]

    shipped = q_out if p_out is None else p_out[0] if batch == 1 else [
        torch.cat([r[k] for r in p_out]) if isinstance(p_out[0][k], torch.Tensor) else p_out[0][k]
        for k in range(len(p_out[0]))]
    sqnr, cosine, top1, vs_torch, energy = [], [], [], [], np.zeros((2, batch))
    for k, (ref, val) in enumerate(zip(f_out, shipped)):
        if as_float(ref) is None or as_float(val) is None or ref.shape != val.shape:
            continue
        m = batch_metrics(ref, val, batch)
        sqnr.append(m["sqnr"])
        energy += np.nan_to_num(np.stack([m["signal"], m["noise"]]), nan=0.0, posinf=np.inf)
        cosine.append(m["cosine"])
        top1.append(top1_agreement(ref, val, batch))
        if p_out is not None and as_float(q_out[k]) is not None and q_out[k].shape == val.shape:
            vs_torch.append((val.double() - q_out[k].double()).abs().reshape(batch, -1).amax(1).numpy())
    rows = []
    for i in range(batch):
        t1 = [t[i] for t in top1 if not math.isnan(t[i])]
        out = {"input": first + i, "output_sqnr": min((s[i] for s in sqnr), default=math.nan),
               "output_cosine": min((c[i] for c in cosine), default=math.nan),
               "top1_agree": float(np.mean(t1)) if t1 else math.nan,
               "program_vs_torch": max((v[i] for v in vs_torch), default=math.nan),
               "_energy": energy[:, i]}
        if metrics:
            ref_i, val_i = row(f_out, i), p_out[i] if p_out is not None else row(q_out, i)
            for name, fn in metrics.items():
                out[name] = float(fn(ref_i, val_i))
        rows.append(out)
    return rows


def layer_row(order: int, acc: LayerStats, plan: _Plan) -> dict:
    j = acc.join
    first = j.chain[0]
    exact = acc.exact == acc.inputs
    qname = plan.quantizer_of.get(first.name)
    cov = plan.quantizers[qname].row() if qname else {}
    return {
        "order": order, "layer": first.name, "op": node_op_name(first),
        "module": module_path(first.meta.get("nn_module_stack")), "source": source_line(first.meta.get("stack_trace")),
        "quantized": j.quantized, "ranked": j.quantized and not exact and acc.degenerate < acc.inputs,
        "inputs": acc.inputs, "degenerate_inputs": acc.degenerate,
        "local_sqnr_p95": acc.local.quantile(P95), "local_sqnr_mean": acc.local.mean, "local_sqnr_min": acc.local.low,
        "local_worst_input": acc.local.low_input,
        "sqnr_p95": acc.sqnr.quantile(P95), "sqnr_mean": acc.sqnr.mean, "sqnr_min": acc.sqnr.low,
        "sqnr_worst_input": acc.sqnr.low_input,
        "input_sqnr_p95": acc.inherited.quantile(P95), "input_sqnr_mean": acc.inherited.mean,
        "cosine_mean": acc.cosine_total / acc.cosine_n if acc.cosine_n else math.nan,
        "cosine_min": acc.cosine_min if acc.cosine_n else math.nan,
        "max_abs_p95": acc.max_abs.quantile(0.95), "max_abs_max": acc.max_abs.high,
        "max_abs_worst_input": acc.max_abs.high_input,
        **{k: cov.get(k, math.nan) for k in ("range_lo", "range_hi", "seen_min", "seen_max", "clipped",
                                             "clipped_inputs", "range_used")},
        "first_clipped_input": cov.get("first_clipped_input", -1),
        "folded": [n.name for n in j.chain[1:]], "quantized_node": j.qnode.name,
    }
