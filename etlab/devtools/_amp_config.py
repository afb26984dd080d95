"""What `auto_mixed_precision` can change in a PT2E quantizer's annotations, and the quantizer that applies it.

The unit of choice is a *layer*: one quantized op as the quantizer annotated it, i.e. an anchor
(a node whose annotation reads quantized inputs: conv, linear, add, pool, ...) with the nodes
fused after it (batch norm folded by prepare_pt2e, relu) up to the one that carries the output
spec. Per layer the search may keep it in float (`excluding`), quantize its weights per tensor or
per channel, and give its output value 16-bit activations; per activation value (a layer's output,
or a model input a layer quantizes) it picks the observer. Every choice is made on the annotations
the user's quantizer wrote, after it wrote them, so it works for any torchao PT2E quantizer and
changes nothing else: values keep their qscheme, weights their dtype.

Layers and values are found on the graph the quantizer annotates (prepare_pt2e folds batch norm
first), by a probing prepare that records it: node names there are the exported graph's.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from etlab.compiler import ACTIVATION_DTYPES, activation_observer, weight_spec
from etlab.devtools._quant_debug import capture_values
from etlab.devtools._quant_debug_fix import ANNOTATION_KEY, excluding
from etlab.facts.fx import node_op_name
from etlab.facts.source import module_path


@dataclass(frozen=True)
class Layer:
    """One quantized op as the quantizer annotated it: `name` (its anchor node), `nodes` (anchor first,
    then the fused nodes), `output` (the node whose value is quantized on the way out, or None),
    `weight` (the weight node it quantizes, or None), `per_channel` (how the quantizer quantizes it)."""

    name: str
    nodes: tuple[str, ...]
    op: str
    module: str
    output: str | None
    weight: str | None
    per_channel: bool | None
    inputs: tuple[str, ...]  # activation values it reads quantized


@dataclass(frozen=True)
class Probe:
    """The graph the quantizer annotates (batch norm folded), its layers and quantized activation values."""

    graph: GraphModule
    layers: tuple[Layer, ...]
    values: tuple[str, ...]  # activation value node names with a (non-shared) quantization spec
    value_dtype: dict[str, torch.dtype] = field(default_factory=dict)


@dataclass(frozen=True)
class PrecisionConfig:
    """A point of the search: layers kept in float, layers whose weights are per tensor / per channel
    against the quantizer's choice, values with 16-bit activations, and per-value observers."""

    float_layers: frozenset[str] = frozenset()
    per_tensor: frozenset[str] = frozenset()
    per_channel: frozenset[str] = frozenset()
    int16: frozenset[str] = frozenset()  # value names
    observers: tuple[tuple[str, str], ...] = ()  # (value, observer name), sorted; absent: the quantizer's own

    def with_(self, **changes) -> PrecisionConfig:
        """A copy with some fields replaced (layer sets frozen, observers as sorted pairs), so configs stay hashable
        for the search's cache."""
        return dataclasses.replace(self, **{k: frozenset(v) if k != "observers" else tuple(sorted(v.items()))
                                            for k, v in changes.items()})

    @property
    def observer_of(self) -> dict[str, str]:
        """The per-layer observer choice as a dict (layer -> observer name)."""
        return dict(self.observers)

    def to_dict(self) -> dict:
        """JSON-able: what to give `configured_quantizer` again (node names of the exported float graph)."""
        return {"float_layers": sorted(self.float_layers), "per_tensor_weights": sorted(self.per_tensor),
                "per_channel_weights": sorted(self.per_channel), "int16_activations": sorted(self.int16),
                "observers": dict(self.observers)}


def _spec_classes():
    from torchao.quantization.pt2e.quantizer import QuantizationSpec, SharedQuantizationSpec

    return QuantizationSpec, SharedQuantizationSpec


def _annotation(node: Node):
    return node.meta.get(ANNOTATION_KEY)


