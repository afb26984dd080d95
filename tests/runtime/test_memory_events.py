"""Memory as a method loads and runs (`trace_allocations=True`): planted allocations appear in the ETDump with
their size, under the allocator `etlab.facts.memory_events` names, at the instruction that made them (every
runtime test runs on both cores: conftest)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from etlab.facts import memory_events as M
from etlab.runtime import Runtime, register_backend, register_kernel, unregister_backend, unregister_kernel
from etlab.schema import deserialize_etdump
from tests.runtime._programs import PlanBuilder, ProgramBuilder, add_chain, delegate_program

TEMP_BYTES = 123_457  # odd on purpose: nothing rounds it
KEPT_BYTES = 40_000
PACKED_BYTES = 4096 * 4
WORKSPACE_BYTES = 65_537
_kept: list[torch.Tensor] = []


def _scratch_kernel(x, out, _ret):
    """A kernel with a known temporary: TEMP_BYTES allocated, used, freed before it returns."""
    scratch = torch.empty(TEMP_BYTES, dtype=torch.uint8)
    scratch.fill_(1)
    out.copy_(x)  # (a Python scalar operand would allocate a 0-dim tensor: measured too)


def _keep_kernel(x, out, _ret):
    """A kernel that keeps what it allocates (as a dynamic-shape result torch sizes would be)."""
    _kept.append(torch.zeros(KEPT_BYTES, dtype=torch.uint8))
    out.copy_(x)


def _free_kernel(x, out, _ret):
    _kept.clear()
    out.copy_(x)


class WorkspaceBackend:
    """A delegate with known packed weights (kept by init) and a known workspace (each call)."""

    memory_names: ClassVar = {"init": "packed_weights", "execute": "workspace"}

    def init(self, processed, compile_specs):
        return torch.full((PACKED_BYTES // 4,), float(bytes(processed)[0]))

    def execute(self, handle, args, context=None):
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8)
        workspace.fill_(0)
        torch.mul(args[0], handle[:1], out=args[1])


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register_kernel("etlab_test::scratch.out", _scratch_kernel)
    register_kernel("etlab_test::keep.out", _keep_kernel)
    register_kernel("etlab_test::free.out", _free_kernel)
    register_backend("WorkspaceBackend", WorkspaceBackend())
    yield
    for name in ("scratch", "keep", "free"):
        unregister_kernel(f"etlab_test::{name}.out")
    unregister_backend("WorkspaceBackend")


def _kernel_program() -> bytes:
    """add (0), scratch (1), keep (2), add (3), free (4)."""
    b = PlanBuilder()
    x = b.tensor([64])
    t = [b.tensor([64]) for _ in range(5)]
    b.kernel("aten::add.out", x, x, b.int(1), t[0], t[0])
    b.kernel("etlab_test::scratch.out", t[0], t[1], t[1])
    b.kernel("etlab_test::keep.out", t[1], t[2], t[2])
    b.kernel("aten::add.out", t[2], t[2], b.int(1), t[3], t[3])
    b.kernel("etlab_test::free.out", t[3], t[4], t[4])
    return ProgramBuilder().serialize([b.plan([x], [t[4]])])


def _trace(data: bytes, inputs: list, runs: int = 2, **kwargs):
    program = Runtime.get().load_program(data, enable_etdump=True, trace_allocations=True, **kwargs)
    method = program.load_method("forward")
    for _ in range(runs):
        method.execute(inputs)
    return deserialize_etdump(_written(program))


def _written(program) -> bytes:
    from etlab.schema import serialize_etdump

    return serialize_etdump(program._tracer.to_etdump())


def _allocations(run) -> list[tuple[str, int, tuple]]:
    """(allocator, size, owner) per allocation event of a block; the owner is (name, chain, instruction) of
    the profile event it belongs to (etlab.facts.memory_events.owner_positions)."""
    kinds = ["profile" if e.profile_event else "debug" if e.debug_event else "allocation" for e in run.events]
    owners = M.owner_positions(kinds)
    out = []
    names = [a.name for a in run.allocators or []]
    assert all(e.allocation_event.allocator_id >= 1 for e in run.events if e.allocation_event)  # upstream's ids
    for e, owner in zip(run.events, owners):
        if e.allocation_event:
            p = run.events[owner].profile_event if owner >= 0 else None
            out.append((M.allocator_name(names, e.allocation_event.allocator_id), e.allocation_event.allocation_size,
                        (p.name, p.chain_index, p.instruction_id) if p else None))
    return out


def test_a_kernel_temporary_and_kept_memory_appear_at_their_instruction():
    dump = _trace(_kernel_program(), [torch.ones(64)])
    _, first, second = dump.run_data
    assert [r.name for r in dump.run_data] == ["Default", "Execute", "Execute"]
    at = {}
    for name, size, owner in _allocations(first):
        at.setdefault(owner[2] if owner[1] == 0 else owner[0], []).append((name, size))
    assert at[1] == [("temp", TEMP_BYTES)]  # the scratch kernel: its temporary, nothing kept
    assert at[2] == [("unplanned", KEPT_BYTES)]  # the keep kernel
    assert at[4] == [("unplanned:released", KEPT_BYTES)]  # the free kernel
    assert 0 not in at and 3 not in at  # add.out into planned memory allocates nothing
    assert {name for name, _ in at["Method::execute"]} >= {"peak_rss"}
    # the owner is the instruction's first profile event: its kernel event
    owners = {owner for name, _, owner in _allocations(first) if name == "temp"}
    assert owners == {("native_call_scratch.out", 0, 1)}
    # every run records its own
    assert [e for e in _allocations(second) if e[0] == "temp"] == [("temp", TEMP_BYTES, owners.pop())]


def test_a_delegate_workspace_and_packed_weights_appear_where_they_were_taken():
    dump = _trace(delegate_program("WorkspaceBackend", factor=3), [torch.ones(2, 2)])
    load, run = dump.run_data[:2]
    load_allocations = _allocations(load)
    assert ("delegate:WorkspaceBackend:packed_weights", PACKED_BYTES, ("Method::init", -1, 0)) in load_allocations
    names = [name for name, _, _ in load_allocations]
    assert names[0] == "planned:1" and "method" in names and "peak_rss" in names
    assert all(owner == ("Method::init", -1, 0) for _, _, owner in load_allocations)  # the load's events
    workspace = [(size, owner) for name, size, owner in _allocations(run) if name.startswith("delegate:")]
    assert workspace == [(WORKSPACE_BYTES, ("DELEGATE_CALL", 0, 0))]
    assert not [name for name, _, _ in _allocations(run) if name == "temp"]  # named by the backend instead


def test_without_allocation_tracing_nothing_is_measured():
    data, _ = add_chain(2)
    program = Runtime.get().load_program(data, enable_etdump=True)
    method = program.load_method("forward")
    assert method._watch is None
    method.execute([torch.ones(2, 3)])
    dump = deserialize_etdump(_written(program))
    assert not any(e.allocation_event for r in dump.run_data for e in r.events)
    assert not any(r.allocators for r in dump.run_data)


def test_the_watch_stands_aside_for_torchs_profiler():
    """Under torch's profiler (which owns the thread's memory reports) a traced run still runs and records
    its RSS deltas; per-instruction memory is not measured."""
    program = Runtime.get().load_program(_kernel_program(), enable_etdump=True, trace_allocations=True)
    method = program.load_method("forward")
    with torch.profiler.profile(profile_memory=True):
        out = method.execute([torch.ones(64)])
    assert torch.equal(out[0], torch.full((64,), 4.0))
    run = deserialize_etdump(_written(program)).run_data[1]
    assert {name for name, _, _ in _allocations(run)} - {"rss", "rss:released"} == {"peak_rss"}


def test_allocator_names_parse_back():
    assert M.parse_allocator(M.planned(3)) == M.AllocatorName("planned", mem_id=3)
    assert M.parse_allocator("delegate:XnnpackBackend:packed_weights") == M.AllocatorName(
        "delegate", backend="XnnpackBackend", what="packed_weights")
    assert M.signed_size("unplanned:released", 10) == -10 and M.signed_size("rss", 10) == 10
    assert M.owner_kind("forward:planned_memory_1") == "other"  # older etlab names still list
    assert M.owner_kind("temp:released") == "other"  # only quantities that shrink have a released form
    with pytest.raises(ValueError, match="backend id"):
        M.delegate("a:b", "workspace")
    assert M.owner_positions(["allocation", "allocation", "profile", "debug", "allocation", "profile",
                              "allocation"]) == [2, 2, -1, -1, 5, -1, -1]


@pytest.fixture(scope="module")
def xnnpack_cnn() -> tuple[bytes, list]:
    from etlab.compiler import to_edge_transform_and_lower
    from etlab.compiler.backends.xnnpack import XnnpackPartitioner
    from etlab.models import zoo

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, inputs = zoo.make_cnn()
    edge = to_edge_transform_and_lower(torch.export.export(model.eval(), tuple(inputs)),
                                       partitioner=[XnnpackPartitioner()])
    return edge.to_executorch().buffer, list(inputs)


def test_the_xnnpack_host_backend_reports_packed_weights_and_workspace(xnnpack_cnn):
    data, inputs = xnnpack_cnn
    dump = _trace(data, inputs, runs=1)
    load, run = dump.run_data
    packed = [size for name, size, _ in _allocations(load) if name == "delegate:XnnpackBackend:packed_weights"]
    assert len(packed) >= 1 and all(size > 0 for size in packed)
    delegate_calls = {owner for name, _, owner in _allocations(run) if name == "delegate:XnnpackBackend:workspace"}
    assert delegate_calls and all(owner[0] == "DELEGATE_CALL" for owner in delegate_calls)


def test_a_full_event_buffer_cuts_a_watched_run_and_counts_what_it_dropped():
    program = Runtime.get().load_program(_kernel_program(), enable_etdump=True, trace_allocations=True,
                                         etdump_max_events=12)
    method = program.load_method("forward")
    with pytest.warns(RuntimeWarning, match="dropping events"):
        method.execute([torch.ones(64)])
    dump = deserialize_etdump(_written(program))
    kept = sum(len(r.events) for r in dump.run_data)
    assert kept == 12
    full = _trace(_kernel_program(), [torch.ones(64)], runs=1)
    assert program.etdump_dropped_events == sum(len(r.events) for r in full.run_data) - 12


def test_the_trace_is_written_without_its_allocation_events_on_request(tmp_path):
    program = Runtime.get().load_program(_kernel_program(), enable_etdump=True, trace_allocations=True)
    program.load_method("forward").execute([torch.ones(64)])
    program.write_etdump_result_to_file(tmp_path / "all.etdp")
    program.write_etdump_result_to_file(tmp_path / "timings.etdp", allocation_events=False)
    full, timings = (deserialize_etdump((tmp_path / f).read_bytes()) for f in ("all.etdp", "timings.etdp"))
    assert not any(r.allocators for r in timings.run_data)
    for a, b in zip(full.run_data, timings.run_data, strict=True):
        assert [e for e in a.events if not e.allocation_event] == b.events
