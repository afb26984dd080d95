"""Tests for the model zoo: determinism, export (strict and non-strict), parity."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from etlab.models import (
    DYNAMIC_SHAPES,
    METHOD_INPUTS,
    ZOO,
    make_cond,
    make_dynamic_batch,
    make_kv_cache_decoder,
    make_mobilenet_v2,
    make_two_methods,
)

ZOO_PATH = Path(__file__).resolve().parents[1] / "etlab" / "models" / "zoo.py"
SMALL = [name for name in ZOO if name != "mobilenet_v2"]
ATOL = 1e-5


def _outputs(module: nn.Module, inputs: tuple[Tensor, ...]) -> Tensor:
    with torch.no_grad():
        return module(*inputs)


def _export(name: str, strict: bool) -> torch.export.ExportedProgram:
    factory = ZOO[name]
    module, inputs = factory()
    shapes = DYNAMIC_SHAPES.get(factory.__name__)
    return torch.export.export(module, inputs, dynamic_shapes=shapes, strict=strict)


class _Method(nn.Module):
    """Expose a non-forward method as forward so torch.export can trace it."""

    def __init__(self, inner: nn.Module, method: str) -> None:
        super().__init__()
        self.inner = inner
        self.method = method

    def forward(self, *args: Tensor) -> Tensor:
        return getattr(self.inner, self.method)(*args)


def test_zoo_names() -> None:
    assert set(ZOO) == {
        "mlp", "cnn", "mobilenet_v2", "transformer",
        "kv_cache_decoder", "dynamic_batch", "two_methods", "cond",
    }  # fmt: skip


def test_zoo_imports_only_torch_and_stdlib() -> None:
    tree = ast.parse(ZOO_PATH.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in zoo.py"
            assert node.module is not None
            roots.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    assert roots <= allowed, roots - allowed


@pytest.mark.parametrize("name", SMALL)
def test_factory_is_deterministic(name: str) -> None:
    m1, in1 = ZOO[name]()
    m2, in2 = ZOO[name]()
    assert not m1.training
    assert all(isinstance(t, Tensor) for t in in1)
    for a, b in zip(in1, in2, strict=True):
        assert torch.equal(a, b)
    sd1, sd2 = m1.state_dict(), m2.state_dict()
    assert sd1.keys() == sd2.keys()
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    assert torch.equal(_outputs(m1, in1), _outputs(m2, in2))


def test_factory_does_not_disturb_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ZOO["mlp"]()
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
@pytest.mark.parametrize("name", SMALL)
def test_export_matches_eager(name: str, strict: bool) -> None:
    ep = _export(name, strict)
    # Fresh instance: the exported program shares (may mutate) the original buffers.
    eager, inputs = ZOO[name]()
    torch.testing.assert_close(_outputs(ep.module(), inputs), _outputs(eager, inputs), atol=ATOL, rtol=0)


def test_cnn_batchnorm_stats_are_nontrivial() -> None:
    module, _ = ZOO["cnn"]()
    bns = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) > 5
    for bn in bns:
        assert bn.running_mean.abs().sum() > 0
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    depthwise = [
        m for m in module.modules()
        if isinstance(m, nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels
    ]  # fmt: skip
    assert depthwise


def test_mobilenet_v2_param_count() -> None:
    module, (x,) = make_mobilenet_v2()
    assert x.shape == (1, 3, 224, 224)
    n_params = sum(p.numel() for p in module.parameters())
    assert n_params == 3_504_872  # matches torchvision mobilenet_v2(width_mult=1.0)
    assert module.classifier[-1].out_features == 1000


def _decode(module: nn.Module, steps: list[tuple[int, int]]) -> list[Tensor]:
    return [_outputs(module, (torch.tensor([[tok]]), torch.tensor([pos]))) for tok, pos in steps]


def test_kv_cache_state_persists_across_calls() -> None:
    model, (token, pos) = make_kv_cache_decoder()
    assert token.dtype == pos.dtype == torch.int64
    before = model.k_cache.clone()
    _, second = _decode(model, [(7, 0), (3, 1)])
    assert not torch.equal(model.k_cache, before)
    assert model.k_cache[:, :, 2:].abs().sum() == 0  # only slots 0 and 1 written
    # A fresh model at position 1 has an empty slot 0, so its answer differs.
    fresh, _ = make_kv_cache_decoder()
    (alone,) = _decode(fresh, [(3, 1)])
    assert not torch.allclose(second, alone)


# run_decompositions deep-copies a pytree spec: torch trips its own LeafSpec warning.
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_kv_cache_export_mutates_buffers(strict: bool) -> None:
    model, inputs = make_kv_cache_decoder()
    ep = torch.export.export(model, inputs, strict=strict).run_decompositions()
    assert set(ep.graph_signature.buffers_to_mutate.values()) == {"k_cache", "v_cache"}
    steps = [(7, 0), (3, 1), (9, 2)]
    eager, _ = make_kv_cache_decoder()
    for got, want in zip(_decode(ep.module(), steps), _decode(eager, steps), strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_dynamic_batch_runs_at_bounds(strict: bool) -> None:
    ep = _export("dynamic_batch", strict)
    eager, (x,) = make_dynamic_batch()
    for batch in (1, 16):
        xb = torch.randn(batch, *x.shape[1:], generator=torch.Generator().manual_seed(batch))
        out = _outputs(ep.module(), (xb,))
        assert out.shape[0] == batch
        torch.testing.assert_close(out, _outputs(eager, (xb,)), atol=ATOL, rtol=0)
    with pytest.raises(Exception):  # noqa: B017 - above max=16 must be rejected
        ep.module()(torch.randn(17, *x.shape[1:]))


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_two_methods_export_each_method(strict: bool) -> None:
    model, fwd_inputs = make_two_methods()
    inputs = METHOD_INPUTS["make_two_methods"]
    for a, b in zip(inputs["forward"], fwd_inputs, strict=True):
        assert torch.equal(a, b)
    outs = {}
    for method, args in inputs.items():
        wrapper = _Method(model, method)
        ep = torch.export.export(wrapper, args, strict=strict)
        outs[method] = _outputs(wrapper, args)
        torch.testing.assert_close(_outputs(ep.module(), args), outs[method], atol=ATOL, rtol=0)
    assert outs["forward"].shape != outs["encode"].shape
    same_input = inputs["encode"]
    assert not torch.allclose(
        _outputs(model, same_input)[:, :3],
        _outputs(_Method(model, "encode"), same_input)[:, :3],
    )


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_cond_takes_both_branches(strict: bool) -> None:
    model, (x,) = make_cond()
    assert x.sum() > 0
    ep = _export("cond", strict)
    assert any(n.op == "call_function" and "cond" in str(n.target) for n in ep.graph.nodes), (
        "torch.cond should survive export as a higher-order op"
    )
    lin = model.lin
    with torch.no_grad():
        want_true = torch.relu(lin(x)) + 1.0
        want_false = torch.sin(-x) * 2.0
    torch.testing.assert_close(_outputs(ep.module(), (x,)), want_true, atol=ATOL, rtol=0)
    torch.testing.assert_close(_outputs(ep.module(), (-x,)), want_false, atol=ATOL, rtol=0)
    torch.testing.assert_close(_outputs(model, (-x,)), want_false, atol=ATOL, rtol=0)


def test_zoo_loaded_by_path_exports_strict() -> None:
    """External tools load zoo.py by path without registering it in sys.modules."""
    name = "_etlab_zoo_by_path"
    spec = importlib.util.spec_from_file_location(name, ZOO_PATH)
    assert spec is not None and spec.loader is not None
    zoo = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(zoo)
        # Dynamo resolves globals by re-importing the module by name.
        assert sys.modules[name] is zoo
        for factory in (zoo.make_mlp, zoo.make_cond):
            module, inputs = factory()
            ep = torch.export.export(module, inputs, strict=True)
            torch.testing.assert_close(
                _outputs(ep.module(), inputs),
                _outputs(module, inputs),
                atol=ATOL,
                rtol=0,
            )
    finally:
        sys.modules.pop(name, None)
