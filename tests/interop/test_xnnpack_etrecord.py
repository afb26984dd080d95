"""Lowered modules' named data in ETRecords, both ways with upstream ExecuTorch 1.5.1 (etlab's own layout:
tests/delegation/test_xnnpack_etrecord.py):
- etlab's record of an XNNPACK program, saved in upstream's layout, is read by upstream's parse_etrecord with
  every lowered module's named data (the same keys and bytes as etlab's program holds);
- upstream's record of its own XNNPACK program (generate_etrecord of the lowered edge program) is read by
  etlab with the named data upstream wrote, and the program etlab re-emits from that record alone runs
  like upstream's .pte.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from etlab.compiler import EdgeProgramManager, to_edge_transform_and_lower
from etlab.compiler.backends.xnnpack import XnnpackPartitioner
from etlab.etrecord import parse_etrecord
from etlab.facts.lowered import lowered_modules
from etlab.models import zoo
from etlab.runtime import Runtime
from tests.interop.conftest import HERE, ZOO, run_ref

pytestmark = [pytest.mark.interop, pytest.mark.xdist_group("xnnpack_etrecord_interop")]

REF_SCRIPT = HERE / "ref_xnnpack_etrecord.py"


def _named(ep) -> dict[str, str]:
    out = {}
    for _, _, mod in lowered_modules(ep.graph_module):
        store = mod.named_data_store_output
        for key, entry in store.pte_data.items():
            out[key] = hashlib.sha256(bytes(store.buffers[entry.buffer_index])).hexdigest()
    return out


@pytest.fixture(scope="module")
def both_ways(ref_python, tmp_path_factory):
    """etlab's record of the mlp (upstream layout), and upstream's answers: what it read from that record,
    what it wrote in its own record of its own lowering (one reference process)."""
    out = tmp_path_factory.mktemp("xnnpack_etrecord")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = zoo.make_mlp()
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=[XnnpackPartitioner()],
                                       generate_etrecord=True)
    edge.to_executorch().get_etrecord().save(out / "ours.etrecord", format="upstream")
    done = run_ref(ref_python, REF_SCRIPT, "--read", out / "ours.etrecord", "--write", ZOO, "mlp", out)
    answers = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            answers.update(json.loads(line))
    return out, _named(edge.exported_program()), answers


def test_upstream_reads_the_named_data_of_etlabs_record(both_ways):
    _, ours, answers = both_ways
    assert answers["read"] == ours and len(ours) == 6


def test_etlab_re_emits_upstreams_record_alone(both_ways):
    out, _, answers = both_ways
    recorded = parse_etrecord(out / "mlp.etrecord").edge_dialect_program
    recorded = recorded["forward"] if isinstance(recorded, dict) else recorded
    assert _named(recorded) == answers["written"] and len(answers["written"]) == 6
    again = EdgeProgramManager({"forward": recorded}).to_executorch().buffer
    inputs = torch.load(out / "mlp_inputs.pt", weights_only=True)
    runtime = Runtime.get()
    want = runtime.load_program(out / "mlp.pte").load_method("forward").execute(list(inputs))
    got = runtime.load_program(again).load_method("forward").execute(list(inputs))
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
