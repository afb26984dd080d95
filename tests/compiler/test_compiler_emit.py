"""Emitter: the .pte's values, instructions, segments and debug maps, read back with etlab.schema."""

from __future__ import annotations

import operator

import pytest
import torch

from etlab.compiler import CompileSpec, ExecutorchBackendConfig, LoweredBackendModule, executorch_call_delegate, to_edge
from etlab.schema import deserialize_ptd, deserialize_pte, load_pte
from etlab.schema import program as P


def _plan(et, name="forward"):
    pte = deserialize_pte(et.buffer)
    return pte, next(p for p in pte.program.execution_plan if p.name == name)


def _instructions(plan):
    return [i.instr_args for c in plan.chains for i in c.instructions]


def test_mlp_kernel_calls_pass_schema_args_then_outputs(export_zoo):
    _, _, ep = export_zoo("mlp")
    et = to_edge(ep).to_executorch()
    pte, plan = _plan(et)
    ops = [(o.name, o.overload) for o in plan.operators]
    assert ops == [("aten::permute_copy", "out"), ("aten::addmm", "out"), ("aten::relu", "out")]
    calls = _instructions(plan)
    layer = ["aten::permute_copy", "aten::addmm", "aten::relu"]
    assert [plan.operators[c.op_index].name for c in calls] == layer * 2 + layer[:2]
    addmm = calls[1]
    # self, mat1, mat2, beta, alpha, out, then the returned out again
    assert len(addmm.args) == 7 and addmm.args[5] == addmm.args[6]
    assert isinstance(plan.values[addmm.args[3]].val, P.Int) and plan.values[addmm.args[3]].val.int_val == 1
    assert plan.outputs == [calls[-1].args[-1]]
    # Constants: buffer 0 reserved; six weights in one aligned segment.
    offsets = pte.program.constant_segment.offsets
    assert offsets[0] == 0 and len(offsets) == 7 and all(o % 16 == 0 for o in offsets)
    weights = [v.val for v in plan.values if isinstance(v.val, P.Tensor) and v.val.data_buffer_idx]
    assert sorted(w.data_buffer_idx for w in weights) == list(range(1, 7))
    seg = bytes(pte.segment_bytes(pte.program.constant_segment.segment_index))
    w0 = next(w for w in weights if w.sizes == [64, 32])
    expected = ep.state_dict["fc1.weight"].detach().numpy().tobytes()
    assert seg[offsets[w0.data_buffer_idx]: offsets[w0.data_buffer_idx] + len(expected)] == expected
    assert plan.non_const_buffer_sizes[0] == 0 and plan.non_const_buffer_sizes[1] > 0
    assert plan.container_meta_type.encoded_inp_str.startswith("[1, ")


def test_every_kernel_instruction_has_debug_handles(zoo_program):
    _, _, _, programs = zoo_program
    edge = to_edge(programs)
    et = edge.to_executorch()
    for method in et.methods:
        _, plan = _plan(et, method)
        handles = et.debug_handle_map[method]
        edge_handles = {n.meta["debug_handle"] for n in edge.exported_program(method).graph.nodes
                        if n.op == "call_function"}
        for i, instr in enumerate(_instructions(plan)):
            if isinstance(instr, (P.KernelCall, P.DelegateCall)):
                assert handles.get(i), f"{method}: instruction {i} has no debug handle"
        assert set(h for hs in handles.values() for h in hs) <= edge_handles | {
            n.meta.get("debug_handle") for gm in edge.exported_program(method).graph_module.modules()
            if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes}


def test_cond_branches_become_jumps_and_moves(export_zoo):
    _, _, ep = export_zoo("cond")
    _, plan = _plan(to_edge(ep).to_executorch())
    instrs = _instructions(plan)
    jumps = [(i, x) for i, x in enumerate(instrs) if isinstance(x, P.JumpFalseCall)]
    moves = [i for i, x in enumerate(instrs) if isinstance(x, P.MoveCall)]
    assert len(jumps) == 2 and len(moves) == 2
    (first, to_false), (second, to_end) = jumps
    assert to_false.destination_instruction == second + 1  # false branch starts after the unconditional jump
    assert to_end.destination_instruction == len(instrs)
    assert isinstance(plan.values[to_end.cond_value_index].val, P.Bool)
    assert plan.values[to_end.cond_value_index].val.bool_val is False
    assert instrs[moves[0]].move_to == instrs[moves[1]].move_to == plan.outputs[0]
    assert first < moves[0] < second < moves[1]


def test_kv_cache_writes_buffers_back_in_place(export_zoo):
    _, _, ep = export_zoo("kv_cache_decoder")
    _, plan = _plan(to_edge(ep).to_executorch())
    instrs = _instructions(plan)
    copies = [x for x in instrs if isinstance(x, P.KernelCall) and plan.operators[x.op_index].name == "aten::copy_"]
    assert len(copies) == 2
    for c in copies:
        dst = plan.values[c.args[0]].val
        assert dst.sizes == [1, 4, 16, 8] and dst.allocation_info is not None and dst.data_buffer_idx == 0
        assert c.args[-1] == c.args[0]
    assert len(plan.inputs) == 2  # the caches are state, not inputs


def test_two_methods_share_constants_and_are_sorted(export_zoo):
    _, _, programs = export_zoo("two_methods")
    et = to_edge(programs, constant_methods={"version": 3}).to_executorch()
    pte = deserialize_pte(et.buffer)
    assert [p.name for p in pte.program.execution_plan] == ["encode", "forward", "version"]
    assert len(pte.program.constant_segment.offsets) == 1 + 4  # encoder and head weights stored once
    version = pte.program.execution_plan[2]
    assert version.values[version.outputs[0]].val == P.Int(3)


