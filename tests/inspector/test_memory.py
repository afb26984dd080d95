"""Inspector.memory_dataframe() / memory_summary(): planted allocations (a kernel's temporary, a delegate's
workspace and packed weights, unplanned tensors allocated and released, arenas and the method allocator
at load, RSS growth) appear with their sizes at their instructions, the peaks add up, and a hostile or
foreign allocator list does not break the reading."""

from __future__ import annotations

import numpy as np
import pytest

from etlab.errors import FormatError
from etlab.inspector import Inspector
from etlab.schema import etdump as s
from etlab.schema import serialize_etdump
from tests.inspector._memory_dumps import Planted, memory_dump

P = Planted()


def _inspector(dump: s.ETDump) -> Inspector:
    return Inspector(etdump_data=serialize_etdump(dump))


def test_planted_allocations_sit_at_their_instructions():
    df = _inspector(memory_dump(runs=3)).memory_dataframe()
    load = df[df["phase"] == "load"]
    assert dict(zip(load["allocator"], load["size"])) == {
        "planned:1": P.arena, "method": P.method, "delegate:XnnpackBackend:packed_weights": P.packed,
        "rss": P.load_rss, "peak_rss": P.load_peak_rss}
    assert load["instruction"].isna().all() and (load["load"] == 0).all()
    assert load.loc[load["allocator"] == "planned:1", "mem_id"].item() == 1
    run = df[df["phase"] == "run"]
    assert sorted(run["run"].unique().tolist()) == [0, 1, 2]
    temp = run[run["kind"] == "temp"]
    assert temp["size"].tolist() == [P.temp] * 3 and temp["instruction"].tolist() == [0] * 3
    assert temp["op"].tolist() == ["convolution.out"] * 3
    ws = run[run["allocator"] == "delegate:XnnpackBackend:workspace"]
    assert ws["size"].tolist() == [P.workspace] * 3 and ws["instruction"].tolist() == [2] * 3
    assert ws["owner"].tolist() == ["delegate:XnnpackBackend"] * 3 and ws["backend"].tolist() == ["XnnpackBackend"] * 3
    unplanned = run[run["kind"] == "unplanned"]
    assert unplanned["bytes"].tolist() == [b for u in P.unplanned for b in (u, -u)]
    assert unplanned["instruction"].tolist() == [1, 3] * 3
    rss = run[run["kind"] == "rss"]
    assert rss["run"].tolist() == [0] and rss["instruction"].isna().all() and rss["event"].item() == s.METHOD_EXECUTE


def test_peaks_by_owner_load_against_run_and_the_timeline():
    summary = _inspector(memory_dump(runs=3)).memory_summary()
    owners = summary.owners.set_index("owner")
    assert owners.loc["planned:1", "load_bytes"] == P.arena and owners.loc["planned:1", "run_peak_bytes"] == 0
    assert owners.loc["method", "load_bytes"] == P.method
    d = owners.loc["delegate:XnnpackBackend"]
    assert (d["load_bytes"], d["run_peak_bytes"], d["peak_instruction"]) == (P.packed, P.workspace, 2)
    t = owners.loc["temp"]
    assert (t["load_bytes"], t["run_peak_bytes"], t["peak_instruction"]) == (0, P.temp, 0)
    u = owners.loc["unplanned"]
    assert (u["run_peak_bytes"], u["peak_run"], u["peak_instruction"]) == (max(P.unplanned), 1, 1)
    assert "rss" not in owners.index and "peak_rss" not in owners.index  # measurements, not owners
    assert summary.owners["kind"].tolist() == ["planned", "method", "delegate", "temp", "unplanned"]
    peak, run, instr = P.peak(3)
    assert (summary.peak_bytes, summary.peak_run, summary.peak_instruction) == (peak, -run, -instr)
    assert summary.load_bytes == P.held and summary.runs == 3
    for r in range(3):
        got = summary.timeline[summary.timeline["run"] == r].set_index("instruction")["bytes"].to_dict()
        assert got == P.run_bytes(r)
    phases = summary.phases.set_index("phase")
    assert phases.loc["load"].tolist() == [P.held, P.load_rss, P.load_peak_rss]
    assert phases.loc["run"].tolist() == [peak - P.held, P.run_rss, P.run_rss]
    assert phases.loc["load + run", "tracked_bytes"] == peak
    assert "tracked peak 78,264 bytes" in repr(summary)
    # per block: each owner's bytes there and each run's tracked peak (what a fleet stores per run)
    blocks = summary.blocks
    tracked = blocks[blocks["owner"] == "tracked"]
    assert tracked["bytes"].tolist() == [max(P.run_bytes(r).values()) for r in range(3)]
    assert tracked["instruction"].tolist() == [2, 2, 2] and tracked["block"].tolist() == [1, 2, 3]
    un = blocks[blocks["owner"] == "unplanned"]
    assert un["bytes"].tolist() == list(P.unplanned) and un["instruction"].tolist() == [1, 1, 1]
    assert blocks[(blocks["owner"] == "rss")]["bytes"].tolist() == [P.load_rss, P.run_rss]


