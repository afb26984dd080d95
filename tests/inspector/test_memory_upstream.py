"""Upstream's ETDumps with allocation events read into the same memory tables: the file is written by
upstream ExecuTorch 1.5.1's own serializer (the oracle, in its venv) in the layout its ETDumpGen gives a
block (allocators listed first, ids counting from 1, an allocation written before the profile event
of the instruction that made it)."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from etlab.inspector import Inspector
from tests.interop.conftest import setup_reference

pytestmark = pytest.mark.interop

SCRIPT = textwrap.dedent("""
    import sys
    from executorch.devtools.etdump import schema_flatcc as f
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc, serialize_to_etdump_flatcc

    def prof(name, instr, start, chain=0):
        return f.Event(profile_event=f.ProfileEvent(name=name, chain_index=chain, instruction_id=instr,
                       delegate_debug_id_int=-1, delegate_debug_id_str=None, delegate_debug_metadata=None,
                       start_time=start, end_time=start + 10), allocation_event=None, debug_event=None)

    def alloc(i, size):
        return f.Event(profile_event=None, debug_event=None,
                       allocation_event=f.AllocationEvent(allocator_id=i, allocation_size=size))

    load = f.RunData(name="Default", bundled_input_index=-1,
                     allocators=[f.Allocator(name="method_allocator"), f.Allocator(name="planned_memory")],
                     events=[alloc(1, 480), alloc(2, 4096), alloc(1, 32), prof("Method::init", 0, 5, chain=-1),
                             prof("Program::load_method", 0, 1, chain=-1)])
    run = f.RunData(name="Execute", bundled_input_index=-1, allocators=[f.Allocator(name="temp_allocator")],
                    events=[alloc(1, 256), prof("native_call_convolution.out", 0, 100), prof("OPERATOR_CALL", 0, 99),
                            prof("native_call_relu.out", 1, 120), prof("OPERATOR_CALL", 1, 119),
                            alloc(1, 64), alloc(1, 64), prof("native_call_addmm.out", 2, 140),
                            prof("OPERATOR_CALL", 2, 139), prof("Method::execute", 0, 90, chain=-1)])
    data = serialize_to_etdump_flatcc(f.ETDumpFlatCC(version=0, run_data=[load, run]))
    data = len(data).to_bytes(4, "little") + data  # size-prefixed, as the runtime writes an .etdp
    back = deserialize_from_etdump_flatcc(data)  # upstream reads it back
    assert [a.name for a in back.run_data[0].allocators] == ["method_allocator", "planned_memory"]
    open(sys.argv[1], "wb").write(data)
""")


@pytest.fixture(scope="module")
def upstream_dump(tmp_path_factory):
    try:
        ref = setup_reference()
    except Exception as e:  # as the interop fixtures: a missing oracle is a failure, not a skip
        pytest.fail(f"upstream ExecuTorch reference environment unavailable:\n{e}", pytrace=False)
    path = tmp_path_factory.mktemp("upstream_memory") / "run.etdp"
    script = path.with_name("write.py")
    script.write_text(SCRIPT)
    subprocess.run([ref, str(script), str(path)], check=True, capture_output=True, timeout=300)
    return path


def test_upstream_allocation_events_read_into_the_same_tables(upstream_dump):
    ins = Inspector(etdump_path=upstream_dump)
    df = ins.memory_dataframe()
    load = df[df["phase"] == "load"]
    assert load["allocator"].tolist() == ["method_allocator", "planned_memory", "method_allocator"]  # ids from 1
    assert load["size"].tolist() == [480, 4096, 32] and load["kind"].eq("other").all()
    assert load["event"].eq("Method::init").all() and load["instruction"].isna().all()
    run = df[df["phase"] == "run"]
    assert run["allocator"].eq("temp_allocator").all()
    assert run["instruction"].tolist() == [0, 2, 2]
    assert run["op"].tolist() == ["convolution.out", "addmm.out", "addmm.out"]
    summary = ins.memory_summary()
    owners = summary.owners.set_index("owner")
    assert owners.loc["method_allocator", "load_bytes"] == 512 and owners.loc["planned_memory", "load_bytes"] == 4096
    # another writer's allocator accumulates over the run (a bump allocator is not reset by this reader)
    assert owners.loc["temp_allocator", "run_peak_bytes"] == 384
    assert summary.peak_bytes == 512 + 4096 + 384 and summary.peak_instruction == 2
    # the older property names them alike
    assert ins.allocations["allocator_name"].tolist() == df["allocator"].tolist()
