"""Our Inspector on upstream-written .etdp + debug buffer vs upstream's Inspector on the same files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from etlab.etdump import read_etdump
from etlab.inspector import FRAMEWORK_EVENT_NAMES, Inspector
from etlab.models.zoo import make_mlp
from etlab.schema import deserialize_etdump
from tests.interop.conftest import ET_REF, REF_TOOLS, REPO, ZOO, cache_key, cached_build, run_ref

pytestmark = pytest.mark.interop

MODELS = ("mlp", "cnn", "transformer")


@pytest.fixture(scope="session")
def upstream_events(ref_python, upstream_artifacts, tmp_path_factory) -> dict[str, dict]:
    """Upstream Inspector's event blocks (ref_tools.py inspect-events) for each model's run."""
    out = {}
    for m in MODELS:
        d = upstream_artifacts[m]
        js = tmp_path_factory.mktemp("inspect") / f"{m}.json"
        run_ref(ref_python, REF_TOOLS, "inspect-events", d / "run.etdp", "--debug-buffer", d / "run.bin", "--json", js)
        out[m] = json.loads(js.read_text())
    return out


def _describe(t):
    if isinstance(t, list):
        return [_describe(x) for x in t]
    c = t.detach().contiguous()
    return {"shape": list(c.shape), "dtype": str(c.dtype).replace("torch.", ""),
            "sha256": hashlib.sha256(c.numpy().tobytes()).hexdigest()}


@pytest.mark.parametrize("model", MODELS)
def test_same_events_counts_and_p50_as_upstream(model, upstream_artifacts, upstream_events):
    d = upstream_artifacts[model]
    ref = upstream_events[model]
    ins = Inspector(etdump_path=d / "run.etdp", debug_buffer_path=d / "run.bin")
    ours = ins.event_blocks
    assert [b.name for b in ours] == [b["name"] for b in ref["event_blocks"]]
    assert sum(len(b.events) for b in ours) == ref["event_count"] > 0
    for ob, rb in zip(ours, ref["event_blocks"]):
        assert ob.bundled_input_index == rb["bundled_input_index"]
        assert [e.name for e in ob.events] == [e["name"] for e in rb["events"]]
        for oe, re_ in zip(ob.events, rb["events"]):
            assert oe.perf_data.raw == pytest.approx(re_["perf_data"], rel=1e-12)
            assert oe.perf_data.p50 == pytest.approx(float(np.percentile(re_["perf_data"], 50)), rel=1e-12)
            assert oe.instruction_id == re_["instruction_id"]
            assert oe.delegate_debug_identifier == re_["delegate_debug_identifier"]
            assert oe.is_delegated_op == re_["is_delegated_op"]
            assert oe.start_time == re_["start_time"]
            assert bool(oe.debug_data) == re_["has_debug_data"]
            if re_["debug_data"]:
                assert [_describe(t) for t in oe.debug_data] == re_["debug_data"]
    # the dataframe carries the same rows
    df = ins.to_dataframe()
    assert df["event_name"].tolist() == [e["name"] for b in ref["event_blocks"] for e in b["events"]]
    assert df["p50 (ms)"].to_numpy() == pytest.approx(
        [float(np.percentile(e["perf_data"], 50)) for b in ref["event_blocks"] for e in b["events"]], rel=1e-12)


@pytest.mark.parametrize("model", MODELS)
def test_fast_reader_matches_generic_decoder_on_upstream_dump(model, upstream_artifacts):
    path = upstream_artifacts[model] / "run.etdp"
    assert read_etdump(path).to_model() == deserialize_etdump(path.read_bytes())


def test_mlp_intermediates_match_torch(upstream_artifacts):
    d = upstream_artifacts["mlp"]
    ins = Inspector(etdump_path=d / "run.etdp", debug_buffer_path=d / "run.bin")
    execute = next(b for b in ins.event_blocks if b.name == "Execute")
    kernels = {e.instruction_id: e for e in execute.events if e.name.startswith("native_call_")}
    model, (x,) = make_mlp()
    with torch.no_grad():
        fc1 = model.fc1(x)
        expected = model(x)
    assert kernels[0].debug_data[0].shape == model.fc1.weight.T.shape   # permute_copy of fc1's weight
    torch.testing.assert_close(kernels[0].debug_data[0], model.fc1.weight.T.detach())
    torch.testing.assert_close(kernels[1].debug_data[0], fc1)            # addmm: the first layer
    torch.testing.assert_close(kernels[2].debug_data[0], torch.relu(fc1))
    torch.testing.assert_close(execute.run_output[0], expected)
    upstream_out = torch.load(d / "upstream_outputs.pt", weights_only=True)
    assert torch.equal(execute.run_output[0], upstream_out[0])


@pytest.fixture(scope="session")
def xnnpack_run(ref_python) -> Path:
    """An XNNPACK-delegated CNN exported and run (3 iterations) by upstream, and upstream
    Inspector's events for it; cached next to the interop artifacts."""
    def build(tmp: Path) -> None:
        run_ref(ref_python, ET_REF, "export", f"{ZOO}:make_cnn", "--xnnpack", "--out", tmp)
        run_ref(ref_python, ET_REF, "run", tmp / "model.pte", "--inputs", tmp / "inputs.pt",
                "--etdump", tmp / "run.etdp", "--iters", "3")
        run_ref(ref_python, REF_TOOLS, "inspect-events", tmp / "run.etdp", "--json", tmp / "events.json")

    return cached_build("inspector-xnnpack", cache_key()[:16], build)


