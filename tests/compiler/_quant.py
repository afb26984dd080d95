"""Quantized zoo programs for the quantization tests: made once per process (export + calibrate + convert
+ compile take seconds per model)."""

from __future__ import annotations

import functools
import warnings

import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from etlab.compiler import EtlabQuantizer, int8_dynamic_config, to_edge
from etlab.models import ZOO

MODES = {"static": lambda: EtlabQuantizer(), "dynamic": lambda: EtlabQuantizer(int8_dynamic_config())}


def quantize(model, inputs, quantizer, *, fold_quantize: bool = True):
    """torch.export -> prepare_pt2e -> calibrate on `inputs` -> convert_pt2e (torchao's warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = torch.export.export(model, inputs).module()
        prepared = prepare_pt2e(gm, quantizer)
        prepared(*inputs)
        return convert_pt2e(prepared, fold_quantize=fold_quantize)


def as_list(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def output_steps(gm) -> list[float | None]:
    """Per output of a converted graph: the scale of the per-tensor dequantize producing it (one
    quantization step), or None when the output is not dequantized from int8."""
    dq = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    out = gm.graph.output_node()
    return [float(a.args[1]) if getattr(a, "target", None) is dq else None for a in as_list(out.args[0])]


@functools.cache
def quantized_zoo(name: str, mode: str = "static"):
    """(converted GraphModule, inputs, eager outputs of the converted model, .pte bytes, output steps)."""
    model, inputs = ZOO[name]()
    gm = quantize(model, inputs, MODES[mode]())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the runtime's default: the same thread count, the same summation order (bits)
    try:
        with torch.no_grad():
            eager = [t.detach() for t in as_list(gm(*inputs))]
    finally:
        torch.set_num_threads(threads)
    et = to_edge(torch.export.export(gm, inputs)).to_executorch()
    return gm, inputs, eager, et.buffer, output_steps(gm)


def assert_within_one_step(actual: list, expected: list, steps: list) -> None:
    """Bit-exact, or every element within one quantization step of its output (1e-5 for float outputs)."""
    assert len(actual) == len(expected)
    for a, e, step in zip(actual, expected, steps):
        assert a.shape == e.shape and a.dtype == e.dtype
        tol = 1e-5 if step is None else step * 1.0001
        diff = float((a - e).abs().max()) if a.numel() else 0.0
        assert diff <= tol, f"max difference {diff} exceeds one quantization step {tol}"
