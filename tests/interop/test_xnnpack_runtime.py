"""etlab's runtime on upstream's XNNPACK-delegated programs (float, and quantized with XNNPACKQuantizer).

- the zoo models lowered by upstream's XnnpackPartitioner run here and match upstream's XNNPACK
  outputs within 1e-5 (float) or one quantization step of the output (quantized), on both cores;
- the per-delegated-op gap: every XNNPACK node's logged output (ETDump debug event under its
  debug handle, read back by etlab's Inspector) against the output of the Edge node with that
  handle, captured as upstream's calculate_numeric_gap captures it;
- a planted error (one delegated node's weights scaled inside the .pte) is located by that gap;
- our per-node delegate events line up one for one with upstream's XNNPACK profiling events where
  XNNPACK's runtime keeps the graph's nodes (mlp, cnn); a damaged delegate fails the load cleanly.
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from etlab.errors import FormatError
from etlab.inspector import Inspector
from etlab.runtime import LoadError, Runtime
from etlab.schema import deserialize_pte
from etlab.schema.program import reserialize_pte
from etlab.schema.xnnpack import deserialize_xnnpack, node_kind, serialize_xnnpack
from tests.interop.conftest import ET_REF, SETUP_SH, ZOO, cache_key, cached_build, run_ref

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("xnnpack_interop")]

HERE = Path(__file__).resolve().parent
REF_XNNPACK = HERE / "ref_xnnpack.py"
MODELS = ("mlp", "cnn", "transformer")
VARIANTS = ("float", "quantized")
DYNAMIC = ("mlp", "transformer")  # also dynamically quantized (int8 weights, per-row activations)
RECIPE = f"xnnpack v2 models={','.join(MODELS)} dynamic={','.join(DYNAMIC)}"
CASES = [(m, v) for m in MODELS for v in VARIANTS] + [(m, "dynamic") for m in DYNAMIC]
# (float and quantized exports, dynamic exports) per process, two at once (CI has 2 cores), about even
EXPORT_JOBS = [(["mlp", "cnn"], ["transformer"]), (["transformer"], ["mlp"])]
CORES = ("native", "python")
# upstream XNNPACK operator names (its profiling events) each node kind may run as
UPSTREAM_NAMES = {
    "XNNFullyConnected": ("Fully Connected",), "XNNConv2d": ("Convolution", "Fully Connected"),
    "XNNDepthwiseConv2d": ("Convolution",), "XNNStaticTranspose": ("Transpose",), "XNNAdd": ("Add",),
    "XNNConvert": ("Convert",), "XNNGlobalAvgPooling2d": ("Global Average Pooling", "Mean"),
}


@pytest.fixture(scope="session")
def xnnpack_artifacts(ref_python) -> Path:
    """Upstream XNNPACK exports, runs and AOT intermediates of the zoo models; cached by content hash."""
    def build(tmp: Path) -> None:
        with ThreadPoolExecutor(len(EXPORT_JOBS)) as pool:
            list(pool.map(lambda job: run_ref(ref_python, REF_XNNPACK, ET_REF, ZOO, *job[0], "--out", tmp,
                                              "--dynamic", *job[1], timeout=1800), EXPORT_JOBS))

    return cached_build("xnnpack", cache_key((ZOO, ET_REF, REF_XNNPACK, SETUP_SH), RECIPE), build)


def _load(path: Path, name: str):
    return torch.load(path / name, weights_only=True)


def _run(pte, inputs, core: str | None = None, trace: Path | None = None) -> list[torch.Tensor]:
    kwargs = {"enable_etdump": True, "debug_buffer_size": 16 << 20} if trace else {}
    program = Runtime.get(core).load_program(pte, **kwargs)
    outputs = program.load_method("forward").execute(list(inputs))
    if trace:
        program.write_etdump_result_to_file(trace / "run.etdp", trace / "run.bin")
    return outputs


def _delegate_plans(pte_bytes: bytes) -> list:
    """The graph of each XNNPACK delegate of the program's first method, decoded."""
    pte = deserialize_pte(pte_bytes)
    plan = pte.program.execution_plan[0]
    return [deserialize_xnnpack(pte.segments[d.processed.index]).graph for d in plan.delegates
            if d.id == "XnnpackBackend"]


def _identifiers(graph) -> set:
    """The delegate debug identifiers a graph's nodes report under: a debug handle, or "<kind> #<n>"."""
    ids, unnamed = set(), {}
    for node in graph.xnodes:
        if node.debug_handle == 65535:
            kind = node_kind(node)
            unnamed[kind] = unnamed.get(kind, 0) + 1
            ids.add(f"{kind} #{unnamed[kind]}")
        else:
            ids.add(node.debug_handle)
    return ids


