"""etlab's XNNPACK programs on upstream's runtime (real XNNPACK), next to eager and upstream's partitioner.

A fast subset: small models compiled here with `XnnpackPartitioner`, all run in one reference
process (importing upstream is most of its time):
- the zoo's mlp and cnn and four op-coverage models (convolutions of every kind with batch norm
  and activations folded; 1-D convolutions as unit-width 2-D ones; pooling, resizes, global pooling;
  batch norms no convolution absorbs, over (N, C) and (N, C, L)) match eager within 1e-4; the mlp
  and cnn in float16 (fp16 XNNPACK values, as upstream lowers float16 models) match float16 eager
  within 1e-2;
- the mlp quantized by upstream's XNNPACKQuantizer (static int8, and dynamic int8), compiled by
  etlab from the very graph upstream compiles, gives upstream's own XNNPACK program's outputs
  within one quantization step of the output;
- etlab's partitioner delegates at least as many Edge nodes as upstream's on the same export (mlp);
- constants are named data as upstream writes them: the mlp's .pte holds exactly the keys upstream's
  own lowering of the same export writes (SHA-256 of each weight's bytes), and with its weights
  tagged by `delegate_external_constants_pass_unlifted` they go to a .ptd, which upstream's runtime
  takes as the program's data file and matches eager with.
"""

from __future__ import annotations

import json

import pytest
import torch

from etlab.compiler import delegate_external_constants_pass_unlifted, to_edge_transform_and_lower
from etlab.compiler.backends import XnnpackPartitioner
from etlab.facts.lowered import lowered_modules
from etlab.models import zoo
from etlab.schema import deserialize_pte
from tests.compiler.test_xnnpack_batch_norm import make_norm_head
from tests.delegation.test_xnnpack_lowering import Conv1ds, Convs, Pools
from tests.interop.conftest import ET_REF, HERE, ZOO, run_ref

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("xnnpack_lowering_interop")]

REF_SCRIPT = HERE / "ref_xnnpack_lowering.py"
TOLERANCE = 1e-4


def _convs():
    return Convs().eval(), (torch.randn(1, 3, 16, 16),)


def _conv1ds():
    return Conv1ds().eval(), (torch.randn(2, 3, 33),)


def _pools():
    return Pools().eval(), (torch.randn(2, 4, 9, 9),)


def _half(make):
    """The model and inputs in float16: upstream's partitioner lowers them as fp16 XNNPACK values."""
    def build():
        model, inputs = make()
        return model.half(), tuple(t.half() for t in inputs)
    return build


FACTORIES = {"mlp": zoo.make_mlp, "cnn": zoo.make_cnn, "convs": _convs, "conv1ds": _conv1ds, "pools": _pools,
             "norm_head": make_norm_head, "half_mlp": _half(zoo.make_mlp), "half_cnn": _half(zoo.make_cnn)}
HALF_TOLERANCE = 1e-2  # fp16 eager and XNNPACK's fp16 kernels round differently (cnn: ~5e-5 of outputs ~0.5)
COUNTED = ("mlp",)
QUANTIZED = ("static_mlp", "dynamic_mlp")  # upstream's XNNPACKQuantizer, static and dynamic
EXTERNAL = ("external_mlp",)  # weights tagged for a .ptd


def _seeded(make):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return make()


@pytest.fixture(scope="module")
def upstream_runs(ref_python, tmp_path_factory):
    out = tmp_path_factory.mktemp("xnnpack_lowering")
    done = run_ref(ref_python, REF_SCRIPT, "quantize", ET_REF, ZOO, out, "mlp", "--dynamic", "mlp")
    upstream_counts = _json_lines(done.stdout)
    compiled = {name: _compile_quantized(out, name) for name in QUANTIZED}
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
    compiled.update(_external_weights(out))
    done = run_ref(ref_python, REF_SCRIPT, "run", out, *FACTORIES, *QUANTIZED, *EXTERNAL, "--count", ZOO,
                   *COUNTED, "--keys", "mlp")
    upstream_counts.update(_json_lines(done.stdout))
    for line in done.stdout.splitlines():
        if line.startswith('{"keys"'):
            row = json.loads(line)
            upstream_counts[f"keys_{row['keys']}"] = row["named"]
    return out, compiled, upstream_counts


