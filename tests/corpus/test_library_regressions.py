"""Regressions from models of torchvision/timm (issue 28), each on a small model that has the same shape
of problem, so they run without the model libraries."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etlab.compiler import to_edge
from etlab.compiler._errors import CompileError
from etlab.runtime import Runtime

pytestmark = pytest.mark.corpus


class _PermutedPoolHead(nn.Module):
    """ConvNeXt's head: channels-last blocks permuted back, then AdaptiveAvgPool2d(1) and a linear."""

    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        y = x.permute(0, 3, 1, 2)
        return self.fc(self.pool(y).flatten(1))


def test_adaptive_pool_on_permuted_input_compiles_and_matches_eager():
    """adaptive_avg_pool2d restrides its mean in place (as_strided_) for a channels-last input: the
    compile records the out-of-place as_strided (as upstream's functionalization does)."""
    torch.manual_seed(0)
    model, x = _PermutedPoolHead().eval(), torch.randn(2, 5, 5, 8)
    edge = to_edge(torch.export.export(model, (x,), strict=False))
    targets = {str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"}
    assert not any(t.endswith("_.default") for t in targets), targets
    got = Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward").execute([x])[0]
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)


def test_compile_error_on_a_decomposed_op_names_the_call_module_and_line():
    """An error on an op the user never wrote (a piece of a decomposition) names what the user called,
    the module it ran in and the source line."""
    from etlab.compiler._config import EdgeCompileConfig
    from etlab.compiler._decompose import decompose
    from etlab.compiler._graph import fake_mode_of

    model, x = _PermutedPoolHead().eval(), torch.randn(1, 3, 3, 8)
    ep = torch.export.export(model, (x,), strict=False)
    gm = ep.graph_module
    decompose(gm, fake_mode_of(gm), EdgeCompileConfig())
    node = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.as_strided.default)
    err = CompileError.at(node, "is not supported here")
    assert err.called == "adaptive_avg_pool2d"
    assert err.module == "pool (AdaptiveAvgPool2d)"
    assert "test_library_regressions.py" in err.source and "self.pool(y)" in err.source
    assert "from adaptive_avg_pool2d, in module pool (AdaptiveAvgPool2d), at " in str(err)
