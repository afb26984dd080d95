"""Upstream's .etrecord in etlab's Inspector, and etlab's format="upstream" .etrecord in upstream's.

- etlab reads the ETRecords upstream wrote for the zoo models: the Inspector's event rows, op_types,
  module_hierarchy and stack traces equal upstream Inspector's on the same .etdp/.etrecord/debug
  buffer, and the numeric gap agrees with upstream's calculate_numeric_gap (within 1e-6 relative)
  where upstream computes one; representative inputs are the ones upstream recorded.
- upstream's parse_etrecord and Inspector read an ETRecord etlab wrote with format="upstream" (for
  an etlab-compiled, DemoBackend-delegated program run by upstream's runtime) and give the same op
  names, module hierarchy and stack traces as etlab's Inspector on the same files.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
import torch

from etlab.etrecord import parse_etrecord
from etlab.inspector import Inspector
from tests.interop.conftest import ET_REF, cache_key, cache_root, run_ref

pytestmark = pytest.mark.interop

MODELS = ("mlp", "cnn", "transformer")
JOINED = ("event_block_name", "event_name", "op_types", "module_hierarchy", "stack_traces",
          "delegate_debug_identifier", "is_delegated_op", "delegate_backend_name")


def _jsonable(v):
    return json.loads(json.dumps(v, default=str))


def _same_op_types(ours: list, theirs) -> bool:
    """upstream's frame abbreviates a long op_types list to a string; etlab keeps the list."""
    if isinstance(theirs, str):
        return len(ours) > 2 and theirs == f"['{ours[0]}', '{ours[1]}' ... '{ours[-1]}'] ({len(ours)} total)"
    return ours == theirs


def assert_same_rows(ours, theirs: dict, *, delegate_ops_upstream_cannot_see: bool = False) -> None:
    """Our Inspector's dataframe vs upstream's (et_ref.py inspect JSON), on the joined columns.

    delegate_ops_upstream_cannot_see: the record's edge graph is lowered (etlab's), and upstream's
    Inspector looks for nodes only in the top graph, not inside lowered modules: on rows of a
    delegate, upstream shows no ops and etlab shows the partition's. Also, upstream's loader renames
    multi-output nodes after their operator (etlab's export names them differently), so the
    stack_traces / module_hierarchy values are compared, not their node-name keys."""
    rows = theirs["rows"]
    assert len(ours) == len(rows) > 0
    joined = 0
    for i, ((_, o), t) in enumerate(zip(ours.iterrows(), rows)):
        cols = JOINED
        if delegate_ops_upstream_cannot_see and t["delegate_backend_name"]:
            assert t["op_types"] == [] and o["op_types"], f"row {i} ({t['event_name']})"
            cols = [c for c in JOINED if c not in ("op_types", "module_hierarchy", "stack_traces")]
        for col in cols:
            a, b = _jsonable(o[col]), t[col]
            if delegate_ops_upstream_cannot_see and col in ("module_hierarchy", "stack_traces"):
                a, b = sorted(map(json.dumps, a.values())), sorted(map(json.dumps, b.values()))
            ok = _same_op_types(a, b) if col == "op_types" else a == b
            assert ok, f"row {i} ({t['event_name']}) {col}: etlab {str(a)[:300]} != upstream {str(b)[:300]}"
        joined += bool(t["op_types"])
    assert joined > 0  # the ETRecord did join: rows carry ops


