"""Methods that share mutable buffers (`MemoryPlanningPass(share_mutable_buffers=True)`): the compiler
plans each buffer once in memory id 2 for every method, the runtime gives a Program's methods one
copy of it (both cores), so a method reads what another wrote; a file whose methods disagree
about that region is refused with a LoadError naming them."""

from __future__ import annotations

import threading

import pytest
import torch

from etlab.compiler import ExecutorchBackendConfig, MemoryPlanningPass, to_edge
from etlab.models.corpus import MethodAsForward
from etlab.models.corpus._llama_static_kv import LlamaStaticKV, generate
from etlab.runtime import LoadError, Runtime
from etlab.schema import deserialize_pte, serialize_pte
from tests.runtime import _cores
from tests.runtime._stateful_models import WriteThenRead, write_then_read_calls

runtime_core = _cores.runtime_core  # autouse: every test runs on both cores


def _shared_config(names: bool = True) -> ExecutorchBackendConfig:
    return ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
                                   emit_mutable_buffer_names=names)


def _export(module, examples: dict) -> dict:
    with torch.no_grad():
        return {m: torch.export.export(MethodAsForward(module, m), tuple(ins), strict=False)
                for m, ins in examples.items()}


@pytest.fixture(scope="module")
def write_read():
    """(module with the weights the program has, examples, calls, shared .pte, per-method .pte)."""
    torch.manual_seed(0)
    module = WriteThenRead().eval()
    examples, calls = write_then_read_calls()
    shared = to_edge(_export(module, examples)).to_executorch(_shared_config())
    separate = to_edge(_export(module, examples)).to_executorch()
    return module, examples, calls, shared, separate


def _run_calls(pte: bytes, calls) -> list[torch.Tensor]:
    program = Runtime.get().load_program(pte)
    methods = {}
    out = []
    for name, inputs in calls:
        method = methods.setdefault(name, program.load_method(name))
        out.append(method.execute(list(inputs))[0])
    return out


def _eager(calls) -> list[torch.Tensor]:
    module = WriteThenRead().eval()
    with torch.no_grad():
        return [getattr(module, name)(*inputs) for name, inputs in calls]


def test_one_method_reads_what_another_wrote(write_read):
    _, _, calls, shared, _ = write_read
    got, want = _run_calls(shared.buffer, calls), _eager(calls)
    for k, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6, msg=f"call {k} ({calls[k][0]})")


def test_without_sharing_each_method_has_its_own_copy(write_read):
    """The default (upstream's too): read sees none of write's state, so it differs from eager."""
    _, _, calls, _, separate = write_read
    got, want = _run_calls(separate.buffer, calls), _eager(calls)
    assert torch.equal(got[0], want[0])  # write itself is right
    assert not torch.allclose(got[1], want[1])  # read saw a zero cache
    assert all(len(p.non_const_buffer_sizes) == 2 for p in separate.executorch_program.execution_plan)


def test_the_plan_puts_each_buffer_once_in_memory_id_2(write_read):
    _, _, _, shared, _ = write_read
    plans = {p.name: p for p in shared.executorch_program.execution_plan}
    layout = {}
    for name, plan in plans.items():
        assert len(plan.non_const_buffer_sizes) == 3
        state = {v.val.extra_tensor_info.fully_qualified_name: (v.val.allocation_info.memory_offset, v.val.sizes)
                 for v in plan.values if getattr(v.val, "allocation_info", None) is not None
                 and v.val.allocation_info.memory_id == 2}
        layout[name] = (plan.non_const_buffer_sizes[2], state)
    # write mutates both buffers, read only reads them: still state in read (not a constant copy)
    assert layout["write"] == layout["read"] == (48, {"module.cache": (0, [2, 3]), "module.steps": (32, [1])})
    # the compile-time plan says the same: memory id 2 blocks of the whole method
    plan = shared.memory_plans["read"]
    assert plan.buffer_sizes[2] == 48 and {b.offset for b in plan.blocks if b.mem_id == 2} == {0, 32}