def _is_activation(node: Node) -> bool:
    val = node.meta.get("val")
    return node.op not in ("get_attr",) and isinstance(val, torch.Tensor) and val.dtype.is_floating_point \
        and not _is_parameter(node)


def _is_parameter(node: Node) -> bool:
    return node.op == "get_attr"


def layers_of(model: GraphModule) -> tuple[tuple[Layer, ...], tuple[str, ...], dict[str, torch.dtype]]:
    """The layers and quantized activation values of an annotated graph (see the module docstring)."""
    QuantizationSpec, _Shared = _spec_classes()
    layers: list[Layer] = []
    current: list[Node] = []

    def close():
        if not current:
            return
        anchor = current[0]
        ann = _annotation(anchor)
        weight = per_channel = None
        inputs = []
        second = anchor.args[1] if len(anchor.args) > 1 else None
        for arg, spec in (ann.input_qspec_map or {}).items():
            if _is_parameter(arg) and isinstance(spec, QuantizationSpec) and (weight is None or arg is second):
                weight = arg.name
                per_channel = spec.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine)
            elif _is_activation(arg):
                inputs.append(arg.name)
        out = next((n.name for n in reversed(current) if _annotation(n) is not None
                    and _annotation(n).output_qspec is not None), None)
        layers.append(Layer(anchor.name, tuple(n.name for n in current), node_op_name(anchor),
                            module_path(anchor.meta.get("nn_module_stack")), out, weight, per_channel, tuple(inputs)))
        current.clear()

    for node in model.graph.nodes:
        ann = _annotation(node)
        if ann is None or not getattr(ann, "_annotated", True):
            continue
        if ann.input_qspec_map:
            close()
            current.append(node)
        elif current and current[-1] in node.all_input_nodes and _annotation(current[-1]).output_qspec is None:
            current.append(node)  # fused after the anchor (its chain carries the output spec at its end)
        else:
            close()
    close()
    values: dict[str, torch.dtype] = {}
    for node in model.graph.nodes:
        ann = _annotation(node)
        if ann is not None and isinstance(ann.output_qspec, QuantizationSpec) and not ann.output_qspec.is_dynamic:
            values[node.name] = ann.output_qspec.dtype
        for arg, spec in ((ann.input_qspec_map or {}).items() if ann is not None else ()):
            if _is_activation(arg) and isinstance(spec, QuantizationSpec) and not spec.is_dynamic:
                values.setdefault(arg.name, spec.dtype)
    return tuple(layers), tuple(values), values