def test_ids_counted_from_zero_read_the_same():
    one = _inspector(memory_dump(runs=2)).memory_dataframe()
    zero = _inspector(memory_dump(runs=2, base=0)).memory_dataframe()
    assert zero["allocator"].tolist() == one["allocator"].tolist()
    assert (zero["allocator_id"] == one["allocator_id"] - 1).all()
    # the older property agrees with the table
    allocs = _inspector(memory_dump(runs=2)).allocations
    assert allocs["allocator_name"].tolist() == one["allocator"].tolist()
    assert allocs["allocation_size"].tolist() == one["size"].tolist()


def test_unknown_ids_and_other_writers_names_are_listed_not_fatal():
    dump = memory_dump(runs=1)
    run = dump.run_data[1]
    run.allocators = [s.Allocator("my arena"), s.Allocator(None)]  # another writer's names, one unnamed
    run.events = [e for e in run.events if e.allocation_event is None][:2]
    run.events.insert(0, s.Event(allocation_event=s.AllocationEvent(allocator_id=1, allocation_size=10)))
    run.events.insert(0, s.Event(allocation_event=s.AllocationEvent(allocator_id=99, allocation_size=7)))
    run.events.insert(0, s.Event(allocation_event=s.AllocationEvent(allocator_id=-5, allocation_size=(1 << 64) - 1)))
    with pytest.raises(FormatError, match=r"run block 1: an allocation event's size 18446744073709551615 is not a"):
        _inspector(dump).memory_dataframe()
    run.events[0].allocation_event.allocation_size = 3
    df = _inspector(dump).memory_dataframe()
    got = df[df["phase"] == "run"]
    assert got["allocator"].isna().tolist() == [True, True, False] and got["allocator"].iat[2] == "my arena"
    assert got["kind"].tolist() == ["other"] * 3
    assert got["owner"].tolist() == ["<unnamed allocator>", "<unnamed allocator>", "my arena"]
    assert got["size"].tolist() == [3, 7, 10]
    summary = _inspector(dump).memory_summary()
    assert set(summary.owners["owner"]) >= {"my arena", "<unnamed allocator>"}


def test_a_run_without_allocation_events():
    from etlab.etdump._synthetic import synthetic_etdump

    ins = _inspector(synthetic_etdump(2, 3))
    df = ins.memory_dataframe()
    assert len(df) == 0 and "allocator" in df.columns
    summary = ins.memory_summary()
    assert summary.peak_bytes == 0 and summary.peak_run is None and len(summary.owners) == 0
    assert len(summary.timeline) == 0 and summary.runs == 2


def test_planned_against_observed_for_dynamic_shapes(tmp_path):
    """A dynamic-shape program (rows <= 8) run with 2 and 5 rows, intermediates logged: each planned tensor's
    declared upper bound against the largest size it ran with, and the arena's lower bound against the
    bytes live with those sizes."""
    torch = pytest.importorskip("torch")
    from torch.export import Dim, export

    from etlab.compiler import to_edge
    from etlab.runtime import DebugLevel, Runtime

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 2.0) + 1.0

    et = to_edge(export(M(), (torch.randn(4, 3),), dynamic_shapes=({0: Dim("rows", max=8)},))).to_executorch()
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, trace_allocations=True,
                                         etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    method = program.load_method("forward")
    for rows in (2, 5):
        method.execute([torch.randn(rows, 3)])
    program.write_etdump_result_to_file(tmp_path / "run.etdp", tmp_path / "run.bin")
    ins = Inspector(etdump_path=tmp_path / "run.etdp", debug_buffer_path=tmp_path / "run.bin")
    summary = ins.memory_summary(et)
    t = summary.tensors
    assert len(t) == 3 and t["dynamic"].all()
    assert set(t["declared_shape"]) == {(8, 3)} and set(t["ran_shape"]) == {(5, 3)}
    assert (t["declared_bytes"] == 8 * 3 * 4).all() and (t["ran_bytes"] == 5 * 3 * 4).all() and (t["runs"] == 2).all()
    a = summary.arenas.set_index("mem_id").loc[1]
    assert a["arena_bytes"] == et.memory_plans["forward"].buffer_sizes[1]
    assert a["lower_bound"] <= a["arena_bytes"]
    # the input (not logged) counts at its declared 96 bytes, the output that ran at 60
    assert a["observed_peak"] == 96 + 60 < a["lower_bound"]
    # the same plan given as a path, or to the Inspector, gives the same tables
    (tmp_path / "m.pte").write_bytes(et.buffer)
    again = Inspector(etdump_path=tmp_path / "run.etdp", debug_buffer_path=tmp_path / "run.bin",
                      pte=tmp_path / "m.pte").memory_summary()
    assert again.tensors.equals(t) and np.array_equal(again.arenas.to_numpy(), summary.arenas.to_numpy())
    with pytest.raises(ValueError, match="no method 'nope'"):
        ins.memory_summary(et, method="nope")
