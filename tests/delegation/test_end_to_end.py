"""Delegated programs through the whole stack: compile to .pte, run on etlab's runtime, trace."""

from __future__ import annotations

import pytest
import torch

from etlab.compiler import CompileSpec, to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.runtime import Runtime
from etlab.schema import deserialize_etdump, deserialize_pte
from etlab.schema import program as P


def _compile(module, inputs, compile_specs=None):
    ep = torch.export.export(module, inputs)
    return to_edge_transform_and_lower(ep, partitioner=[DemoPartitioner(compile_specs)]).to_executorch()


def _delegate_calls(et):
    plan = deserialize_pte(et.buffer).program.execution_plan[0]
    return plan, [i.instr_args for c in plan.chains for i in c.instructions
                  if isinstance(i.instr_args, P.DelegateCall)]


@pytest.fixture(scope="module")
def mlp_program(mlp):
    module, inputs, _ = mlp
    return module, inputs, _compile(module, inputs)


def test_pte_holds_one_delegate_per_partition(mlp_program):
    _, _, et = mlp_program
    plan, calls = _delegate_calls(et)
    assert len(calls) == 3
    assert [d.id for d in plan.delegates] == ["DemoBackend"] * 3
    pte = deserialize_pte(et.buffer)
    for delegate in plan.delegates:
        assert delegate.processed.location == P.DataLocation.SEGMENT
        assert bytes(pte.segment_bytes(delegate.processed.index))[:4] == b"ETDB"
    delegate_maps = et.delegate_map["forward"]
    assert len(delegate_maps) == 3
    assert all(entry["name"] == "DemoBackend" and entry["delegate_map"] for entry in delegate_maps.values())


@pytest.mark.parametrize("model", ["mlp", "add_mul"])
def test_runtime_executes_delegated_program_like_eager(request, model):
    runtime = Runtime.get()
    module, inputs, _ = request.getfixturevalue(model)
    et = _compile(module, inputs)
    method = runtime.load_program(et.buffer).load_method("forward")
    for _ in range(2):  # the delegate's handle is reused across calls
        (out,) = method.execute(list(inputs))
        torch.testing.assert_close(out, module(*inputs), rtol=0, atol=1e-5)


@pytest.mark.parametrize("identifiers", [b"generated", b"names"])
def test_etdump_has_delegate_events(tmp_path, add_mul, identifiers):
    runtime = Runtime.get()
    module, inputs, _ = add_mul
    et = _compile(module, inputs, [CompileSpec("identifiers", identifiers)])
    program = runtime.load_program(et.buffer, enable_etdump=True, debug_buffer_size=1 << 16)
    program.load_method("forward").execute(list(inputs))
    path = tmp_path / "run.etdp"
    program.write_etdump_result_to_file(path, tmp_path / "run.bin")

    blocks = deserialize_etdump(path.read_bytes()).run_data
    events = [e.profile_event for block in blocks for e in block.events if e.profile_event is not None]
    delegated = [e for e in events if e.delegate_debug_id_int != -1 or e.delegate_debug_id_str]
    # per DelegateCall instruction: one event per backend op, under the ids its debug_handle_map uses
    reported: dict[int, list] = {}
    for event in delegated:
        key = event.delegate_debug_id_str if identifiers == b"names" else event.delegate_debug_id_int
        reported.setdefault(event.instruction_id, []).append(key)
    expected = {instr: list(entry["delegate_map"]) for instr, entry in et.delegate_map["forward"].items()}
    assert reported == expected
    assert {bytes(e.delegate_debug_metadata) for e in delegated} == {b"add", b"mul"}
    assert all(e.end_time >= e.start_time for e in delegated)
    # each backend op's output is logged as a delegate intermediate output
    logged = [e.debug_event for block in blocks for e in block.events
              if e.debug_event is not None and (e.debug_event.delegate_debug_id_int != -1
                                                or e.debug_event.delegate_debug_id_str)]
    assert len(logged) == len(delegated)
    assert all(list(e.debug_entry.tensor.sizes) == [3, 5] for e in logged)


def test_add_mul_model_is_split_around_unsupported_ops(add_mul):
    module, inputs, _ = add_mul
    plan, calls = _delegate_calls(_compile(module, inputs))
    assert len(calls) == 2
    kernels = [plan.operators[i.instr_args.op_index].name for c in plan.chains for i in c.instructions
               if isinstance(i.instr_args, P.KernelCall)]
    # to_edge turns the Python scalar of `+ 1.0` into a constant tensor, so that add is delegated too
    assert kernels == ["aten::relu"]


def test_kv_cache_decoder_with_delegates_keeps_its_state():
    from etlab.models import make_kv_cache_decoder

    module, inputs = make_kv_cache_decoder()
    et = _compile(module, inputs)
    assert et.delegate_map["forward"]  # some of its projections went to the DemoBackend
    method = Runtime.get().load_program(et.buffer).load_method("forward")
    for _ in range(3):  # the cache buffers advance on both sides at every step
        got = method.execute(list(inputs))
        want = torch.utils._pytree.tree_leaves(module(*inputs))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-5)
