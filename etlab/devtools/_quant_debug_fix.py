"""The fix loop of quantization debugging: keep the layers that introduced the most error in float,
re-quantize, re-measure, and tabulate accuracy against size.

Exclusion is per node, through the quantizer's own annotation step: the wrapped quantizer annotates
the graph as usual, then the annotations of the excluded nodes are dropped, so prepare_pt2e puts no
observer there and convert_pt2e leaves the op (and its weights) in float. This works with any
torchao PT2E quantizer (etlab's EtlabQuantizer, XNNPACKQuantizer, ...), and is finer than a module
name: a residual add excludes the add, not the whole block it sits in. A module path given instead of
a node name excludes every op traced inside that module, as a quantizer's module-name config does.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterable, Sequence

import pandas as pd
import torch
from torch.fx import GraphModule

from etlab.devtools._quant_debug import QuantReport, _as_inputs, float_graph_of, quantization_report
from etlab.facts.source import module_stack

ANNOTATION_KEY = "quantization_annotation"  # torchao.quantization.pt2e.quantizer's node.meta key


def excluding(quantizer, layers: Iterable[str]):
    """A quantizer that annotates like `quantizer` except on the nodes named in `layers`
    (float-graph node names, e.g. QuantReport.layers['layer']), which stay in float: no input,
    weight or output quantization, and their output enters consumers unquantized (the report
    charges a layer with the quantization of its output, so excluding it removes exactly that)."""
    from torchao.quantization.pt2e.quantizer import Quantizer

    names = frozenset(layers)

    class _Excluding(Quantizer):
        def transform_for_annotation(self, model):
            return quantizer.transform_for_annotation(model)

        def annotate(self, model):
            model = quantizer.annotate(model) or model
            for node in model.graph.nodes:
                if node.name in names:
                    node.meta.pop(ANNOTATION_KEY, None)
                    for user in node.users:  # its output is not quantized on the way into a consumer either
                        ann = user.meta.get(ANNOTATION_KEY)
                        if ann is not None and ann.input_qspec_map:
                            ann.input_qspec_map.pop(node, None)
            drop_dangling_shared_specs(model)
            return model

        def validate(self, model) -> None:
            quantizer.validate(model)

    return _Excluding()


def _specified(model) -> set:
    """The nodes (outputs) and (producer, consumer) edges (inputs) that carry a quantization spec."""
    have: set = set()
    for node in model.graph.nodes:
        ann = node.meta.get(ANNOTATION_KEY)
        if ann is None:
            continue
        if ann.output_qspec is not None:
            have.add(node)
        have.update((arg, node) for arg in (ann.input_qspec_map or {}))
    return have


def drop_dangling_shared_specs(model) -> None:
    """Removes specs that share the quantization parameters of an output or edge that is no
    longer quantized (a relu sharing its excluded conv's output), until none is left: prepare_pt2e
    fails on a spec whose source has no observer."""
    from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec

    changed = True
    while changed:
        changed = False
        have = _specified(model)
        for node in model.graph.nodes:
            ann = node.meta.get(ANNOTATION_KEY)
            if ann is None:
                continue
            if isinstance(ann.output_qspec, SharedQuantizationSpec) and ann.output_qspec.edge_or_node not in have:
                ann.output_qspec = None
                changed = True
            for arg, spec in list((ann.input_qspec_map or {}).items()):
                if isinstance(spec, SharedQuantizationSpec) and spec.edge_or_node not in have:
                    del ann.input_qspec_map[arg]
                    changed = True


def quantize_pt2e(float_gm: GraphModule, quantizer, calibration: Sequence[tuple]) -> GraphModule:
    """prepare_pt2e, one forward per calibration sample, convert_pt2e, on a copy of `float_gm`
    (prepare folds batch norm into the graph it is given)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with warnings.catch_warnings():  # torch's own pytree deprecation, raised inside deepcopy of a GraphModule
        warnings.simplefilter("ignore", FutureWarning)
        model = copy.deepcopy(float_gm)
    prepared = prepare_pt2e(model, quantizer)
    with torch.no_grad():
        for sample in calibration:
            prepared(*sample)
    return convert_pt2e(prepared)


def constant_bytes(gm: GraphModule) -> int:
    """Bytes of the tensors a graph reads as constants (get_attr: int8 weights, float weights,
    scales), each storage counted once: what its program's constant segment holds."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        obj = gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.Tensor):
            key = (obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += obj.untyped_storage().nbytes()
    return total


def requantize_excluding(float_model, inputs, quantizer, layers: Iterable[str], *,
                         calibration: Sequence | None = None) -> GraphModule:
    """Quantizes `float_model` with `quantizer` but keeps `layers` in float: float-graph node names
    (e.g. `report.worst(k)['layer']`) or module paths (every op inside); returns convert_pt2e's GraphModule.
    calibration: samples (tuples of inputs) for the observers; default: `inputs` alone."""
    args = _as_inputs(inputs)
    float_gm = float_graph_of(float_model, args)
    samples = [_as_inputs(s) for s in calibration] if calibration is not None else [args]
    return quantize_pt2e(float_gm, excluding(quantizer, layer_nodes(float_gm, layers)), samples)


def layer_nodes(float_gm: GraphModule, layers: Iterable[str]) -> list[str]:
    """Node names for `layers`: a node name stays itself, a module path (e.g. "features.2.conv")
    stands for every op traced inside that module, like a quantizer's module-name exclusion."""
    nodes = [n for n in float_gm.graph.nodes if n.op == "call_function"]
    names = {n.name for n in float_gm.graph.nodes}
    out: list[str] = []
    for layer in layers:
        if layer in names:
            out.append(layer)
            continue
        inside = [n.name for n in nodes if any(m == layer or m.startswith(layer + ".")
                                               for m, _ in module_stack(n.meta.get("nn_module_stack")))]
        if not inside:
            raise ValueError(f"requantize_excluding: {layer!r} is neither a node nor a module of the float "
                             "model's graph")
        out.extend(inside)
    return list(dict.fromkeys(out))



def sensitivity_table(float_model, inputs, quantizer_factory: Callable[[], object], *,
                      report: QuantReport | None = None, ks: Sequence[int] = (0, 1, 2, 4),
                      calibration: Sequence | None = None) -> pd.DataFrame:
    """The accuracy/size trade-off of keeping the worst k layers (by local error) in float, one row
    per k: the layers kept in float, output SQNR/cosine, the lowest layer SQNR left, and constant
    bytes against the float model's. `quantizer_factory()` makes a fresh quantizer per row (PT2E
    quantizers are stateful); `report`: the all-quantized report to rank from (computed when None)."""
    args = _as_inputs(inputs)
    float_gm = float_graph_of(float_model, args)
    samples = [_as_inputs(s) for s in calibration] if calibration is not None else [args]
    if report is None:
        report = quantization_report(float_gm, quantize_pt2e(float_gm, quantizer_factory(), samples), args)
    float_bytes = constant_bytes(float_gm)
    ranked = list(report.worst(len(report.layers))["layer"])
    rows = []
    for k in sorted(set(int(k) for k in ks)):
        if k < 0:
            raise ValueError(f"sensitivity_table: ks must be non-negative, got {k}")
        kept = ranked[:k]
        if k == 0 and report.quantized_graph is not None:
            quantized, r = report.quantized_graph, report
        else:
            quantized = quantize_pt2e(float_gm, excluding(quantizer_factory(), kept), samples)
            r = quantization_report(float_gm, quantized, args)
        nbytes = constant_bytes(quantized)
        out = r.output[0] if r.output else {"sqnr": math.nan, "cosine": math.nan}
        rows.append({"k": k, "kept_in_float": kept, "output_sqnr": out["sqnr"], "output_cosine": out["cosine"],
                     "worst_layer_sqnr": float(r.layers["sqnr"].min()) if len(r.layers) else math.nan,
                     "worst_local_sqnr": float(r.layers["local_sqnr"].min()) if len(r.layers) else math.nan,
                     "constant_bytes": nbytes, "float_bytes": float_bytes,
                     "size_vs_float": nbytes / float_bytes if float_bytes else math.nan})
    return pd.DataFrame(rows)