def _external_weights(out) -> dict:
    """The mlp with every weight tagged for model.ptd (upstream's flow: export, tag the unlifted module,
    export again), written as external_mlp.pte + external_mlp.ptd; and the mlp's plain export
    (mlp.pt2) with the named keys of etlab's program of it."""
    model, inputs = _seeded(zoo.make_mlp)
    ep = torch.export.export(model, inputs)
    torch.export.save(ep, out / "mlp.pt2")
    plain = deserialize_pte(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    tagged = ep.module()
    delegate_external_constants_pass_unlifted(tagged, gen_tag_fn=lambda node: "model")
    et = to_edge_transform_and_lower(torch.export.export(tagged, inputs),
                                     partitioner=[XnnpackPartitioner()]).to_executorch()
    assert set(et.data_files) == {"model"}
    (out / "external_mlp.pte").write_bytes(et.buffer)
    (out / "external_mlp.ptd").write_bytes(et.data_files["model"])
    torch.save(list(inputs), out / "external_mlp_inputs.pt")
    with torch.no_grad():
        want = model(*inputs)
    return {"external_mlp": {"eager": [want], "pte": deserialize_pte(et.buffer)},
            "keys_mlp": sorted(n.key for n in plain.program.named_data or ())}


def _json_lines(stdout: str) -> dict:
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {row["upstream"]: row for row in rows if "upstream" in row}


def _compile_quantized(out, name: str) -> dict:
    """etlab compiles the converted model upstream's quantizer made (saved by the ref script)."""
    import torch.ao.quantization.fx._decomposed

    ep = torch.export.load(out / f"{name}.pt2")
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    (out / f"{name}.pte").write_bytes(edge.to_executorch().buffer)
    modules = lowered_modules(edge.exported_program().graph_module)
    last_quantize = [n for n in ep.graph.nodes if "quantize_per_tensor" in str(n.target)
                     and "dequantize" not in str(n.target)][-1]
    step = float(last_quantize.args[1]) if not isinstance(last_quantize.args[1], torch.fx.Node) else None
    return {"partitions": len(modules), "step": step,
            "nodes": sum(1 for _, _, m in modules for n in m.original_module.graph.nodes if n.op == "call_function")}


@pytest.mark.parametrize("name", sorted(FACTORIES) + list(EXTERNAL))
def test_upstream_runtime_runs_etlab_xnnpack_program_like_eager(upstream_runs, name):
    out, compiled, _ = upstream_runs
    got = torch.load(out / f"{name}_upstream.pt", weights_only=True)
    want = compiled[name]["eager"]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert float((g.float() - w.float()).abs().max()) <= (HALF_TOLERANCE if name.startswith("half") else TOLERANCE)


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_program_matches_upstreams_own_within_one_step(upstream_runs, name):
    out, compiled, _ = upstream_runs
    got = torch.load(out / f"{name}_upstream.pt", weights_only=True)
    want = torch.load(out / f"{name}_reference.pt", weights_only=True)
    step = compiled[name]["step"]
    tolerance = step if step is not None else 1e-5  # dynamic: the same run-time quantization on both sides
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and float((g - w).abs().max()) <= tolerance


@pytest.mark.parametrize("name", COUNTED + QUANTIZED)
def test_etlab_delegates_at_least_what_upstream_does(upstream_runs, name):
    _, compiled, upstream = upstream_runs
    assert compiled[name]["nodes"] >= upstream[name]["nodes"] > 0
    assert compiled[name]["partitions"] <= upstream[name]["partitions"]


def test_named_data_keys_are_upstreams(upstream_runs):
    _, compiled, upstream = upstream_runs
    assert compiled["keys_mlp"] == upstream["keys_mlp"] and len(compiled["keys_mlp"]) == 6


def test_tagged_weights_leave_the_pte(upstream_runs):
    _, compiled, _ = upstream_runs
    assert compiled["external_mlp"]["pte"].program.named_data is None