def probe(float_gm: GraphModule, quantizer) -> Probe:
    """Runs prepare_pt2e's annotation on a copy of `float_gm` and records the graph it annotated."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    from torchao.quantization.pt2e.quantizer import Quantizer

    seen: dict = {}

    class _Recording(Quantizer):
        def transform_for_annotation(self, model):
            return quantizer.transform_for_annotation(model)

        def annotate(self, model):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                seen["graph"] = copy.deepcopy(model)
            model = quantizer.annotate(model) or model
            seen["layers"] = layers_of(model)
            return model

        def validate(self, model) -> None:
            quantizer.validate(model)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        prepare_pt2e(copy.deepcopy(float_gm), _Recording())
    layers, values, dtypes = seen["layers"]
    if not layers:
        raise ValueError("auto_mixed_precision: the quantizer annotated no layer of this model; nothing to choose")
    return Probe(seen["graph"], layers, values, dtypes)


def _range_observer():
    """An observer that reports a range fixed in advance (what the chosen observer computed on the
    calibration data), so that each configuration the search tries needs no histogram search again."""
    from torchao.quantization.pt2e import MinMaxObserver

    class FixedRangeObserver(MinMaxObserver):
        def __init__(self, *args, lo: float = 0.0, hi: float = 0.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.min_val, self.max_val = torch.tensor(float(lo)), torch.tensor(float(hi))

        def forward(self, x):
            return x

    return FixedRangeObserver


_EPS_16 = float(torch.finfo(torch.float32).eps)  # 2**-12 (etlab's int8 floor, XNNPACK's) would waste 16-bit grids


def value_spec(old, observer: str | None, bits: int | None, value_range: tuple[float, float] | None = None):
    """`old` (a per-tensor activation spec) with another observer, bit width, or a fixed range."""
    changes: dict = {}
    if bits is not None:
        dtype, qmin, qmax = ACTIVATION_DTYPES[bits]
        changes.update(dtype=dtype, quant_min=qmin, quant_max=qmax)
    eps = {"eps": _EPS_16} if bits == 16 else {}
    if value_range is not None:
        changes["observer_or_fake_quant_ctr"] = _range_observer().with_args(lo=value_range[0], hi=value_range[1],
                                                                            **(eps or {"eps": 2.0**-12}))
    elif observer is not None:
        changes["observer_or_fake_quant_ctr"] = activation_observer(observer, **eps)
    return dataclasses.replace(old, **changes)


def _apply_value(model: GraphModule, nodes: dict[str, Node], name: str, make: Callable):
    """Gives value `name` a new spec (`make(old)`), the same object on its output and on every consumer
    edge that quantized it with its own spec, so prepare_pt2e still puts one observer there."""
    QuantizationSpec, _ = _spec_classes()
    node = nodes.get(name)
    if node is None:
        return
    new = None
    ann = _annotation(node)
    if ann is not None and isinstance(ann.output_qspec, QuantizationSpec):
        new = make(ann.output_qspec)
        ann.output_qspec = new
    for user in node.users:
        a = _annotation(user)
        spec = (a.input_qspec_map or {}).get(node) if a is not None else None
        if isinstance(spec, QuantizationSpec):
            new = new or make(spec)
            a.input_qspec_map[node] = new


def configured_quantizer(quantizer, config: PrecisionConfig, layers: Sequence[Layer],
                         ranges: dict[str, dict[str, tuple[float, float]]] | None = None):
    """A PT2E quantizer that annotates like `quantizer`, then applies `config` (layers by anchor name).
    ranges: value -> observer name -> the range that observer computed on the calibration data
    (`choose_observers`); given, values whose observer or width changes use that fixed range instead of
    observing again (same qparams, without re-running a histogram search per configuration)."""
    from torchao.quantization.pt2e.quantizer import Quantizer

    by_name = {layer.name: layer for layer in layers}
    unknown = (config.float_layers | config.per_tensor | config.per_channel) - set(by_name)
    if unknown:
        raise ValueError(f"configured_quantizer: no layer named {', '.join(sorted(unknown))} "
                         f"(layers: {', '.join(sorted(by_name)[:10])}...)")
    excluded = [n for name in sorted(config.float_layers) for n in by_name[name].nodes]
    inner = excluding(quantizer, excluded) if excluded else quantizer

    class _Configured(Quantizer):
        def transform_for_annotation(self, model):
            return inner.transform_for_annotation(model)

        def annotate(self, model):
            model = inner.annotate(model) or model
            nodes = {n.name: n for n in model.graph.nodes}
            observers = config.observer_of
            for name in sorted(set(observers) | config.int16):
                bits = 16 if name in config.int16 else None
                # a 16-bit grid makes clipping pointless: min-max then keeps the whole range
                observer = "minmax" if bits else observers.get(name)
                fixed = (ranges or {}).get(name, {}).get(observer)
                _apply_value(model, nodes, name, lambda old, o=observer, b=bits, r=fixed: value_spec(old, o, b, r))
            weights = [*((n, False) for n in config.per_tensor), *((n, True) for n in config.per_channel)]
            for name, per_channel in weights:
                layer = by_name[name]
                anchor, weight = nodes.get(layer.name), nodes.get(layer.weight or "")
                ann = _annotation(anchor) if anchor is not None else None
                if ann is not None and weight is not None and weight in (ann.input_qspec_map or {}):
                    ann.input_qspec_map[weight] = weight_spec(per_channel)
            return model

        def validate(self, model) -> None:
            inner.validate(model)

    return _Configured()


# --- observers chosen from the data ----------------------------------------------------------------


def _fake_quant(x: torch.Tensor, scale: float, zero_point: int, qmin: int, qmax: int) -> torch.Tensor:
    return (torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, qmin, qmax) - zero_point) * scale


def choose_observers(probe_: Probe, samples: Sequence[tuple], names: Sequence[str],
                     progress: Callable[[str], None] | None = None) -> tuple[dict, dict, dict]:
    """Per activation value, the observer (of `names`) whose calibrated int8 grid gives the lowest
    mean squared error on that value over `samples`: two passes over the float graph, the first
    calibrating every candidate observer, the second measuring each candidate's error. Returns
    (value -> observer, value -> {observer: mse}, value -> {observer: (min, max)}); the min-max range
    is also what a 16-bit grid of the value uses."""
    dtype, qmin, qmax = ACTIVATION_DTYPES[8]
    observers = {v: {n: activation_observer(n)(dtype=dtype, qscheme=torch.per_tensor_affine, quant_min=qmin,
                                               quant_max=qmax) for n in names} for v in probe_.values}
    for i, sample in enumerate(samples):
        values = capture_values(probe_.graph, sample)
        for v, obs in observers.items():
            x = values.get(v)
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                for o in obs.values():
                    o(x.detach())
        if progress is not None:
            progress(f"observers: calibrated on sample {i + 1}/{len(samples)}")
    ranges: dict[str, dict[str, tuple[float, float]]] = {}
    for v, obs in observers.items():
        ranges[v] = {}
        for n, o in obs.items():
            r = observed_range(o)
            if r is not None:
                ranges[v][n] = r
    errors: dict[str, dict[str, float]] = {v: {n: 0.0 for n in r} for v, r in ranges.items()}
    grids = {v: {n: _grid(o, ranges[v][n]) for n, o in obs.items() if n in ranges[v]} for v, obs in observers.items()}
    for sample in samples:
        values = capture_values(probe_.graph, sample)
        for v, g in grids.items():
            x = values.get(v)
            if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
                continue
            x = x.detach().float()
            for n, (scale, zp) in g.items():
                errors[v][n] += float((x - _fake_quant(x, scale, zp, qmin, qmax)).pow(2).mean())
    chosen = {}
    for v, e in errors.items():
        if e:
            chosen[v] = min(e, key=lambda n: (e[n], list(names).index(n)))  # ties: the first (min-max) name
    mse = {v: {n: e / max(len(samples), 1) for n, e in errs.items()} for v, errs in errors.items()}
    return chosen, mse, ranges


def observed_range(observer) -> tuple[float, float] | None:
    """The (min, max) an observer's qparams come from: the histogram observer's searched range, the
    others' running min/max; None when it saw nothing."""
    try:
        if hasattr(observer, "_non_linear_param_search") and float(observer.histogram.sum()) > 0:
            lo, hi = observer._non_linear_param_search()
        else:
            lo, hi = observer.min_val, observer.max_val
        lo, hi = float(lo), float(hi)
    except (RuntimeError, AttributeError, TypeError, ValueError):
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        return None
    return lo, hi


def _grid(observer, value_range: tuple[float, float]) -> tuple[float, int]:
    scale, zp = observer._calculate_qparams(torch.tensor(value_range[0]), torch.tensor(value_range[1]))
    return float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])


def layer_of_node(layers: Sequence[Layer]) -> dict[str, str]:
    """node name -> the anchor name of the layer it belongs to."""
    return {n: layer.name for layer in layers for n in layer.nodes}


def finite(x: float) -> float:
    """The value with infinities replaced by +-1e9, for sorting and arithmetic that must not see inf."""
    return x if math.isfinite(x) else (1e9 if x > 0 else -1e9)