def test_xnnpack_delegate_events_match_upstream(xnnpack_run):
    ref = json.loads((xnnpack_run / "events.json").read_text())
    ins = Inspector(etdump_path=xnnpack_run / "run.etdp")
    ours = [e for b in ins.event_blocks for e in b.events]
    theirs = [e for b in ref["event_blocks"] for e in b["events"]]
    assert [b.name for b in ins.event_blocks] == [b["name"] for b in ref["event_blocks"]]
    assert len(ours) == ref["event_count"]
    delegated = [e for e in ours if e.is_delegated_op]
    assert delegated and all(isinstance(e.delegate_debug_identifier, str) for e in delegated)
    for o, t in zip(ours, theirs):
        assert (o.name, o.delegate_debug_identifier, o.is_delegated_op, o.instruction_id) == (
            t["name"], t["delegate_debug_identifier"], t["is_delegated_op"], t["instruction_id"])
        assert o.perf_data.raw == pytest.approx(t["perf_data"], rel=1e-12, abs=1e-15)
        assert o.perf_data.p50 == pytest.approx(float(np.percentile(t["perf_data"], 50)), rel=1e-12, abs=1e-15)


# -- with upstream's ETRecord: handles, numeric gap, pairing ----------------------------------------------

GAP_MODELS = ("mlp", "cnn")


@pytest.fixture(scope="session")
def upstream_with_record(ref_python, upstream_artifacts) -> Path:
    """Upstream's Inspector on its own run + ETRecord (the interop artifacts): per model, its numeric
    gap (et_ref.py gap, MSE) and its events; cached like the artifacts (built once per key)."""
    def build(tmp: Path) -> None:
        for m in GAP_MODELS:
            d = upstream_artifacts[m]
            run_ref(ref_python, ET_REF, "gap", d / "run.etdp", "--etrecord", d / "model.etrecord",
                    "--debug-buffer", d / "run.bin", "--json", tmp / f"gap_{m}.json")
        d = upstream_artifacts["cnn"]
        run_ref(ref_python, REF_TOOLS, "inspect-events", d / "run.etdp", "--etrecord", d / "model.etrecord",
                "--json", tmp / "events_cnn.json")

    return cached_build("inspector-with-record", cache_key()[:16], build)


def _ours_with_record(d: Path) -> Inspector:
    return Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord"), debug_buffer_path=d / "run.bin")


