"""Run blocks recorded natively and in Python, in order; the debug buffer sized from the plan; dropped
values counted in the ETDump and reported by the Inspector; kernel errors. Runs on both cores."""

from __future__ import annotations

import time

import pytest
import torch

from etlab.inspector import Inspector
from etlab.runtime import (
    DebugLevel,
    ExecutionError,
    Runtime,
    _native,
    register_backend,
    register_kernel,
    unregister_backend,
    unregister_kernel,
)
from etlab.runtime._event_tracer import _DebugArena
from etlab.schema import deserialize_etdump
from etlab.schema.etdump import DROPPED_DEBUG_VALUES, METHOD_EXECUTE
from tests.runtime._programs import PlanBuilder, ProgramBuilder, ScaleBackend, add_chain


def _two_method_program() -> bytes:
    """forward: two adds (timings recorded natively on the native core); scaled: a delegate call
    (its run blocks are recorded in Python, with the delegate's own events)."""
    prog = ProgramBuilder()
    f = PlanBuilder("forward")
    x, y, z = f.tensor([2, 2]), f.tensor([2, 2]), f.tensor([2, 2])
    f.kernel("aten::add.out", x, x, f.int(1), y, y)
    f.kernel("aten::add.out", y, x, f.int(1), z, z)
    d = PlanBuilder("scaled")
    a, out = d.tensor([2, 2]), d.tensor([2, 2])
    d.add_delegate("ScaleBackend", prog.add_inline(bytes([3])), [("mode", b"fast")])
    d.delegate_call(0, a, out)
    return prog.serialize([f.plan([x], [z]), d.plan([a], [out])])


@pytest.fixture
def scale_backend():
    register_backend("ScaleBackend", ScaleBackend())
    yield
    unregister_backend("ScaleBackend")


def _profile_names(run) -> list[str]:
    return [e.profile_event.name for e in run.events if e.profile_event]


def test_run_blocks_keep_the_order_of_the_runs(scale_backend, tmp_path):
    program = Runtime.get().load_program(_two_method_program(), enable_etdump=True)
    forward, scaled = program.load_method("forward"), program.load_method("scaled")
    x = torch.ones(2, 2)
    order = [("f", -1), ("s", -1), ("f", 4), ("f", -1), ("s", 2), ("f", -1)]
    for which, bundled in order:
        (forward if which == "f" else scaled).execute([x], bundled_input_index=bundled)
    program.write_etdump_result_to_file(tmp_path / "t.etdp")
    runs = deserialize_etdump((tmp_path / "t.etdp").read_bytes()).run_data[1:]
    assert [("f" if "native_call_add.out" in _profile_names(r) else "s", r.bundled_input_index) for r in runs] == order
    for run, (which, _) in zip(runs, order):
        names = _profile_names(run)
        assert names[-1] == "Method::execute"
        assert names.count("OPERATOR_CALL") == (2 if which == "f" else 0)
        events = [e.profile_event for e in run.events if e.profile_event]
        assert events[-1].start_time <= events[0].start_time and events[-1].end_time >= events[-2].end_time
    assert program.etdump_dropped_events == 0


def test_event_limit_cuts_native_and_python_runs_alike(tmp_path):
    data, _ = add_chain(3)
    program = Runtime.get().load_program(data, enable_etdump=True, etdump_max_events=12)
    method = program.load_method("forward")
    with pytest.warns(RuntimeWarning, match="dropp"):
        for _ in range(3):
            method.execute([torch.ones(2, 3)])
        program.write_etdump_result_to_file(tmp_path / "t.etdp")
    dump = deserialize_etdump((tmp_path / "t.etdp").read_bytes())
    assert [len(r.events) for r in dump.run_data] == [2, 7, 3, 0]  # 2 load events + 7 per run, 12 kept
    assert program.etdump_dropped_events == 23 - 12