def _output_step(pte_bytes: bytes) -> float:
    """One quantization step of the program's output: the scale of the value its last Convert dequantizes."""
    graph = _delegate_plans(pte_bytes)[-1]
    values = {v.xvalue_union.tensor_value.id_out if hasattr(v.xvalue_union, "tensor_value")
              else v.xvalue_union.id_out: v.xvalue_union for v in graph.xvalues}
    converts = [n.xnode_union for n in graph.xnodes if node_kind(n) == "XNNConvert"]
    source = values[converts[-1].input_id]
    return float(source.quant_params.scale)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("model", "variant"), CASES)
def test_upstream_xnnpack_programs_match_upstream(model, variant, core, xnnpack_artifacts):
    d = xnnpack_artifacts / variant / model
    pte = (d / "model.pte").read_bytes()
    assert _delegate_plans(pte), "upstream lowered nothing to XNNPACK"
    ours, upstream = _run(pte, _load(d, "inputs.pt"), core), _load(d, "upstream_outputs.pt")
    assert len(ours) == len(upstream)
    for a, e in zip(ours, upstream):
        assert a.shape == e.shape and a.dtype == e.dtype
        worst = (a - e).abs().max().item()
        if variant == "float":
            bound = 1e-5 + 1e-5 * e.abs().max().item()
        elif variant == "quantized":  # one step of the quantized value the output is dequantized from
            bound = _output_step(pte) * 1.001
        else:  # float outputs of int8 matmuls on activations quantized per row at run time
            bound = 1e-5 + 1e-3 * e.abs().max().item()
        assert worst <= bound, f"{variant} {model}: max |etlab - upstream XNNPACK| = {worst} > {bound}"


def _delegated_events(trace: Path) -> list:
    inspector = Inspector(etdump_path=trace / "run.etdp", debug_buffer_path=trace / "run.bin",
                          delegate_metadata_parser=lambda raw: [bytes(r).decode() for r in raw])
    return [e for e in inspector.event_blocks[-1].events if e.is_delegated_op]


def per_op_gap(trace: Path, aot: dict[int, torch.Tensor]) -> dict[int, float]:
    """Max |runtime - AOT| per delegated node (by debug handle), from the runtime's ETDump."""
    gaps = {}
    for event in _delegated_events(trace):
        handle = event.delegate_debug_identifier
        if not isinstance(handle, int) or handle not in aot or not event.debug_data:
            continue
        ours, ref = event.debug_data[0].double(), aot[handle].double()
        assert ours.numel() == ref.numel(), f"handle {handle}: {list(ours.shape)} vs AOT {list(ref.shape)}"
        gaps[handle] = (ours.reshape(ref.shape) - ref).abs().max().item()
    return gaps


@pytest.mark.parametrize(("model", "variant"), CASES)
def test_per_delegated_op_gap_is_reported(model, variant, xnnpack_artifacts, tmp_path, record_property):
    d = xnnpack_artifacts / variant / model
    _run(d / "model.pte", _load(d, "inputs.pt"), trace=tmp_path)
    events = _delegated_events(tmp_path)
    graphs = _delegate_plans((d / "model.pte").read_bytes())
    # one profiling event per XNNPACK node; nodes sharing a debug handle (an op and the Convert
    # after it, in quantized graphs) are one event row, as the Inspector groups by identifier
    assert len(events) == sum(len(_identifiers(g)) for g in graphs)
    gaps = per_op_gap(tmp_path, _load(d, "aot_intermediates.pt"))
    record_property("per_op_gap", gaps)
    handled = [e for e in events if isinstance(e.delegate_debug_identifier, int)]
    assert len(gaps) == len(handled) and gaps, "every node with a debug handle has a gap"
    if model == "cnn" and variant == "float":
        # XNNPACK's convs carry the batch norm folded into them; the Edge conv under that handle does not
        adds = {e.delegate_debug_identifier for e in handled if e.delegate_debug_metadatas == ["XNNAdd"]}
        assert adds and max(gaps[h] for h in adds) < 1e-5
    elif variant == "float":
        assert max(gaps.values()) < 1e-4, gaps
    else:  # within a few quantization steps of the Edge graph's fake-quantized values
        assert max(gaps.values()) < 0.05, gaps


