"""float16 XNNPACK payloads (etlab's lowering writes fp16 values and fp16 constants) run on etlab's host
XnnpackBackend: fp16 inputs and outputs, each node computed in float32 and rounded to fp16 as XNNPACK's
f16 kernels store it; a float32 argument for an fp16 input is refused, naming both types."""

from __future__ import annotations

import pytest
import torch

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.models import zoo
from etlab.runtime import Runtime


def _program(make):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = make()
    model, inputs = model.half().eval(), tuple(t.half() for t in inputs)
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
    method = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward")
    return model, inputs, method


@pytest.mark.parametrize("make", [zoo.make_mlp, zoo.make_cnn], ids=["mlp", "cnn"])
def test_float16_programs_run_in_float16_within_its_rounding(make):
    model, inputs, method = _program(make)
    out = method.execute(list(inputs))[0]
    with torch.no_grad():
        expected = model(*inputs)
        exact = model.float()(*(t.float() for t in inputs))
    assert out.dtype == torch.float16 and out.shape == expected.shape
    # fp16 rounding per node: as close to float32's result as fp16 eager is, within a few fp16 ulps
    scale = exact.abs().max().item()
    assert (out.float() - exact).abs().max().item() <= 4 * 2.0 ** -10 * max(scale, 1.0)
    assert (out.float() - expected.float()).abs().max().item() <= 4 * 2.0 ** -10 * max(scale, 1.0)


def test_a_float32_argument_for_a_float16_input_is_refused_by_name():
    _, inputs, method = _program(zoo.make_mlp)
    with pytest.raises(Exception, match=r"float16.*got float32"):
        method.execute([t.float() for t in inputs])
