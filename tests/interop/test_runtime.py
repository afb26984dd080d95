"""The etlab runtime on upstream-compiled programs, and upstream's Inspector on the runtime's ETDumps.

- every zoo model exported by upstream (non-delegated) runs here and matches upstream's outputs
  and eager (stateful and dynamic-shape models over several calls and sizes);
- upstream's `.bpte` test cases pass, upstream's external-data `.ptd` loads;
- the runtime's `.etdp` has upstream's structure event for event (names, chain and instruction
  ids, debug values' kinds, shapes and strides), its logged values match upstream's, and
  upstream's Inspector reads it (delegate events included) into the same events as its own.

Every test runs on both runtime cores (native and Python; `tests/runtime/_cores.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from etlab.devtools._bundled_runtime import load_bundled_program, verify_method_outputs
from etlab.runtime import Runtime, register_backend, unregister_backend
from etlab.schema import deserialize_etdump
from etlab.schema.scalar_type import scalar_type_to_dtype
from tests.interop.conftest import SETUP_SH, ZOO, cache_key, cached_build, external_ptd, run_ref
from tests.runtime import _cores
from tests.runtime._programs import ScaleBackend, delegate_program

# One worker: the traces and the reference Inspector run are session fixtures, made once per process.
pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("runtime_interop")]

runtime_core = _cores.runtime_core  # autouse: every test here runs on both runtime cores
CORES = _cores.CORES
HERE = Path(__file__).resolve().parent
REF_EXPORT = HERE / "ref_export_runtime.py"
FIXTURE_MODELS = ("mlp", "cnn", "transformer")
EXTRA_MODELS = ("kv_cache_decoder", "dynamic_batch", "cond", "two_methods", "sym_ops", "mobilenet_v2")
TRACED_EXTRA = ("kv_cache_decoder", "dynamic_batch", "cond", "two_methods", "sym_ops")
RECIPE = f"runtime v1 models={','.join(EXTRA_MODELS)} traced={','.join(TRACED_EXTRA)}"
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="session")
def runtime_exports(ref_python) -> Path:
    """Upstream exports of the zoo models the shared fixture lacks; cached like it, by content hash."""
    trace = [a for m in TRACED_EXTRA for a in ("--trace", m)]
    return cached_build("runtime", cache_key((ZOO, REF_EXPORT, SETUP_SH), RECIPE), lambda tmp: run_ref(
        ref_python, REF_EXPORT, "zoo", ZOO, *EXTRA_MODELS, "--out", tmp, *trace, timeout=1200))


def _close(actual: list, expected: list) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, **TOL)


@pytest.mark.parametrize("model", FIXTURE_MODELS)
def test_upstream_programs_match_upstream_and_eager(model, upstream_artifacts):
    d = upstream_artifacts[model]
    method = Runtime.get().load_program(d / "model.pte").load_method("forward")
    inputs = torch.load(d / "inputs.pt", weights_only=True)
    for _ in range(2):
        outputs = method.execute(inputs)
        _close(outputs, torch.load(d / "upstream_outputs.pt", weights_only=True))
        _close(outputs, torch.load(d / "eager_outputs.pt", weights_only=True))


@pytest.mark.parametrize("model", EXTRA_MODELS)
def test_more_upstream_programs_over_several_calls(model, runtime_exports):
    d = runtime_exports / model
    program = Runtime.get().load_program(d / "model.pte")
    cases = torch.load(d / "cases.pt", weights_only=True)
    upstream = torch.load(d / "upstream_outputs.pt", weights_only=True)
    eager = torch.load(d / "eager_outputs.pt", weights_only=True)
    assert program.method_names == set(cases)
    for method_name, calls in cases.items():
        method = program.load_method(method_name)  # one method for all calls: state carries over
        for k, inputs in enumerate(calls):
            outputs = method.execute(inputs)
            _close(outputs, upstream[method_name][k])
            _close(outputs, eager[method_name][k])


def test_kv_cache_state_matters(runtime_exports):
    """The decoder's output at a step depends on the cache earlier steps wrote (not just its inputs)."""
    d = runtime_exports / "kv_cache_decoder"
    calls = torch.load(d / "cases.pt", weights_only=True)["forward"]
    program = Runtime.get().load_program(d / "model.pte")
    warm = program.load_method("forward")
    for inputs in calls[:2]:
        second = warm.execute(inputs)[0]
    fresh = program.load_method("forward").execute(calls[1])[0]
    assert not torch.allclose(second, fresh, **TOL)


def test_external_data(upstream_artifacts):
    ext = upstream_artifacts["mlp"] / "external"
    program = Runtime.get().load_program(ext / "model.pte", data_files=[external_ptd(upstream_artifacts["mlp"])])
    outputs = program.load_method("forward").execute(torch.load(ext / "inputs.pt", weights_only=True))
    _close(outputs, torch.load(ext / "upstream_outputs.pt", weights_only=True))


@pytest.mark.parametrize("model", FIXTURE_MODELS)
def test_upstream_bundled_programs_verify(model, upstream_artifacts):
    method = load_bundled_program(upstream_artifacts[model] / "model.bpte").load_method("forward")
    for index in range(2):
        report = verify_method_outputs(method, index, **TOL)
        assert report.ok, str(report)


# -- ETDump ------------------------------------------------------------------------------------


def _signature(path: Path) -> list:
    """Every event of an .etdp, minus timings and buffer offsets."""
    out = []
    for run in deserialize_etdump(path.read_bytes()).run_data:
        events = []
        for e in run.events:
            if e.profile_event:
                p = e.profile_event
                events.append(("P", p.name, p.chain_index, p.instruction_id, p.delegate_debug_id_int,
                               p.delegate_debug_id_str))
            else:
                d = e.debug_event
                v = d.debug_entry
                tensors = [v.tensor] if v.tensor else (v.tensor_list.tensors if v.tensor_list else [])
                events.append(("D", d.chain_index, d.instruction_id, int(v.val), v.output and v.output.bool_val,
                               [(int(t.scalar_type), t.sizes, t.strides) for t in tensors]))
        out.append((run.name, run.bundled_input_index, events))
    return out


