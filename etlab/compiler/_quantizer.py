"""`EtlabQuantizer`: PT2E int8 quantization for etlab's portable kernels, on torchao's `Quantizer` API.

Used exactly as upstream's XNNPACKQuantizer is:

    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e
    gm = torch.export.export(model, inputs).module()
    prepared = prepare_pt2e(gm, EtlabQuantizer())          # observers inserted
    prepared(*calibration_inputs)                            # calibrate
    converted = convert_pt2e(prepared)                       # quantized_decomposed q/dq ops, int8 weights
    et = to_edge(torch.export.export(converted, inputs)).to_executorch()

The default configuration is int8 symmetric per-channel weights and int8 per-tensor affine
activations for conv, linear, matmul/bmm, add, mul (with their relu/hardtanh fusions: conv-bn-relu,
linear-relu, add-relu), pooling and cat (pooling and cat share their input's qparams, so they
need no requantization). `EtlabQuantizer(dynamic_int8_config())` is the second mode: linear only,
activations quantized with qparams chosen at run time (`choose_qparams`), weights per channel.

Configuration resolves per node, most specific first: `set_module_name` (the longest matching
name), `set_module_type`, `set_operator_type`, then the global config; `None` at any level keeps
the matching nodes in float (the exclusion list).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import (
    HistogramObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationConfig,
    QuantizationSpec,
    Quantizer,
)

from etlab.compiler._quantizer_patterns import ANNOTATORS, anchor_kind, is_annotated

_EPS = 2.0**-12  # smallest scale an observer may pick (upstream's XNNPACK configs use the same)
_UNSET = object()


def int8_static_config(*, per_channel: bool = True, activation_observer: Callable = MinMaxObserver
                       ) -> QuantizationConfig:
    """int8 per-tensor affine activations (calibrated with `activation_observer`) and int8
    symmetric weights ([-127, 127], so the range is symmetric around zero), per output channel by
    default; bias stays float (the runtime computes the op in float between dequantize and quantize)."""
    act = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
                           observer_or_fake_quant_ctr=activation_observer.with_args(eps=_EPS))
    return QuantizationConfig(act, act, _weight_spec(per_channel), None)


class PercentileObserver(MinMaxObserver):
    """Min-max calibration on each batch's `percentile` and `100 - percentile` instead of its extremes,
    averaged over the batches: a few outliers (a rare spike in one channel) no longer stretch the int8
    grid for everything else; they saturate instead. Quantile estimates use at most 2**18 evenly
    strided elements per batch (torch.quantile's input limit is 2**24, and the tail of a strided
    subsample is close enough for a clipping range). convert_pt2e reads min_val/max_val as from
    MinMaxObserver, so programs need nothing new at run time."""

    _MAX_SAMPLE = 2**18

    def __init__(self, *args, percentile: float = 99.99, **kwargs):
        super().__init__(*args, **kwargs)
        if not 50.0 < float(percentile) <= 100.0:
            raise ValueError(f"PercentileObserver: percentile must be in (50, 100], got {percentile!r}")
        self.percentile = float(percentile)
        self.register_buffer("batches", torch.tensor(0, dtype=torch.int64))

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Records one calibration batch (non-finite values ignored, large tensors subsampled) and returns it unchanged,
        so the observer sits transparently in the prepared model."""
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach().to(self.min_val.dtype if self.min_val.numel() else torch.float32).reshape(-1)
        x = x[torch.isfinite(x)]
        if x.numel() == 0:
            return x_orig
        if x.numel() > self._MAX_SAMPLE:
            x = x[:: -(-x.numel() // self._MAX_SAMPLE)]
        q = torch.tensor([1.0 - self.percentile / 100.0, self.percentile / 100.0], dtype=x.dtype)
        lo, hi = torch.quantile(x, q)
        n = int(self.batches)
        if n == 0:
            self.min_val, self.max_val = lo.reshape(()), hi.reshape(())
        else:  # running mean of the batches' percentiles
            self.min_val = (self.min_val * n + lo) / (n + 1)
            self.max_val = (self.max_val * n + hi) / (n + 1)
        self.batches += 1
        return x_orig


# name -> (observer class, its arguments) for a per-tensor activation: what auto_mixed_precision chooses
# from per value. Two percentiles: 99.99 keeps all but the rarest spikes, 99.9 also clips an outlier that
# shows up in a few rows of a batch (a channel that fires rarely and far above the rest).
ACTIVATION_OBSERVERS: dict[str, tuple[type, dict]] = {
    "minmax": (MinMaxObserver, {}), "histogram": (HistogramObserver, {}),
    "percentile": (PercentileObserver, {"percentile": 99.99}),
    "percentile_99.9": (PercentileObserver, {"percentile": 99.9}),
}
# integer activation dtypes by bit width: (dtype, quant_min, quant_max)
ACTIVATION_DTYPES: dict[int, tuple[torch.dtype, int, int]] = {8: (torch.int8, -128, 127),
                                                               16: (torch.int16, -(2**15), 2**15 - 1)}


def activation_observer(name: str, *, eps: float = _EPS) -> Callable:
    """The observer constructor for ACTIVATION_OBSERVERS[name]; eps: the smallest scale it may pick
    (etlab's int8 default 2**-12, as upstream's XNNPACK configs; a 16-bit grid wants a smaller one)."""
    if name not in ACTIVATION_OBSERVERS:
        raise ValueError(f"activation observer must be one of {', '.join(ACTIVATION_OBSERVERS)}, got {name!r}")
    cls, kwargs = ACTIVATION_OBSERVERS[name]
    return cls.with_args(eps=eps, **kwargs)


def weight_spec(per_channel: bool) -> QuantizationSpec:
    """int8 symmetric weights ([-127, 127]), per output channel (axis 0) or per tensor."""
    return _weight_spec(per_channel)


def int8_dynamic_config(*, per_channel: bool = True) -> QuantizationConfig:
    """Dynamic quantization: the input's qparams are computed from each run's input
    (`choose_qparams` in the program), weights are int8 symmetric; outputs stay float."""
    act = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
                           is_dynamic=True, observer_or_fake_quant_ctr=PlaceholderObserver.with_args(eps=_EPS))
    return QuantizationConfig(act, None, _weight_spec(per_channel), None)


def _weight_spec(per_channel: bool) -> QuantizationSpec:
    if per_channel:
        return QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_channel_symmetric,
                                ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=_EPS))
    return QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_tensor_symmetric,
                            observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=_EPS))


