"""memory_plan_dataframe / live bytes / generate_memory_trace against the compiler's plan and the .pte."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from itertools import pairwise

import pytest
import torch

from etlab.compiler import to_edge, to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.devtools import (
    generate_memory_trace,
    live_bytes_per_step,
    memory_lower_bound,
    memory_plan_dataframe,
)
from etlab.models import make_cnn
from etlab.schema import deserialize_pte, scalar_type_to_dtype
from etlab.schema import program as P


@pytest.fixture(scope="module")
def cnn_lowered():
    """The zoo CNN (80 lifted weights before its first op) with its adds and classifier delegated."""
    module, inputs = make_cnn()
    edge = to_edge_transform_and_lower(torch.export.export(module, tuple(inputs)), partitioner=[DemoPartitioner()])
    return edge.to_executorch()


COLUMNS = ["tensor", "mem_id", "offset", "size", "first_step", "last_step", "producing_op", "debug_handle"]


def _pte_plan(buffer: bytes, method: str) -> P.ExecutionPlan:
    return next(p for p in deserialize_pte(buffer).program.execution_plan if p.name == method)


def _allocation(value: P.EValue) -> tuple[int, int, int] | None:
    """(mem_id, offset, nbytes) of a planned tensor value, else None."""
    t = value.val
    if not isinstance(t, P.Tensor) or t.allocation_info is None:
        return None
    a = t.allocation_info
    nbytes = math.prod(t.sizes) * scalar_type_to_dtype(t.scalar_type).itemsize
    return a.memory_id, a.memory_offset_low | (a.memory_offset_high << 32), nbytes


def _pte_allocations(buffer: bytes, method: str) -> set[tuple[int, int, int]]:
    """(mem_id, offset, nbytes) of every planned tensor value the .pte declares."""
    return {a for v in _pte_plan(buffer, method).values if (a := _allocation(v)) is not None}


@pytest.mark.parametrize("program", ["mlp", "cond_program"])
def test_rows_match_pte_allocation_info_and_lower_bound(program, request):
    et = request.getfixturevalue(program)
    et = et[2] if isinstance(et, tuple) else et
    df = memory_plan_dataframe(et)
    assert list(df.columns[: len(COLUMNS)]) == COLUMNS
    assert df["tensor"].is_unique and len(df) > 0
    assert set(zip(df["mem_id"], df["offset"], df["size"])) == _pte_allocations(et.buffer, "forward")
    assert (df["first_step"] <= df["last_step"]).all()
    assert df.attrs["buffer_sizes"] == et.memory_plans["forward"].buffer_sizes
    plan = et.memory_plans["forward"]
    for mem_id in range(1, len(plan.buffer_sizes)):
        assert memory_lower_bound(df, mem_id) == plan.lower_bounds[mem_id] <= plan.buffer_sizes[mem_id]
    live = live_bytes_per_step(et)  # from the manager directly
    instructions = _pte_plan(et.buffer, "forward").chains[0].instructions
    assert df.attrs["num_steps"] == len(df.attrs["instructions"]) == len(instructions) == len(live)
    assert int(live.max()) == memory_lower_bound(df)


def _args(plan: P.ExecutionPlan, instruction: P.Instruction) -> list[int]:
    """Value indices an instruction of the .pte takes (tensor list arguments unpacked)."""
    out = []
    for i in getattr(instruction.instr_args, "args", None) or []:
        val = plan.values[i].val
        out.extend(val.items or [] if isinstance(val, P.TensorList) else [i])
    return out


@pytest.mark.parametrize("program", ["mlp", "cnn_lowered"])
def test_steps_are_the_pte_instructions_that_write_and_read_each_tensor(program, request):
    et = request.getfixturevalue(program)
    et = et[2] if isinstance(et, tuple) else et
    df = memory_plan_dataframe(et)
    plan = _pte_plan(et.buffer, "forward")
    instructions = plan.chains[0].instructions
    last = len(instructions) - 1
    for r in df.itertuples():
        where = (r.mem_id, r.offset, r.size)
        if r.producing_op == "placeholder":  # inputs exist before the first instruction
            assert r.first_step == 0
            candidates = plan.inputs
        else:  # written by the instruction at first_step
            assert df.attrs["instructions"][r.first_step].startswith(r.tensor.split("[")[0] + " ")
            candidates = _args(plan, instructions[r.first_step])
        if r.size == 0:
            continue  # batch norm's empty outputs all sit at one offset: not told apart by location
        (value,) = {v for v in candidates if _allocation(plan.values[v]) == where}
        readers = [i for i, ins in enumerate(instructions) if value in _args(plan, ins)]
        if value in plan.outputs:
            assert r.last_step == last, r.tensor
        else:
            assert r.last_step == max(readers), f"{r.tensor}: last read at {max(readers)}, not {r.last_step}"
    # the emitter's instruction -> debug handle map agrees on which node each kernel step runs
    handles = et.debug_handle_map["forward"]
    for r in df[df["producing_op"].str.endswith(".out")].itertuples():
        assert handles[r.first_step] == [r.debug_handle]


def test_inputs_start_at_instruction_zero_and_end_at_their_last_reader(cnn_lowered):
    df = memory_plan_dataframe(cnn_lowered)
    x = df.set_index("tensor").loc["x"]
    # the first convolution reads the image: the ~80 weight placeholders before it take no step
    assert (x["first_step"], x["last_step"]) == (0, 0)
    assert df.attrs["instructions"][0] == "convolution_default (aten.convolution.out)"
    assert df["last_step"].max() == df.attrs["num_steps"] - 1
    assert memory_lower_bound(df, 1) == cnn_lowered.memory_plans["forward"].lower_bounds[1]


def test_cond_steps_follow_the_emitted_jumps_and_moves(cond_program):
    df = memory_plan_dataframe(cond_program)
    plan = _pte_plan(cond_program.buffer, "forward")
    kinds = [type(i.instr_args).__name__ for i in plan.chains[0].instructions]
    labels = df.attrs["instructions"]
    assert [("jump" in t, "move" in t) for t in labels] == [(k == "JumpFalseCall", k == "MoveCall") for k in kinds]


class _UnusedInput(torch.nn.Module):
    def forward(self, x, unused):
        return x * 2


def test_an_unread_input_is_the_one_difference_from_the_planner_bound():
    """The planner frees an input nobody reads before the first instruction; here it counts at step 0."""
    et = to_edge(torch.export.export(_UnusedInput(), (torch.randn(4, 8), torch.randn(64)))).to_executorch()
    df = memory_plan_dataframe(et)
    assert df.attrs["num_steps"] == 1 and sorted(df["size"]) == [128, 128, 256]
    # planner: (x + unused) before the multiply, (x + result) during it; here all three at step 0
    assert et.memory_plans["forward"].lower_bounds[1] == 128 + 256
    assert memory_lower_bound(df, 1) == 128 + 256 + 128


def test_mlp_rows_name_ops_and_debug_handles(mlp):
    df = memory_plan_dataframe(mlp[2]).set_index("tensor")
    assert df.loc["x", "producing_op"] == "placeholder" and df.loc["x", "first_step"] == 0
    assert df.loc["x", "last_step"] == 1  # read by the first addmm (instruction 0 permutes a weight)
    addmm = df[df["producing_op"] == "aten.addmm.out"]
    assert len(addmm) == 3 and addmm["debug_handle"].notna().all()
    assert (addmm["size"] == addmm["shape"].map(math.prod) * 4).all()
    assert (df["storage"] == df.index).all()  # no aliasing in the MLP


class _ViewOfIntermediate(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        return y.view(-1) + 1, y.sum()


def test_shared_storage_counted_once():
    module = _ViewOfIntermediate()
    et = to_edge(torch.export.export(module, (torch.randn(4, 8),))).to_executorch()
    df = memory_plan_dataframe(et)
    assert df["tensor"].is_unique
    aliased = df[df["storage"] != df["tensor"]]
    assert len(aliased) > 0
    owner = df.set_index("tensor").loc[aliased["storage"]]
    assert (owner["offset"].to_numpy() == aliased["offset"].to_numpy()).all()
    # Counting every row on its own would overstate what is live while view and base overlap.
    naive = [0] * int(df.attrs["num_steps"])
    for r in df.itertuples():
        for s in range(r.first_step, r.last_step + 1):
            naive[s] += -(-r.size // 16) * 16
    live = live_bytes_per_step(df).tolist()
    assert all(n >= v for n, v in zip(naive, live)) and naive != live
    assert memory_lower_bound(df) == et.memory_plans["forward"].lower_bounds[1]


def _x_events(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


@pytest.mark.parametrize("offsets", [True, False])
@pytest.mark.parametrize("program", ["mlp", "cond_program"])
def test_chrome_trace(program, offsets, request, tmp_path):
    et = request.getfixturevalue(program)
    et = et[2] if isinstance(et, tuple) else et
    path = tmp_path / "trace.json"
    returned = generate_memory_trace(et, path, enable_memory_offsets=offsets)
    doc = json.loads(path.read_text())
    assert doc == returned and sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    df = memory_plan_dataframe(et).set_index("tensor")
    events = _x_events(doc)
    assert sorted(e["name"] for e in events) == sorted(df.index)
    rows = defaultdict(list)
    for e in events:
        r = df.loc[e["name"]]
        assert (e["ts"], e["dur"], e["pid"]) == (r.first_step, r.last_step - r.first_step + 1, r.mem_id)
        assert e["args"]["size"] == r["size"] and e["args"]["offset"] == r.offset
        assert e["args"]["producing_op"] == r.producing_op
        rows[(e["pid"], e["tid"])].append(e)
    thread_names = {(m["pid"], m["tid"]): m["args"]["name"] for m in doc["traceEvents"] if m["name"] == "thread_name"}
    for key, evs in rows.items():
        evs.sort(key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in pairwise(evs)), f"overlap on row {key}"
        if offsets:
            assert {e["args"]["offset"] for e in evs} == {int(thread_names[key].split()[1])}


def test_bad_arguments(mlp):
    with pytest.raises(TypeError, match="program_manager must be an ExecutorchProgramManager"):
        memory_plan_dataframe(object())
    with pytest.raises(ValueError, match="method_name 'nope' is not a method"):
        memory_plan_dataframe(mlp[2], "nope")
    with pytest.raises(ValueError, match="mem_id must be"):
        live_bytes_per_step(mlp[2], mem_id=0)


def test_chrome_trace_without_metadata(mlp, tmp_path):
    doc = generate_memory_trace(mlp[2], tmp_path / "t.json", ommit_metadata=True)
    assert _x_events(doc) and all(e["args"] == {} for e in _x_events(doc))
    with pytest.raises(TypeError, match="chrome_trace_filename must be a path"):
        generate_memory_trace(mlp[2], None)