def _weight_offset(pte_bytes: bytes, node_index: int, delegate: int = 0) -> tuple[int, int]:
    """(file offset, size) of the constant filter of the `node_index`-th node of a delegate."""
    pte = deserialize_pte(pte_bytes)
    graph = _delegate_plans(pte_bytes)[delegate]
    node = graph.xnodes[node_index].xnode_union
    value = next(v.xvalue_union for v in graph.xvalues if getattr(v.xvalue_union, "id_out", None) == node.filter_id)
    entry = graph.constant_data[value.constant_buffer_idx]
    named = {nd.key: nd.segment_index for nd in pte.program.named_data}
    segment = pte.program.segments[named[entry.named_key]]
    return pte.header.segment_base_offset + segment.offset, int(entry.size)


@pytest.mark.parametrize("model", ("mlp", "transformer"))
def test_planted_error_inside_the_delegate_is_located(model, xnnpack_artifacts, tmp_path):
    d = xnnpack_artifacts / "float" / model
    pte = (d / "model.pte").read_bytes()
    graphs = _delegate_plans(pte)
    fcs = [(g, i) for g, graph in enumerate(graphs) for i, n in enumerate(graph.xnodes)
           if node_kind(n) == "XNNFullyConnected"]
    delegate, target = fcs[len(fcs) // 2]
    planted = graphs[delegate].xnodes[target].debug_handle
    offset, size = _weight_offset(pte, target, delegate)
    damaged = bytearray(pte)
    weights = struct.unpack_from(f"<{size // 4}f", damaged, offset)
    struct.pack_into(f"<{size // 4}f", damaged, offset, *(w * 1.5 for w in weights))
    _run(bytes(damaged), _load(d, "inputs.pt"), trace=tmp_path)
    gaps = per_op_gap(tmp_path, _load(d, "aot_intermediates.pt"))
    order = [e.delegate_debug_identifier for e in _delegated_events(tmp_path)
             if e.delegate_debug_identifier in gaps]
    first_bad = next(h for h in order if gaps[h] > 1e-3)
    assert first_bad == planted, f"planted in node {planted}, the gap first jumps at {first_bad}: {gaps}"
    assert all(gaps[h] < 1e-4 for h in order[:order.index(planted)])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model", ("mlp", "cnn"))
def test_delegate_events_line_up_with_upstreams(model, variant, xnnpack_artifacts, tmp_path):
    """Upstream's XNNPACK names its per-op events after XNNPACK's operators ("Fully Connected (NC,
    F32) GEMM #1"); ours carry debug handles and the node kind. Where XNNPACK's runtime keeps the
    nodes as they are, they pair up in order; it folds a separate Clamp node into the op before it
    (quantized graphs) and re-plans the transformer's subgraphs, which no per-node trace can follow."""
    d = xnnpack_artifacts / variant / model
    _run(d / "model.pte", _load(d, "inputs.pt"), trace=tmp_path)
    graphs = _delegate_plans((d / "model.pte").read_bytes())
    kinds = [node_kind(n) for g in graphs for n in g.xnodes]
    if variant == "float":  # ids are unique here, so every node is its own event row, in order
        assert [e.delegate_debug_metadatas[0] for e in _delegated_events(tmp_path)] == kinds
    upstream = [e.name for e in Inspector(etdump_path=d / "run.etdp").event_blocks[-1].events if e.is_delegated_op]
    run_as = [k for k in kinds if k != "XNNClamp"]
    assert len(run_as) == len(upstream), (run_as, upstream)
    for kind, name in zip(run_as, upstream):
        assert name.startswith(UPSTREAM_NAMES[kind]), (kind, name)


def test_damaged_upstream_delegate_fails_the_load_cleanly(xnnpack_artifacts):
    pte_bytes = (xnnpack_artifacts / "float" / "cnn" / "model.pte").read_bytes()
    pte = deserialize_pte(pte_bytes)
    index = pte.program.execution_plan[0].delegates[0].processed.index
    blob = deserialize_xnnpack(pte.segments[index])
    blob.graph.xnodes[3].xnode_union_type = 21  # XNNArgMaxPooling2d
    segments = list(pte.segments)
    for damaged, message in ((serialize_xnnpack(blob.graph), "XNNArgMaxPooling2d"),
                             (bytes(pte.segments[index])[:200], "outside the blob")):
        segments[index] = damaged
        data = reserialize_pte(type(pte)(pte.program, segments, pte.header))
        with pytest.raises(LoadError, match=message) as err:
            Runtime.get().load_program(data).load_method("forward")
        assert isinstance(err.value.__cause__, FormatError)
