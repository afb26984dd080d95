"""The event tracer on hand-built programs: blocks, event names and ids, debug levels, limits, files."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch

from etlab.errors import FormatError
from etlab.inspector import Inspector
from etlab.runtime import DebugLevel, LoadError, Runtime
from etlab.runtime import _event_tracer as event_tracer
from etlab.schema import deserialize_etdump, serialize_etdump, write_atomic
from etlab.schema.etdump import ValueType
from tests.runtime._programs import add_chain, branch_program

OUTPUT_CHAIN = (1 << 64) - 1


def _trace(tmp_path, data, inputs_list, **kwargs):
    program = Runtime.get().load_program(data, enable_etdump=True, **kwargs)
    method = program.load_method("forward")
    outs = [method.execute(inputs) for inputs in inputs_list]
    program.write_etdump_result_to_file(tmp_path / "t.etdp", tmp_path / "t.bin")
    dump = deserialize_etdump((tmp_path / "t.etdp").read_bytes())
    return program, dump, (tmp_path / "t.bin").read_bytes(), outs


def _profile(run):
    return [(e.profile_event.name, e.profile_event.chain_index, e.profile_event.instruction_id)
            for e in run.events if e.profile_event]


def _tensor(buf: bytes, t) -> torch.Tensor:
    n = 4 * int(torch.tensor(t.sizes).prod()) if t.sizes else 4
    return torch.frombuffer(bytearray(buf[t.offset : t.offset + n]), dtype=torch.float32).reshape(t.sizes)


def test_blocks_and_profile_events(tmp_path):
    data, _ = add_chain(3)
    _, dump, _, _ = _trace(tmp_path, data, [[torch.ones(2, 3)]] * 2)
    assert [r.name for r in dump.run_data] == ["Default", "Execute", "Execute"]
    assert _profile(dump.run_data[0]) == [("Method::init", -1, 0), ("Program::load_method", -1, 0)]
    per_kernel = [(name, 0, i) for i in range(3) for name in ("native_call_add.out", "OPERATOR_CALL")]
    for run in dump.run_data[1:]:
        assert _profile(run) == [*per_kernel, ("Method::execute", -1, 0)]
        assert not any(e.debug_event for e in run.events)  # no debug buffer: nothing logged
        events = [e.profile_event for e in run.events]
        assert all(e.end_time >= e.start_time > 0 for e in events)
        assert events[-1].start_time <= events[0].start_time and events[-1].end_time >= events[-2].end_time


def test_program_outputs_level_logs_outputs_only(tmp_path):
    data, _ = add_chain(2)
    x = torch.randn(2, 3)
    _, dump, buf, outs = _trace(tmp_path, data, [[x]], debug_buffer_size=1024,
                                etdump_debug_level=DebugLevel.PROGRAM_OUTPUTS)
    debug = [e.debug_event for e in dump.run_data[1].events if e.debug_event]
    assert len(debug) == 1
    assert (debug[0].chain_index, debug[0].instruction_id, debug[0].debug_entry.output.bool_val) == (
        OUTPUT_CHAIN, 0, True)
    torch.testing.assert_close(_tensor(buf, debug[0].debug_entry.tensor), outs[0][0])


def test_intermediate_level_logs_each_kernel_output_before_its_events(tmp_path):
    data, w = add_chain(3)
    x = torch.randn(2, 3)
    _, dump, buf, _ = _trace(tmp_path, data, [[x]], debug_buffer_size=4096)  # default level: intermediates
    kinds = [("D", e.debug_event.instruction_id) if e.debug_event else ("P", e.profile_event.name)
             for e in dump.run_data[1].events]
    assert kinds[:3] == [("D", 0), ("P", "native_call_add.out"), ("P", "OPERATOR_CALL")]
    debug = [e.debug_event for e in dump.run_data[1].events if e.debug_event]
    assert len(debug) == 4  # three kernels and the program output
    for k, d in enumerate(debug[:3]):
        t = d.debug_entry.tensor
        assert d.debug_entry.val == ValueType.Tensor and t.sizes == [2, 3] and t.strides == [3, 1]
        assert t.offset % 64 == 0
        torch.testing.assert_close(_tensor(buf, t), x + (k + 1) * w)


def test_control_flow_events(tmp_path):
    x = torch.ones(3)
    _, dump, _, _ = _trace(tmp_path, branch_program(), [[x, torch.tensor(True)], [x, torch.tensor(False)]])
    taken = [("JF_CALL", 0, 0), ("native_call_add.out", 0, 1), ("OPERATOR_CALL", 0, 1), ("MOVE_CALL", 0, 2),
             ("JF_CALL", 0, 3), ("Method::execute", -1, 0)]
    other = [("JF_CALL", 0, 0), ("native_call_mul.out", 0, 4), ("OPERATOR_CALL", 0, 4), ("MOVE_CALL", 0, 5),
             ("Method::execute", -1, 0)]
    assert [_profile(r) for r in dump.run_data[1:]] == [taken, other]


def test_full_event_buffer_drops_and_counts(tmp_path):
    data, _ = add_chain(3)
    with pytest.warns(RuntimeWarning, match="dropp"):
        program, dump, _, _ = _trace(tmp_path, data, [[torch.ones(2, 3)]] * 3, etdump_max_events=10)
    # 2 load events + 7 per run: 23 in all, 10 kept.
    assert program.etdump_dropped_events == 13
    assert sum(len(r.events) for r in dump.run_data) == 10


def test_full_debug_buffer_drops_values(tmp_path):
    data, _ = add_chain(3)
    with pytest.warns(RuntimeWarning, match="dropp"):
        program, dump, buf, _ = _trace(tmp_path, data, [[torch.ones(2, 3)]], debug_buffer_size=100)
    debug = [e for e in dump.run_data[1].events if e.debug_event]
    assert len(debug) == 2 and program.etdump_dropped_events == 2  # 24-byte tensors at 64-byte alignment
    assert len(buf) <= 100


def test_allocation_events_are_opt_in(tmp_path):
    data, _ = add_chain(1)
    _, dump, _, _ = _trace(tmp_path, data, [[torch.ones(2, 3)]], trace_allocations=True)
    load, run = dump.run_data  # what they mean: etlab.facts.memory_events (tests/runtime/test_memory_events.py)
    assert [a.name for a in load.allocators][:2] == ["planned:1", "method"]
    sizes = [e.allocation_event.allocation_size for e in load.events if e.allocation_event]
    assert sizes and sizes[0] >= 48
    assert {a.name for a in run.allocators} >= {"peak_rss"}
    _, plain, _, _ = _trace(tmp_path, data, [[torch.ones(2, 3)]])
    assert not any(e.allocation_event for r in plain.run_data for e in r.events)


def test_files_are_replaced_atomically(tmp_path):
    data, _ = add_chain(1)
    program = Runtime.get().load_program(data, enable_etdump=True)
    method = program.load_method("forward")
    target = tmp_path / "run.etdp"
    target.write_bytes(b"old")
    method.execute([torch.ones(2, 3)])
    program.write_etdump_result_to_file(target)
    assert deserialize_etdump(target.read_bytes()).run_data[1].name == "Execute"
    assert sorted(os.listdir(tmp_path)) == ["run.etdp"]  # no temporary files left behind


def test_writing_without_etdump_is_an_error(tmp_path):
    data, _ = add_chain(1)
    with pytest.raises(LoadError, match="ETDump is off"):
        Runtime.get().load_program(data).write_etdump_result_to_file(tmp_path / "x.etdp")


# -- the ETDump and its debug buffer are one pair ---------------------------------------------------

def _write_run(folder, x: torch.Tensor, name: str = "run"):
    data, _ = add_chain(3)
    program = Runtime.get().load_program(data, enable_etdump=True, debug_buffer_size=1 << 16)
    program.load_method("forward").execute([x])
    program.write_etdump_result_to_file(folder / f"{name}.etdp", folder / f"{name}.bin")
    return folder / f"{name}.etdp", folder / f"{name}.bin"


def test_etdump_records_its_debug_buffer(tmp_path):
    etdp, buf = _write_run(tmp_path, torch.ones(2, 3))
    digest = deserialize_etdump(etdp.read_bytes()).debug_buffer
    data = buf.read_bytes()
    assert digest.size == len(data) and bytes(digest.sha256) == hashlib.sha256(data).digest()
    values = Inspector(etdump_path=etdp, debug_buffer_path=buf).event_blocks[1].events[0].debug_data
    assert torch.equal(values[0], torch.ones(2, 3) + _WEIGHT)


_WEIGHT = add_chain(3)[1]


def test_a_buffer_from_another_run_is_refused_naming_both_files(tmp_path):
    etdp_a, buf_a = _write_run(tmp_path, torch.ones(2, 3), "a")
    _, buf_b = _write_run(tmp_path, torch.zeros(2, 3), "b")  # same program, same size, other values
    assert buf_a.stat().st_size == buf_b.stat().st_size
    with pytest.raises(FormatError, match=rf"{buf_b} is not the debug buffer {etdp_a} was written with: the "
                                          r"ETDump records 216 bytes with SHA-256 [0-9a-f]{16}\.\.\., this buffer "
                                          r"has SHA-256 [0-9a-f]{16}"):
        Inspector(etdump_path=etdp_a, debug_buffer_path=buf_b)


def test_a_process_stopped_between_the_two_writes_leaves_a_pair_that_is_refused(tmp_path, monkeypatch):
    """Run A's pair, then run B stopped after writing its ETDump and before its buffer: B's ETDump next to
    A's buffer (what the Inspector used to show as B's values)."""
    etdp, buf = _write_run(tmp_path, torch.ones(2, 3))
    writes = []

    class Stopped(BaseException):
        """The process ends here (as a kill would)."""

    def stop_before_the_buffer(path, data):
        if writes:
            raise Stopped
        writes.append(path)
        write_atomic(path, data)

    monkeypatch.setattr(event_tracer, "write_atomic", stop_before_the_buffer)
    with pytest.raises(Stopped):
        _write_run(tmp_path, torch.full((2, 3), 7.0))
    assert writes == [etdp]
    with pytest.raises(FormatError, match=rf"{buf} is not the debug buffer {etdp} was written with"):
        Inspector(etdump_path=etdp, debug_buffer_path=buf)


def test_without_a_digest_a_buffer_too_short_for_the_tensors_is_refused(tmp_path):
    """Upstream's ETDumps record no digest: what can be checked is that every tensor lies inside the buffer."""
    etdp, buf = _write_run(tmp_path, torch.ones(2, 3))
    dump = deserialize_etdump(etdp.read_bytes())
    dump.debug_buffer = None
    etdp.write_bytes(serialize_etdump(dump))
    Inspector(etdump_path=etdp, debug_buffer_path=buf)  # the right buffer still loads
    short = tmp_path / "short.bin"
    short.write_bytes(buf.read_bytes()[:100])
    with pytest.raises(FormatError, match=rf"{short} does not hold the tensors {etdp} points to: tensor 1 "
                                          r"\(FLOAT \[2, 3\]\) needs bytes \[64, 88\), but the buffer holds 100 bytes|"
                                          rf"{short} does not hold the tensors {etdp} points to: tensor 2"):
        Inspector(etdump_path=etdp, debug_buffer_path=short)


@pytest.mark.interop
def test_upstreams_inspector_reads_a_pair_with_its_digest(tmp_path):
    """The digest is a field upstream's schema lacks: its reader (flatc with its own schema) skips it."""
    from tests.interop.conftest import ET_REF, run_ref, setup_reference

    etdp, buf = _write_run(tmp_path, torch.ones(2, 3))
    assert deserialize_etdump(etdp.read_bytes()).debug_buffer is not None
    out = tmp_path / "inspector.json"
    run_ref(setup_reference(), ET_REF, "inspect", etdp, "--debug-buffer", buf, "--json", out)
    rows = json.loads(out.read_text())["rows"]
    calls = [r for r in rows if r["event_name"] == "native_call_add.out"]
    assert len(calls) == 3 and all(r["debug_data"] == [{"tensor": [2, 3], "dtype": "torch.float32"}] for r in calls)