@pytest.mark.parametrize("model", GAP_MODELS)
def test_numeric_gap_has_upstreams_rows_and_types(model, upstream_artifacts, upstream_with_record):
    """One row per runtime output upstream compares, batch norms (several outputs in the Edge graph)
    included; the same handles, runtime ops, value shapes and column types; gaps near zero on both
    sides (a portable run of the recorded graph)."""
    theirs = json.loads((upstream_with_record / f"gap_{model}.json").read_text())
    df = _ours_with_record(upstream_artifacts[model]).calculate_numeric_gap("MSE")
    assert set(theirs["columns"]) <= set(df.columns)
    assert len(df) == len(theirs["rows"]) > 0
    for ours, ref in zip(df.itertuples(index=False), theirs["rows"]):
        assert ours.aot_debug_handle == tuple(ref["aot_debug_handle"]) and isinstance(ours.aot_debug_handle, tuple)
        assert ours.runtime_debug_handle == tuple(ref["runtime_debug_handle"])
        assert ours.runtime_ops == ref["runtime_ops"]
        assert isinstance(ours.aot_ops, list) and all(isinstance(o, str) for o in ours.aot_ops)
        for value, want in ((ours.aot_intermediate_output, ref["aot_intermediate_output"]),
                            (ours.runtime_intermediate_output, ref["runtime_intermediate_output"])):
            assert isinstance(value, torch.Tensor)
            assert [list(value.shape), str(value.dtype)] == [want["tensor"], want["dtype"]]
        assert isinstance(ours.gap, list) and len(ours.gap) == len(ref["gap"]) == 1
        assert ours.gap[0] == pytest.approx(ref["gap"][0], abs=1e-9)
        assert isinstance(ours.stacktraces, dict)
    assert any("batch_norm" in " ".join(r.runtime_ops) for r in df.itertuples()) == (model == "cnn")


def test_event_debug_handles_have_upstreams_types(upstream_artifacts, upstream_with_record):
    ref = json.loads((upstream_with_record / "events_cnn.json").read_text())
    ours = [e for b in _ours_with_record(upstream_artifacts["cnn"]).event_blocks for e in b.events]
    theirs = [e for b in ref["event_blocks"] for e in b["events"]]
    assert [e.name for e in ours] == [e["name"] for e in theirs]
    kernels = 0
    for o, t in zip(ours, theirs):
        if o.name in FRAMEWORK_EVENT_NAMES:
            continue  # upstream gives Method::init the handles of instruction 0 (its instruction id); ours: none
        want = t["debug_handles"]
        assert (list(o.debug_handles) if isinstance(o.debug_handles, tuple) else o.debug_handles) == want, o.name
        kernels += isinstance(want, int) and isinstance(o.debug_handles, int)
    assert kernels > 40


def _etlab(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etlab.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_wrong_upstream_etrecord_is_named_and_strict_refuses_it(upstream_artifacts):
    cnn, mlp = upstream_artifacts["cnn"], upstream_artifacts["mlp"]
    out = _etlab("inspect", cnn / "run.etdp", "--etrecord", mlp / "model.etrecord")
    assert out.returncode == 0 and "etlab inspect: warning:" in out.stderr
    assert f"{cnn / 'run.etdp'} does not match {mlp / 'model.etrecord'}" in out.stderr
    strict = _etlab("inspect", cnn / "run.etdp", "--etrecord", mlp / "model.etrecord", "--strict")
    assert strict.returncode == 2 and "does not match" in strict.stderr and strict.stdout == ""
    right = _etlab("inspect", cnn / "run.etdp", "--etrecord", cnn / "model.etrecord", "--strict")
    assert right.returncode == 0 and "warning" not in right.stderr, right.stderr
    # an MLP run has no more instructions than the CNN's record and all are kernel calls: the
    # recorded operators tell them apart
    with pytest.warns(RuntimeWarning, match=r"8 of 8 kernel calls ran another operator .* records convolution "
                                            r"but the run called permute_copy.out"):
        Inspector(etdump_path=mlp / "run.etdp", etrecord=str(cnn / "model.etrecord"))
    for m in MODELS:
        assert Inspector(etdump_path=upstream_artifacts[m] / "run.etdp",
                         etrecord=str(upstream_artifacts[m] / "model.etrecord"), strict=True).pairing_mismatch is None