def _upstream_json(ref_python, artifacts, cmd: str, models) -> dict[str, dict]:
    """et_ref.py `cmd` (inspect / gap) with upstream's .etrecord and debug buffer, per model, as JSON;
    cached next to the interop artifacts (same key), so a second session runs no subprocess."""
    d = cache_root() / f"upstream-etrecord-{cache_key()[:16]}"
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    with open(cache_root() / f".{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers: one runs upstream
        for m in models:
            js = d / f"{cmd}-{m}.json"
            if not js.is_file():
                a = artifacts[m]
                tmp = d / f".{js.name}.tmp"
                run_ref(ref_python, ET_REF, cmd, a / "run.etdp", "--etrecord", a / "model.etrecord",
                        "--debug-buffer", a / "run.bin", "--json", tmp)
                os.replace(tmp, js)
            out[m] = json.loads(js.read_text())
    return out


@pytest.fixture(scope="session")
def upstream_inspect(ref_python, upstream_artifacts) -> dict[str, dict]:
    return _upstream_json(ref_python, upstream_artifacts, "inspect", MODELS)


@pytest.fixture(scope="session")
def upstream_gaps(ref_python, upstream_artifacts) -> dict[str, dict]:
    # not the transformer: upstream's own gap fails on it (a shape mismatch in its code)
    return _upstream_json(ref_python, upstream_artifacts, "gap", ("mlp", "cnn"))


@pytest.mark.parametrize("model", MODELS)
def test_upstream_etrecord_joins_like_upstream(model, upstream_artifacts, upstream_inspect):
    d = upstream_artifacts[model]
    ins = Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord", debug_buffer_path=d / "run.bin")
    assert_same_rows(ins.to_dataframe(), upstream_inspect[model])


@pytest.mark.parametrize("model", MODELS)
def test_upstream_etrecord_contents(model, upstream_artifacts):
    d = upstream_artifacts[model]
    record = parse_etrecord(d / "model.etrecord")
    inputs = torch.load(d / "inputs.pt", weights_only=True)
    assert len(record._representative_inputs) == len(inputs)
    for a, b in zip(record._representative_inputs, inputs):
        assert torch.equal(a, b)
    assert record.exported_program is not None and record.export_graph_id
    # the rebuilt edge program computes what upstream's runtime computed
    with torch.no_grad():
        out = record.edge_dialect_program.module()(*inputs)
    upstream_out = torch.load(d / "upstream_outputs.pt", weights_only=True)
    torch.testing.assert_close(out if isinstance(out, torch.Tensor) else out[0], upstream_out[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_numeric_gap_agrees_with_upstream(model, upstream_artifacts, upstream_gaps):
    d = upstream_artifacts[model]
    ins = Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord", debug_buffer_path=d / "run.bin")
    ours = {tuple(r.aot_debug_handle): r.gap for r in ins.calculate_numeric_gap("MSE").itertuples()}
    theirs = {tuple(r["aot_debug_handle"]): r["gap"] for r in upstream_gaps[model]["rows"]}
    both = ours.keys() & theirs.keys()
    assert len(both) >= max(3, len(theirs) // 2), (sorted(ours), sorted(theirs))
    for h in both:
        assert len(ours[h]) == len(theirs[h])
        for a, b in zip(ours[h], theirs[h]):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-12), f"debug handle {h}"


# -- the other direction: upstream reads etlab's format="upstream" --------------------------------


@pytest.fixture(scope="session")
def etlab_written(ref_python, tmp_path_factory) -> Path:
    """An etlab-compiled CNN (DemoBackend-delegated), its ETRecord in upstream's layout, run by etlab's
    runtime (upstream's has no DemoBackend) with ETDump and debug buffer, and upstream Inspector's frame
    for those files."""
    from etlab.compiler import to_edge_transform_and_lower
    from etlab.compiler.backends import DemoPartitioner
    from etlab.models.zoo import make_cnn
    from etlab.runtime import Runtime

    d = tmp_path_factory.mktemp("etlab-upstream-format")
    model, inputs = make_cnn()
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[DemoPartitioner()],
                                     generate_etrecord=True).to_executorch()
    et.write_to_file(d / "model.pte")
    record = et.get_etrecord()
    record.update_representative_inputs(list(inputs))
    record.save(d / "model.etrecord", format="upstream")
    program = Runtime.get().load_program(d / "model.pte", enable_etdump=True, debug_buffer_size=16 << 20)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(d / "run.etdp", d / "run.bin")
    run_ref(ref_python, ET_REF, "inspect", d / "run.etdp", "--etrecord", d / "model.etrecord",
            "--debug-buffer", d / "run.bin", "--json", d / "upstream.json")
    return d


def test_upstream_inspector_reads_etlab_upstream_format(etlab_written):
    d = etlab_written
    theirs = json.loads((d / "upstream.json").read_text())
    with_ops = [r for r in theirs["rows"] if r["op_types"]]
    assert with_ops and all(r["module_hierarchy"] and r["stack_traces"] for r in with_ops)
    assert any(r["event_name"] == "DELEGATE_CALL" and r["delegate_backend_name"] == "DemoBackend"
               for r in theirs["rows"])  # upstream rebuilt the lowered modules
    ins = Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord", debug_buffer_path=d / "run.bin")
    assert_same_rows(ins.to_dataframe(), theirs, delegate_ops_upstream_cannot_see=True)
