"""etlab's XNNPACK programs on upstream's runtime (real XNNPACK), next to eager and upstream's partitioner.

A fast subset: small models compiled here with `XnnpackPartitioner`, all run in one reference
process (importing upstream is most of its time):
- the zoo's mlp and cnn and two op-coverage models (convolutions of every kind with batch norm
  and activations folded; pooling, resizes, global pooling) match eager within 1e-4;
- etlab's partitioner delegates at least as many Edge nodes as upstream's on the same export (mlp).
"""

from __future__ import annotations

import json

import pytest
import torch

from etlab.compiler import to_edge_transform_and_lower
from etlab.compiler.backends import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.models import zoo
from tests.delegation.test_xnnpack_lowering import Convs, Pools
from tests.interop.conftest import HERE, ZOO, run_ref

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("xnnpack_lowering_interop")]

REF_SCRIPT = HERE / "ref_xnnpack_lowering.py"
TOLERANCE = 1e-4


def _convs():
    return Convs().eval(), (torch.randn(1, 3, 16, 16),)


def _pools():
    return Pools().eval(), (torch.randn(2, 4, 9, 9),)


FACTORIES = {"mlp": zoo.make_mlp, "cnn": zoo.make_cnn, "convs": _convs, "pools": _pools}
COUNTED = ("mlp",)


def _seeded(make):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return make()


@pytest.fixture(scope="module")
def upstream_runs(ref_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("xnnpack_lowering")
    compiled = {}
    for name, make in FACTORIES.items():
        model, inputs = _seeded(make)
        edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()])
        modules = lowered_modules(edge.exported_program().graph_module)
        (out / f"{name}.pte").write_bytes(edge.to_executorch().buffer)
        torch.save(list(inputs), out / f"{name}_inputs.pt")
        with torch.no_grad():
            want = model(*inputs)
        compiled[name] = {
            "eager": [want] if isinstance(want, torch.Tensor) else list(want),
            "partitions": len(modules),
            "nodes": sum(1 for _, _, m in modules for n in m.original_module.graph.nodes if n.op == "call_function"),
        }
    done = run_ref(ref_python, REF_SCRIPT, "run", out, *FACTORIES, "--count", ZOO, *COUNTED)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    upstream_counts = {row["upstream"]: row for row in lines if "upstream" in row}
    return out, compiled, upstream_counts


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_upstream_runtime_runs_etlab_xnnpack_program_like_eager(upstream_runs, name):
    out, compiled, _ = upstream_runs
    got = torch.load(out / f"{name}_upstream.pt", weights_only=True)
    want = compiled[name]["eager"]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert float((g - w).abs().max()) <= TOLERANCE, name


@pytest.mark.parametrize("name", COUNTED)
def test_etlab_delegates_at_least_what_upstream_does(upstream_runs, name):
    _, compiled, upstream = upstream_runs
    assert compiled[name]["nodes"] >= upstream[name]["nodes"] > 0
    assert compiled[name]["partitions"] <= upstream[name]["partitions"]