def is_dynamic(config: QuantizationConfig) -> bool:
    """Whether the config quantizes activations at run time (dynamic quantization): such ops need no calibration and
    keep float activations between ops."""
    return config.input_activation is not None and config.input_activation.is_dynamic


def _module_names(node: Node) -> list[str]:
    """Fully qualified names of the modules `node` was traced in (outermost first)."""
    stack = node.meta.get("nn_module_stack") or {}
    names = []
    for value in stack.values():
        name = value[0] if isinstance(value, tuple) else str(value)
        names.append(name[len("L['self']."):] if name.startswith("L['self'].") else name)
    return names


def _module_types(node: Node) -> list[Any]:
    stack = node.meta.get("nn_module_stack") or {}
    return [value[1] for value in stack.values() if isinstance(value, tuple) and len(value) > 1]


def _type_matches(recorded: Any, wanted: type) -> bool:
    """nn_module_stack records a class or its qualified name, depending on how the graph was made."""
    if isinstance(recorded, type):
        return recorded is wanted
    return str(recorded) in (wanted.__qualname__, f"{wanted.__module__}.{wanted.__qualname__}")


class EtlabQuantizer(Quantizer):
    """int8 PT2E quantizer for etlab (see the module docstring); the setters return self, so they chain:

        EtlabQuantizer().set_module_name("features.0", None).set_operator_type(torch.ops.aten.mul.Tensor, None)
    """

    def __init__(self, config: QuantizationConfig | None = None):
        super().__init__()
        self.global_config: QuantizationConfig | None = int8_static_config() if config is None else config
        self.module_name_config: dict[str, QuantizationConfig | None] = {}
        self.module_type_config: dict[type, QuantizationConfig | None] = {}
        self.operator_type_config: dict[Any, QuantizationConfig | None] = {}

    # -- configuration ---------------------------------------------------------------------------------------
    def set_global(self, config: QuantizationConfig | None) -> EtlabQuantizer:
        """The config for every node nothing more specific names (None: nothing is quantized by default)."""
        self.global_config = config
        return self

    def set_module_name(self, module_name: str, config: QuantizationConfig | None) -> EtlabQuantizer:
        """Nodes traced inside the submodule `module_name` ("features.3.conv") use `config`; None keeps them float."""
        if not isinstance(module_name, str):
            raise TypeError(f"set_module_name: module_name must be a str, got {type(module_name).__name__}")
        self.module_name_config[module_name] = config
        return self

    def set_module_type(self, module_type: type, config: QuantizationConfig | None) -> EtlabQuantizer:
        """Nodes traced inside any module of class `module_type` use `config`; None keeps them float."""
        if not isinstance(module_type, type):
            raise TypeError(f"set_module_type: module_type must be a class, got {module_type!r}")
        self.module_type_config[module_type] = config
        return self

    def set_operator_type(self, operator: Any, config: QuantizationConfig | None) -> EtlabQuantizer:
        """Nodes whose anchor operator is `operator` (an OpOverload such as torch.ops.aten.linear.default,
        or its packet torch.ops.aten.linear) use `config`; None keeps them float."""
        if not isinstance(operator, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise TypeError(f"set_operator_type: expected a torch.ops.aten operator, got {operator!r}")
        self.operator_type_config[operator] = config
        return self

    def config_for(self, node: Node) -> QuantizationConfig | None:
        """The config that applies to anchor `node`: module name, module type, operator type, global."""
        names = _module_names(node)
        best = _UNSET
        best_len = -1
        for name, config in self.module_name_config.items():
            if len(name) > best_len and any(n == name or n.startswith(name + ".") for n in names):
                best, best_len = config, len(name)
        if best is not _UNSET:
            return best
        types = _module_types(node)
        for recorded in reversed(types):  # innermost module first
            for wanted, config in self.module_type_config.items():
                if _type_matches(recorded, wanted):
                    return config
        target = node.target
        for key in (target, getattr(target, "overloadpacket", None)):
            if key is not None and key in self.operator_type_config:
                return self.operator_type_config[key]
        return self.global_config

    # -- the Quantizer API ------------------------------------------------------------------------------------
    def annotate(self, model: GraphModule) -> GraphModule:
        """Annotates each anchor op (and its fused activation) with the qspecs of its config."""
        for node in list(model.graph.nodes):
            if node.op != "call_function" or is_annotated(node):
                continue
            kind = anchor_kind(node)
            if kind is None:
                continue
            config = self.config_for(node)
            if config is None:
                continue
            if is_dynamic(config) and kind != "linear":
                continue  # dynamic mode quantizes linear only
            ANNOTATORS[kind](node, config)
        return model

    def validate(self, model: GraphModule) -> None:
        """Every annotation names input edges of its own node (what prepare_pt2e relies on)."""
        for node in model.graph.nodes:
            annotation: QuantizationAnnotation | None = node.meta.get("quantization_annotation")
            if annotation is None:
                continue
            for source in annotation.input_qspec_map:
                if source not in node.all_input_nodes:
                    raise ValueError(f"EtlabQuantizer: node {node.name} is annotated for input {source.name}, "
                                     "which it does not read")


__all__ = ["ACTIVATION_DTYPES", "ACTIVATION_OBSERVERS", "EtlabQuantizer", "PercentileObserver", "activation_observer",
           "int8_dynamic_config", "int8_static_config", "weight_spec"]