def _logged_values(etdp: Path, buf: Path) -> list[torch.Tensor]:
    data = buf.read_bytes()
    values = []
    for run in deserialize_etdump(etdp.read_bytes()).run_data:
        for e in run.events:
            v = e.debug_event.debug_entry if e.debug_event else None
            for t in ([v.tensor] if v and v.tensor else (v.tensor_list.tensors if v and v.tensor_list else [])):
                dtype = scalar_type_to_dtype(t.scalar_type)
                n = int(torch.tensor(t.sizes, dtype=torch.int64).prod()) * dtype.itemsize
                raw = bytearray(data[t.offset : t.offset + n])
                values.append(torch.frombuffer(raw, dtype=dtype).reshape(t.sizes) if n else torch.empty(t.sizes))
    return values


def _trace_like_upstream(pte: Path, inputs: list, iters: int, out: Path, core: str) -> tuple[Path, Path]:
    program = Runtime.get(core=core).load_program(pte, enable_etdump=True, debug_buffer_size=16 << 20)
    method = program.load_method("forward")
    for _ in range(iters):
        method.execute(inputs)
    program.write_etdump_result_to_file(out / "ours.etdp", out / "ours.bin")
    return out / "ours.etdp", out / "ours.bin"


def _traced_cases(upstream_artifacts, runtime_exports) -> dict:
    cases = {}
    for m in FIXTURE_MODELS:
        d = upstream_artifacts[m]
        cases[m] = (d, torch.load(d / "inputs.pt", weights_only=True), 2)
    for m in TRACED_EXTRA:
        d = runtime_exports / m
        first = next(iter(torch.load(d / "cases.pt", weights_only=True).values()))[0]
        cases[m] = (d, first, 1)
    return cases


@pytest.fixture(scope="session")
def our_traces(upstream_artifacts, runtime_exports, tmp_path_factory) -> dict:
    traces = {}
    for core in CORES:
        for m, (d, inputs, iters) in _traced_cases(upstream_artifacts, runtime_exports).items():
            out = tmp_path_factory.mktemp(f"{core}-{m}")
            traces[core, m] = (d, *_trace_like_upstream(d / "model.pte", inputs, iters, out, core))
    return traces


@pytest.mark.parametrize("model", FIXTURE_MODELS + TRACED_EXTRA)
def test_etdump_has_upstreams_structure_and_values(model, our_traces, runtime_core):
    d, etdp, buf = our_traces[runtime_core, model]
    assert _signature(etdp) == _signature(d / "run.etdp")
    ours, theirs = _logged_values(etdp, buf), _logged_values(d / "run.etdp", d / "run.bin")
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="session")
def delegate_trace(tmp_path_factory) -> dict[str, Path]:
    outs = {}
    register_backend("ScaleBackend", ScaleBackend())
    try:
        for core in CORES:
            program = Runtime.get(core=core).load_program(delegate_program(factor=2), enable_etdump=True,
                                                          debug_buffer_size=4096)
            method = program.load_method("forward")
            for _ in range(2):
                method.execute([torch.ones(2, 2)])
            outs[core] = tmp_path_factory.mktemp(f"delegate-{core}")
            program.write_etdump_result_to_file(outs[core] / "ours.etdp", outs[core] / "ours.bin")
    finally:
        unregister_backend("ScaleBackend")
    return outs


@pytest.fixture(scope="session")
def inspected(ref_python, our_traces, delegate_trace, tmp_path_factory) -> tuple[dict, dict]:
    """Upstream's Inspector on our traces and on upstream's own, in one reference process."""
    files = {}
    for (core, m), (d, etdp, buf) in our_traces.items():
        files[(core, m)] = f"{etdp},{buf}"
        files[("upstream", m)] = f"{d / 'run.etdp'},{d / 'run.bin'}"
    for core, out in delegate_trace.items():
        files[(core, "delegate")] = f"{out / 'ours.etdp'},{out / 'ours.bin'}"
    out = tmp_path_factory.mktemp("inspect") / "inspect.json"
    run_ref(ref_python, REF_EXPORT, "inspect", out, *files.values(), timeout=900)
    result = json.loads(out.read_text())
    return {k: result[v] for k, v in files.items()}, files


@pytest.mark.parametrize("model", FIXTURE_MODELS + TRACED_EXTRA)
def test_upstream_inspector_reads_our_etdump_like_its_own(model, inspected, runtime_core):
    blocks, _ = inspected
    ours, theirs = blocks[(runtime_core, model)], blocks[("upstream", model)]
    assert sum(len(b["events"]) for b in ours) > 0
    assert ours == theirs  # names, instruction ids, counts of timings, debug shapes and dtypes


def test_upstream_inspector_reads_our_delegate_events(inspected, runtime_core):
    blocks, _ = inspected
    execute = [b for b in blocks[(runtime_core, "delegate")] if b["name"] == "Execute"]
    assert len(execute) == 1  # two identical runs grouped into one block
    events = {(e["name"], json.dumps(e["delegate_debug_identifier"])): e for e in execute[0]["events"]}
    assert events[("scale_op", '"scale_op"')]["is_delegated_op"] is True
    assert events[("7", "7")]["is_delegated_op"] is True
    assert events[("7", "7")]["debug_data"] == [{"shape": [2, 2], "dtype": "float32"}]
    assert events[("DELEGATE_CALL", "null")]["timings"] == 2
