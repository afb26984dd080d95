"""etlab's ETDump with allocation events (trace_allocations) read by upstream ExecuTorch 1.5.1.

Upstream's ETDump reader (`deserialize_from_etdump_flatcc`, under its Inspector) reads every block, allocator
and allocation event as etlab wrote them. Upstream's Inspector itself accepts no ETDump holding allocation
events, though its own runtime writes them (ETDumpGen::track_allocation adds them to the running block): its
`find_populated_event` knows profile and debug events only and raises "Unable to find populated event". The
second test pins that, also for an ETDump holding one allocation event and nothing else, so that the day
upstream reads them this test says so, and shows the same trace written with `allocation_events=False` read.
"""

from __future__ import annotations

import json

import pytest
import torch

from etlab.runtime import Runtime, register_kernel, unregister_kernel
from etlab.schema import deserialize_etdump, serialize_etdump
from etlab.schema import etdump as E
from tests.interop.conftest import run_ref
from tests.runtime._programs import PlanBuilder, ProgramBuilder

pytestmark = [pytest.mark.interop]

TEMP_BYTES = 50_001

_READ = """
import json, sys
from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc
dump = deserialize_from_etdump_flatcc(open(sys.argv[1], "rb").read())
blocks = []
for run in dump.run_data:
    events = []
    for e in run.events or []:
        if e.allocation_event is not None:
            events.append(["A", e.allocation_event.allocator_id, e.allocation_event.allocation_size])
        elif e.profile_event is not None:
            p = e.profile_event
            events.append(["P", p.name, p.chain_index, p.instruction_id])
        else:
            events.append(["D"])
    blocks.append({"name": run.name, "allocators": [a.name for a in run.allocators or []], "events": events})
json.dump(blocks, open(sys.argv[2], "w"))
"""

_INSPECT = """
from executorch.devtools import Inspector
refused = {}
for path in (sys.argv[1], sys.argv[3], sys.argv[5]):
    try:
        Inspector(etdump_path=path)
        refused[path] = None
    except ValueError as e:
        refused[path] = str(e)
json.dump(refused, open(sys.argv[4], "w"))
"""


def _scratch(x, out, _ret):
    torch.empty(TEMP_BYTES, dtype=torch.uint8).fill_(0)
    out.copy_(x)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """An ETDump of a load and a run with a kernel temporary (instruction 1), both cores' worth of events."""
    register_kernel("etlab_test::interop_scratch.out", _scratch)
    try:
        b = PlanBuilder()
        x, a, c = b.tensor([8]), b.tensor([8]), b.tensor([8])
        b.kernel("aten::add.out", x, x, b.int(1), a, a)
        b.kernel("etlab_test::interop_scratch.out", a, c, c)
        program = Runtime.get().load_program(ProgramBuilder().serialize([b.plan([x], [c])]), enable_etdump=True,
                                             trace_allocations=True)
        program.load_method("forward").execute([torch.ones(8)])
        path = tmp_path_factory.mktemp("memory_interop") / "run.etdp"
        program.write_etdump_result_to_file(path)
        program.write_etdump_result_to_file(path.with_name("timings.etdp"), allocation_events=False)
    finally:
        unregister_kernel("etlab_test::interop_scratch.out")
    return path


def _etlab_blocks(path) -> list[dict]:
    blocks = []
    for run in deserialize_etdump(path.read_bytes()).run_data:
        events = []
        for e in run.events:
            if e.allocation_event:
                events.append(["A", e.allocation_event.allocator_id, e.allocation_event.allocation_size])
            elif e.profile_event:
                p = e.profile_event
                events.append(["P", p.name, p.chain_index, p.instruction_id])
            else:
                events.append(["D"])
        blocks.append({"name": run.name, "allocators": [a.name for a in run.allocators or []], "events": events})
    return blocks


@pytest.fixture(scope="module")
def upstream(traced, ref_python, tmp_path_factory):
    """What upstream made of the ETDump: its reader's blocks, and its Inspector's error (or None) for the
    ETDump and for one holding a single allocation event and nothing else (one subprocess)."""
    folder = tmp_path_factory.mktemp("memory_interop_ref")
    (folder / "one.etdp").write_bytes(serialize_etdump(E.ETDump(version=0, run_data=[E.RunData(
        name="Execute", allocators=[E.Allocator("planned")],
        events=[E.Event(allocation_event=E.AllocationEvent(allocator_id=1, allocation_size=64))])])))
    script = folder / "ref_memory_events.py"
    script.write_text(_READ + _INSPECT)
    run_ref(ref_python, script, traced, folder / "blocks.json", folder / "one.etdp", folder / "inspector.json",
            traced.with_name("timings.etdp"))
    return json.loads((folder / "blocks.json").read_text()), json.loads((folder / "inspector.json").read_text())


def test_upstream_reads_every_allocator_and_allocation_event(traced, upstream):
    blocks, _ = upstream
    assert blocks == _etlab_blocks(traced)
    load, run = blocks
    assert load["allocators"][:2] == ["planned:1", "method"] and "peak_rss" in load["allocators"]
    temp = run["allocators"].index("temp") + 1  # ids count from 1, as upstream's ETDumpGen numbers them
    at = run["events"].index(["A", temp, TEMP_BYTES])
    assert run["events"][at + 1] == ["P", "native_call_interop_scratch.out", 0, 1]  # the next profile event


def test_upstreams_inspector_refuses_any_allocation_event(traced, upstream):
    _, refused = upstream
    # etlab's trace, one allocation event alone: refused; the same trace without its allocation events: read
    assert list(refused.values()) == ["Unable to find populated event"] * 2 + [None], refused
