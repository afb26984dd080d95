"""memory_plan_dataframe / live bytes / generate_memory_trace against the compiler's plan and the .pte."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from itertools import pairwise

import pytest
import torch

from etlab.compiler import to_edge
from etlab.devtools import (
    generate_memory_trace,
    live_bytes_per_step,
    memory_lower_bound,
    memory_plan_dataframe,
)
from etlab.schema import deserialize_pte, scalar_type_to_dtype
from etlab.schema import program as P

COLUMNS = ["tensor", "mem_id", "offset", "size", "first_step", "last_step", "producing_op", "debug_handle"]


def _pte_allocations(buffer: bytes, method: str) -> set[tuple[int, int, int]]:
    """(mem_id, offset, nbytes) of every planned tensor value the .pte declares."""
    plan = next(p for p in deserialize_pte(buffer).program.execution_plan if p.name == method)
    out = set()
    for v in plan.values:
        t = v.val
        if isinstance(t, P.Tensor) and t.allocation_info is not None:
            a = t.allocation_info
            nbytes = math.prod(t.sizes) * scalar_type_to_dtype(t.scalar_type).itemsize
            out.add((a.memory_id, a.memory_offset_low | (a.memory_offset_high << 32), nbytes))
    return out


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
    assert len(live) == plan.num_steps and int(live.max()) == memory_lower_bound(df)


def test_mlp_rows_name_ops_and_debug_handles(mlp):
    df = memory_plan_dataframe(mlp[2]).set_index("tensor")
    assert df.loc["x", "producing_op"] == "placeholder" and df.loc["x", "first_step"] == 0
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