def test_native_log_keeps_every_run_across_its_blocks(runtime_core):
    """The native log keeps runs back to back in 2 MiB blocks: runs past the first block are kept whole,
    in order, with timestamps that rise within each run and Method::execute spanning its steps."""
    if runtime_core != "native":
        pytest.skip("the native core's trace log")
    from array import array

    data, _ = add_chain(200)
    program = Runtime.get(core="native").load_program(data, enable_etdump=True, etdump_max_events=1 << 30)
    method = program.load_method("forward")
    runs = (2 << 20) // (2 * 201 + 4) + 50  # a run: 201 two-byte times and a header of about 4 bytes; past one block
    x = torch.ones(2, 3)
    for _ in range(runs):
        method.execute([x])
    logged = method._native_log.runs()
    assert len(logged) == runs
    previous_end = 0
    for _key, bundled, events, kept, start, end, raw in logged:
        record = array("q")
        record.frombytes(raw)
        assert (events, kept, bundled, len(record)) == (401, 401, -1, 201)  # 2 events a step, + execute
        assert list(record) == sorted(record) and record[0] >= previous_end
        assert (start, end) == (record[0], record[-1])
        previous_end = end


def test_runs_alternating_between_threads_share_the_logs_clock_readings(runtime_core, tmp_path):
    """Two methods of one program on two threads, strictly taking turns, log into one native log: their
    runs convert with the log's clock readings (at most one per 10 ms of the runs' own logged span, however
    slow the machine), not one reading per change of thread, and every run keeps rising timestamps within
    itself and after the run before it."""
    if runtime_core != "native":
        pytest.skip("the native core's trace log")
    import threading

    data, _ = add_chain(4)
    program = Runtime.get(core="native").load_program(data, enable_etdump=True, etdump_max_events=1 << 30)
    methods = [program.load_method("forward"), program.load_method("forward")]
    turns = [threading.Semaphore(1), threading.Semaphore(0)]
    runs_each = 300
    x = torch.ones(2, 3)

    def take_turns(k: int) -> None:
        for _ in range(runs_each):
            turns[k].acquire()
            methods[k].execute([x])
            turns[1 - k].release()

    threads = [threading.Thread(target=take_turns, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log = methods[0]._native_log
    assert log is methods[1]._native_log and len(log) == 2 * runs_each
    anchors = log.anchors
    program.write_etdump_result_to_file(tmp_path / "t.etdp")
    dump = deserialize_etdump((tmp_path / "t.etdp").read_bytes())
    runs = [e.profile_event for run in dump.run_data for e in run.events
            if e.profile_event and e.profile_event.name == METHOD_EXECUTE]
    assert len(runs) == 2 * runs_each
    span_ms = (max(p.end_time for p in runs) - min(p.start_time for p in runs)) / 1e6
    assert 1 <= anchors <= span_ms / 10 + 2, (anchors, span_ms)  # was one per run when threads alternate
    previous_end = 0
    for *_, start, end, _raw in log.runs():
        assert previous_end <= start <= end
        previous_end = end


def test_a_step_longer_than_a_short_time_is_timed_whole(tmp_path, runtime_core):
    """The native log stores a time in 15 bits of counter ticks (about 12 us) or, past that, in a
    wide form: a 1.2 s step is timed as such, and the steps after it keep their own times. No time limit
    here: each recorded time is checked against another (nesting, order) and against the clock read around
    the whole call, which a slow machine stretches alike."""
    if runtime_core != "native":
        pytest.skip("the native core's trace log")
    register_kernel("etlab_test::slow.out", lambda x, out, _ret: (time.sleep(1.2), out.copy_(x)))
    try:
        b = PlanBuilder()
        x, y, z = b.tensor([2]), b.tensor([2]), b.tensor([2])
        b.kernel("etlab_test::slow.out", x, y, y)
        b.kernel("aten::add.out", y, y, b.int(1), z, z)
        program = Runtime.get(core="native").load_program(ProgramBuilder().serialize([b.plan([x], [z])]),
                                                          enable_etdump=True)
        method = program.load_method("forward")
        before = time.monotonic_ns()
        method.execute([torch.ones(2)])
        around = (time.monotonic_ns() - before) / 1e9
        program.write_etdump_result_to_file(tmp_path / "t.etdp")
    finally:
        unregister_kernel("etlab_test::slow.out")
    run = deserialize_etdump((tmp_path / "t.etdp").read_bytes()).run_data[-1]
    events = [e.profile_event for e in run.events if e.profile_event]
    # seconds, converted from counter ticks (a period measured against CLOCK_MONOTONIC, which NTP may slew by
    # up to 0.05%)
    took = {e.name: (e.end_time - e.start_time) / 1e9 for e in events}
    at = {e.name: e for e in events}
    slow, add, run_event = at["native_call_slow.out"], at["native_call_add.out"], events[-1]
    assert run_event.name == METHOD_EXECUTE
    assert 1.19 <= took["native_call_slow.out"] <= took[METHOD_EXECUTE] <= around * 1.001 + 1e-3, (took, around)
    assert run_event.start_time <= slow.start_time and slow.end_time <= add.start_time <= add.end_time \
        <= run_event.end_time  # the add after the wide record keeps its own time, inside the run
    ns = lambda e: e.end_time - e.start_time  # integers: exact, where the seconds above round
    assert ns(add) <= ns(run_event) - ns(slow)
    assert [e.start_time for e in events[:-1]] == sorted(e.start_time for e in events[:-1])


def _big_chain() -> tuple[bytes, int]:
    """Three adds of (256, 1024) floats: each logged value is 1 MiB, a run logs 4 MiB."""
    data, _ = add_chain(3, shape=(256, 1024))
    return data, 4 << 20


def _debug_events(dump) -> list:
    return [e.debug_event for run in dump.run_data for e in run.events if e.debug_event]


def test_debug_buffer_is_sized_from_the_plan_and_grows_with_the_runs(tmp_path):
    data, per_run = _big_chain()
    xs = [torch.randn(256, 1024, generator=torch.Generator().manual_seed(k)) for k in range(3)]

    def traced(**kwargs):
        program = Runtime.get().load_program(data, enable_etdump=True, **kwargs)
        method = program.load_method("forward")
        outs = [method.execute([x])[0] for x in xs]
        stem = tmp_path / str(len(kwargs))
        program.write_etdump_result_to_file(stem.with_suffix(".etdp"), stem.with_suffix(".bin"))
        dump = deserialize_etdump(stem.with_suffix(".etdp").read_bytes())
        return program, outs, dump, stem.with_suffix(".bin").read_bytes()

    auto, outs, dump, buf = traced(etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
    assert auto.etdump_dropped_events == 0
    assert len(buf) == 3 * per_run  # three runs, each in a chunk of its own size
    assert len(_debug_events(dump)) == 3 * 4
    for run, out in zip(dump.run_data[1:], outs):
        last = [e.debug_event for e in run.events if e.debug_event][-1].debug_entry.tensor
        logged = torch.frombuffer(bytearray(buf[last.offset:last.offset + per_run // 4]), dtype=torch.float32)
        assert torch.equal(logged.reshape(256, 1024), out)
    _, _, fixed_dump, fixed_buf = traced(debug_buffer_size=64 << 20)
    assert fixed_buf == buf  # the same layout as one big buffer
    assert [(d.chain_index, d.instruction_id, d.debug_entry.tensor.offset) for d in _debug_events(fixed_dump)] == \
        [(d.chain_index, d.instruction_id, d.debug_entry.tensor.offset) for d in _debug_events(dump)]


def test_a_given_debug_buffer_size_is_kept_and_drops_are_reported(tmp_path):
    data, _ = add_chain(3)  # (2, 3) floats: 24 bytes each, 64-byte aligned: two fit into 100 bytes
    program = Runtime.get().load_program(data, enable_etdump=True, debug_buffer_size=100)
    method = program.load_method("forward")
    with pytest.warns(RuntimeWarning, match="dropp"):
        for _ in range(2):
            method.execute([torch.ones(2, 3)])
        program.write_etdump_result_to_file(tmp_path / "t.etdp", tmp_path / "t.bin")
    assert program.etdump_dropped_events == 2 * 4 - 2  # 3 intermediates + 1 output per run
    dump = deserialize_etdump((tmp_path / "t.etdp").read_bytes())
    marks = [[e.profile_event.delegate_debug_metadata for e in run.events
              if e.profile_event and e.profile_event.name == DROPPED_DEBUG_VALUES] for run in dump.run_data[1:]]
    assert marks == [[b"2"], [b"4"]]
    assert len((tmp_path / "t.bin").read_bytes()) <= 100
    with pytest.warns(RuntimeWarning, match="6 logged values were dropped"):
        inspector = Inspector(etdump_path=tmp_path / "t.etdp", debug_buffer_path=tmp_path / "t.bin")
    assert inspector.dropped_debug_values == 6


def test_a_complete_trace_reports_no_drops(tmp_path):
    data, _ = add_chain(2)
    program = Runtime.get().load_program(data, enable_etdump=True, etdump_debug_level=2)
    program.load_method("forward").execute([torch.ones(2, 3)])
    program.write_etdump_result_to_file(tmp_path / "t.etdp", tmp_path / "t.bin")
    assert Inspector(etdump_path=tmp_path / "t.etdp", debug_buffer_path=tmp_path / "t.bin").dropped_debug_values == 0


@pytest.mark.parametrize("arena", ["native", "python"])
def test_debug_arena_chunks_are_aligned_and_their_gaps_zeroed(arena):
    make = _native.debug_arena if arena == "native" else _DebugArena
    a = make(100, 1 << 22)
    offsets = []
    for n in (30, 20, 80, 5):  # the third does not fit the first chunk: a new one at 128
        offset, space = a.reserve(n, 64)
        offsets.append(offset)
        space.fill_(n)
    assert offsets == [0, 64, 128, 256]
    data = a.contents()
    assert data.numel() == a.used == 261
    assert torch.all(data[30:64] == 0) and torch.all(data[84:128] == 0) and torch.all(data[208:256] == 0)
    assert torch.all(data[:30] == 30) and torch.all(data[64:84] == 20) and torch.all(data[128:208] == 80)
    assert a.reserve(5 << 20, 64)[0] == -1  # past the limit


def test_same_arena_layout_on_both_allocators():
    layouts = []
    for make in (_native.debug_arena, _DebugArena):
        a = make(0, 1 << 22)
        a.grow_by_at_least(3000)
        layouts.append([a.reserve(n, 64)[0] for n in (1000, 1000, 1500, 2_000_000, 7)] + [a.used])
    assert layouts[0] == layouts[1]


def _failing_program() -> bytes:
    b = PlanBuilder()
    src, index, out = b.tensor([4]), b.tensor([2], torch.int64), b.tensor([2])
    b.kernel("aten::add.out", src, src, b.int(1), src, src)
    b.kernel("aten::index_select.out", src, b.int(0), index, out, out)
    return ProgramBuilder().serialize([b.plan([src, index], [out])])


@pytest.mark.parametrize("trace", [{}, {"enable_etdump": True}, {"enable_etdump": True, "etdump_debug_level": 2}])
def test_kernel_errors_name_instruction_operator_and_debug_handle(trace, tmp_path):
    program = Runtime.get().load_program(_failing_program(), **trace)
    method = program.load_method("forward")
    with pytest.raises(ExecutionError, match=r"method 'forward': chain 0, instruction 1 \(aten::index_select.out, "
                                             r"debug handle 1\) failed: IndexError: .*index out of range"):
        method.execute([torch.arange(4.0), torch.tensor([0, 9])])
    out = method.execute([torch.arange(4.0), torch.tensor([3, 1])])[0]  # still usable
    assert torch.equal(out, torch.tensor([6.0, 2.0]))
    if trace:
        program.write_etdump_result_to_file(tmp_path / "t.etdp", tmp_path / "t.bin")
        runs = deserialize_etdump((tmp_path / "t.etdp").read_bytes()).run_data
        assert [r.name for r in runs] == ["Default", "Execute"]  # the failed run left no block


def test_kernels_stay_visible_to_the_torch_profiler_and_dispatch_modes():
    """The native core skips the dispatcher only when nothing observes it: under the profiler or a
    dispatch mode every kernel goes through the dispatcher, as on the Python core."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    data, w = add_chain(3)
    method = Runtime.get().load_program(data).load_method("forward")
    x = torch.randn(2, 3)
    expected = x + 3 * w
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.testing.assert_close(method.execute([x])[0], expected)
    assert sum(e.key == "aten::add" for e in prof.key_averages()) == 1
    assert next(e.count for e in prof.key_averages() if e.key == "aten::add") >= 3
    with Seen() as seen:
        torch.testing.assert_close(method.execute([x])[0], expected)
    assert seen.ops.count("aten.add.out") == 3
    torch.testing.assert_close(method.execute([x])[0], expected)  # and back to the direct calls