def test_views_share_memory_with_their_base(export_zoo):
    _, _, ep = export_zoo("transformer")
    et = to_edge(ep).to_executorch()
    gm = et.exported_program().graph_module
    views = [n for n in gm.graph.nodes if n.meta.get("et_view")]
    assert views
    for node in views:
        spec, base = node.meta["spec"], node.args[0].meta["spec"]
        assert spec.root() is base.root() and (spec.mem_offset == base.mem_offset or base.root().const)
    _, plan = _plan(et)
    names = {o.name for o in plan.operators}
    assert "executorch_prim::et_view" not in names  # static shapes: elided entirely


def test_external_constants_go_to_a_ptd(tmp_path, export_zoo):
    _, _, ep = export_zoo("mlp")
    et = to_edge(ep).to_executorch(ExecutorchBackendConfig(external_constants=True))
    _, plan = _plan(et)
    weights = [v.val for v in plan.values if isinstance(v.val, P.Tensor) and v.val.extra_tensor_info]
    assert {w.extra_tensor_info.fully_qualified_name for w in weights} == set(ep.state_dict)
    assert all(w.extra_tensor_info.location == P.TensorDataLocation.EXTERNAL for w in weights)
    (path,) = et.write_tensor_data_to_file(tmp_path)
    assert path.name == "_default_external_constant.ptd"
    named = deserialize_ptd(path.read_bytes()).named()
    layout, data = named["fc2.weight"]
    assert layout.sizes == [64, 64] and bytes(data) == ep.state_dict["fc2.weight"].detach().numpy().tobytes()
    et.write_to_file(tmp_path / "model.pte")
    assert len(tmp_path.joinpath("model.pte").read_bytes()) < 8192  # weights are not inside


def _hand_lowered_program(extract_segments: bool):
    """add -> [delegate: mul] -> sub, with the delegate made by hand (no partitioner)."""

    class M(torch.nn.Module):
        def forward(self, x, y):
            return (x + y) * y - x

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    edge = to_edge(torch.export.export(M(), (x, y)))
    ep = edge.exported_program()
    gm = ep.graph_module
    mul = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    sub_ep = torch.export.export(torch.nn.Identity(), (x,))  # stands in for the partition
    lowered = LoweredBackendModule("HandBackend", b"\x01\x02payload", [CompileSpec("level", b"3")], sub_ep,
                                   {"op0": [mul.meta["debug_handle"]]})
    gm.add_submodule("lowered_module_0", lowered)
    with gm.graph.inserting_before(mul):
        attr = gm.graph.get_attr("lowered_module_0")
        call = gm.graph.call_function(executorch_call_delegate, (attr, *mul.args))
        call.meta.update(val=(mul.meta["val"],), debug_handle=mul.meta["debug_handle"])
        item = gm.graph.call_function(operator.getitem, (call, 0))
        item.meta["val"] = mul.meta["val"]
    mul.replace_all_uses_with(item)
    gm.graph.erase_node(mul)
    gm.recompile()
    return edge.to_executorch(ExecutorchBackendConfig(extract_delegate_segments=extract_segments)), mul


@pytest.mark.parametrize("extract_segments", [True, False])
def test_delegate_call_is_emitted_with_its_blob(extract_segments):
    et, mul = _hand_lowered_program(extract_segments)
    handle = mul.meta["debug_handle"]
    pte, plan = _plan(et)
    instrs = _instructions(plan)
    (i_call, call), = [(i, x) for i, x in enumerate(instrs) if isinstance(x, P.DelegateCall)]
    assert len(call.args) == 3  # two inputs, one output
    out = plan.values[call.args[2]].val
    assert out.sizes == [2, 3] and out.allocation_info is not None
    (delegate,) = plan.delegates
    assert delegate.id == "HandBackend"
    assert [(c.key, bytes(c.value)) for c in delegate.compile_specs] == [("level", b"3")]
    if extract_segments:
        assert delegate.processed.location == P.DataLocation.SEGMENT
        assert bytes(pte.segment_bytes(delegate.processed.index)) == b"\x01\x02payload"
    else:
        assert delegate.processed.location == P.DataLocation.INLINE
        assert bytes(pte.program.backend_delegate_data[delegate.processed.index].data) == b"\x01\x02payload"
    assert et.delegate_map["forward"][i_call] == {"name": "HandBackend", "delegate_map": {"op0": [handle]}}
    assert et.instruction_id_to_num_outs_map["forward"][i_call] == 1
    # The sub that reads the delegate's output comes after it.
    sub = next(i for i, x in enumerate(instrs) if isinstance(x, P.KernelCall)
               and plan.operators[x.op_index].name == "aten::sub")
    assert sub > i_call and call.args[2] in instrs[sub].args


def test_write_to_file_and_stack_traces(tmp_path, export_zoo):
    _, _, ep = export_zoo("mlp")
    et = to_edge(ep).to_executorch(ExecutorchBackendConfig(emit_stacktrace=True))
    et.write_to_file(tmp_path / "m.pte")
    plan = load_pte(tmp_path / "m.pte").program.execution_plan[0]
    frames = plan.chains[0].stacktrace
    assert len(frames) == len(plan.chains[0].instructions)
    assert any(f.name == "forward" and "zoo.py" in f.filename for fl in frames for f in fl.items)


def test_alignments_are_honoured(export_zoo):
    _, _, ep = export_zoo("mlp")
    et = to_edge(ep).to_executorch(ExecutorchBackendConfig(constant_tensor_alignment=64, segment_alignment=1024,
                                                           delegate_alignment=8192))
    pte = deserialize_pte(et.buffer)
    assert all(o % 64 == 0 for o in pte.program.constant_segment.offsets)
    assert pte.header.segment_base_offset % 8192 == 0