def test_names_only_when_asked(write_read):
    module, examples, calls, _, _ = write_read
    et = to_edge(_export(module, examples)).to_executorch(_shared_config(names=False))
    plan = et.executorch_program.execution_plan[0]
    state = _state_values(plan)
    assert len(state) == 2 and all(t.extra_tensor_info is None for t in state)
    for g, w in zip(_run_calls(et.buffer, calls), _eager(calls)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_every_load_of_one_program_shares_it_and_programs_do_not(write_read):
    _, examples, _, shared, _ = write_read
    x = examples["write"][0]
    program = Runtime.get().load_program(shared.buffer)
    program.load_method("write").execute([x])
    before = program.load_method("read").execute([torch.ones(2, 3)])[0]  # a new load sees the same state
    fresh = Runtime.get().load_program(shared.buffer).load_method("read").execute([torch.ones(2, 3)])[0]
    assert torch.equal(fresh, torch.zeros(2, 3))  # another Program starts from its own zeroed state
    assert not torch.equal(before, fresh)


def test_methods_sharing_state_run_one_at_a_time(write_read):
    """Threads calling methods that share state are serialized by the program's lock: every write
    lands (no lost update of the counter)."""
    _, examples, _, shared, _ = write_read
    program = Runtime.get().load_program(shared.buffer)
    methods = [program.load_method("write") for _ in range(4)]
    x = examples["write"][0]

    def work(method):
        for _ in range(25):
            method.execute([x])

    threads = [threading.Thread(target=work, args=(m,)) for m in methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = program.load_method("read").execute([torch.zeros(2, 3)])[0]
    assert torch.equal(steps, torch.full((2, 3), 100.0))


def test_llama_static_kv_prefill_then_decode_generates_as_eager():
    torch.manual_seed(0)
    module = LlamaStaticKV().eval()
    prompt = torch.randint(0, 96, (1, 8))
    et = to_edge(_export(module, {"prefill": (prompt, torch.arange(8)),
                                  "decode": (torch.tensor([[1]]), torch.tensor([8]))})).to_executorch(_shared_config())
    program = Runtime.get().load_program(et.buffer)
    prefill, decode = program.load_method("prefill"), program.load_method("decode")
    with torch.no_grad():
        eager_logits = [module.prefill(prompt, torch.arange(8))]
    got_logits = [prefill.execute([prompt, torch.arange(8)])[0]]
    tokens = [int(got_logits[0].argmax(-1))]
    for i in range(6):
        step = [torch.tensor([[tokens[-1]]]), torch.tensor([8 + i])]
        got_logits.append(decode.execute(step)[0])
        with torch.no_grad():
            eager_logits.append(module.decode(*step))
        tokens.append(int(got_logits[-1].argmax(-1)))
    for k, (g, w) in enumerate(zip(got_logits, eager_logits)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, msg=f"step {k}")
    torch.manual_seed(0)
    module = LlamaStaticKV().eval()  # fresh caches, the same weights
    assert tokens == generate(module, prompt, 6)


# -- the compiler refuses what it cannot share ---------------------------------------------------------------

def test_share_needs_allocated_buffers_and_default_memory_ids():
    from tests.compiler.test_compiler_memory import _TwoPools  # addmm results in memory id 2

    with pytest.raises(ValueError, match="only meaningful when alloc_mutable_buffers"):
        MemoryPlanningPass(share_mutable_buffers=True, alloc_mutable_buffers=False)
    ep = torch.export.export(torch.nn.Linear(3, 3), (torch.randn(2, 3),))
    with pytest.raises(ValueError, match="every other tensor must be in memory id 1"):
        to_edge(ep).to_executorch(ExecutorchBackendConfig(memory_planning_pass=_TwoPools(share_mutable_buffers=True)))


# -- hostile files ---------------------------------------------------------------------------------------------

def _state_values(plan):
    return [v.val for v in plan.values if getattr(v.val, "allocation_info", None) is not None
            and v.val.allocation_info.memory_id == 2]


def _tampered(pte: bytes, change) -> bytes:
    decoded = deserialize_pte(memoryview(pte))
    plans = {p.name: p for p in decoded.program.execution_plan}
    change(plans)
    return serialize_pte(decoded.program, [bytes(s) for s in decoded.segments])


def _size(plans):
    plans["write"].non_const_buffer_sizes[2] = 64


def _named_offset(plans):
    _state_values(plans["read"])[1].allocation_info.memory_offset_low = 16  # steps moved, still in bounds


def _partial_overlap(plans):
    for plan in plans.values():
        for t in _state_values(plan):
            t.extra_tensor_info = None  # unnamed: only the byte ranges can disagree
    _state_values(plans["read"])[1].allocation_info.memory_offset_low = 16  # steps over cache's bytes 16..20


def _overrun(plans):
    _state_values(plans["read"])[1].allocation_info.memory_offset_low = 48


@pytest.mark.parametrize("change, message", [
    (_size, r"method 'write'.* 64 bytes, but method 'read' declares 48"),
    (_named_offset, r"methods disagree about shared buffer 'module.steps'.*method 'read'"),
    (_partial_overlap, r"methods disagree about the shared state .*partly overlaps"),
    (_overrun, r"method 'read'.* overrun the shared state"),
])
def test_methods_that_disagree_about_the_shared_state_are_refused(write_read, change, message):
    bad = _tampered(write_read[3].buffer, change)
    program = Runtime.get().load_program(bad)
    for name in ("read", "write"):  # whichever loads first checks all of them
        with pytest.raises(LoadError, match=message):
            program.load_method(name)


def test_allocation_events_name_the_shared_state_once(write_read, tmp_path):
    from etlab.schema import deserialize_etdump

    program = Runtime.get().load_program(write_read[3].buffer, enable_etdump=True, trace_allocations=True)
    program.load_method("write")
    program.load_method("read")
    program.write_etdump_result_to_file(tmp_path / "run.etdp")
    dump = deserialize_etdump((tmp_path / "run.etdp").read_bytes())
    names = [a.name for run in dump.run_data for a in (run.allocators or [])]
    assert names.count("shared:2") == 1  # one allocation, recorded by the load that made it
    assert names.count("planned:1") == 1  # one allocator of the load block, an event per load
    load = dump.run_data[0]
    planned_id = [a.name for a in load.allocators].index("planned:1") + 1  # ids count from 1, as upstream's
    planned = [e for e in load.events if e.allocation_event and e.allocation_event.allocator_id == planned_id]
    assert len(planned) == 2


def test_a_planner_reused_after_a_failed_compile_starts_clean(write_read):
    module, examples, calls, _, _ = write_read
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(8))

        def forward(self, x):
            self.count.add_(1)
            return x + self.count

    planner = MemoryPlanningPass(share_mutable_buffers=True)
    with torch.no_grad():  # planned first (collected), then the failing method
        eps = {"count": torch.export.export(Counter(), (torch.randn(8),)),
               "linear": torch.export.export(torch.nn.Linear(3, 3), (torch.randn(2, 3),))}
    original = planner.run

    def fail_on_linear(gm, sig=None):
        if any(n.target is torch.ops.aten.addmm.out for n in gm.graph.nodes):
            raise RuntimeError("planning failed")
        return original(gm, sig)

    planner.run = fail_on_linear
    with pytest.raises(RuntimeError, match="planning failed"):
        to_edge(eps).to_executorch(ExecutorchBackendConfig(memory_planning_pass=planner))
    del planner.run
    et = to_edge(_export(module, examples)).to_executorch(ExecutorchBackendConfig(memory_planning_pass=planner))
    assert [p.non_const_buffer_sizes[2] for p in et.executorch_program.execution_plan] == [48, 48]
    for g, w in zip(_run_calls(et.buffer, calls), _eager(calls)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_the_range_check_allows_agreement_and_stays_linear_on_crafted_layouts():
    from etlab.runtime._shared_state import StateTensor, _check_ranges

    def t(method, start, end, slot=0):
        return StateTensor(method, slot, start, end, torch.float32, (max((end - start) // 4, 0),), None)

    _check_ranges([t("a", 0, 16), t("b", 0, 16), t("a", 16, 32), t("b", 32, 48)], "f")  # identical or disjoint
    _check_ranges([t("a", 0, 32), t("a", 8, 16)], "f")  # one method's own overlap: its plan check decides
    with pytest.raises(LoadError, match=r"method 'a' value 0: float32 \[8\] at bytes 0..32 partly overlaps "
                                        r"method 'b' value 0"):
        _check_ranges([t("a", 0, 32), t("b", 16, 48)], "f")
    with pytest.raises(LoadError, match="partly overlaps"):  # hidden behind an agreeing range
        _check_ranges([t("a", 0, 64), t("b", 0, 64), t("a", 8, 16)], "f")
    # crafted: 100k tensors of one method over one range, 100k nested ranges, then a clash at the end
    many = [t("a", 0, 1 << 20, k) for k in range(100_000)] + [t("a", k, k + 4, k) for k in range(1, 100_001)]
    with pytest.raises(LoadError, match="partly overlaps"):
        _check_ranges([*many, t("b", 200_000, (1 << 20) + 4)], "f")
