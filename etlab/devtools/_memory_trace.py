"""The memory plan of a compiled method as a table and as a Chrome trace.

Steps are runtime instructions: step i is the method's i-th instruction (chain 0, as the emitter
writes it). A tensor lives from the instruction that writes it to the last instruction that
reads it, both included; what is alive before the first instruction (inputs) starts at step 0,
and outputs (and mutable state) live to the last instruction.

The planner counts its own steps (`TensorSpec.lifetime`, every node of the planned graph,
placeholders included); the emitter records, per planner step, the latest instruction at or before
it (`MemoryPlan.step_to_instruction`), so lifetimes keep their order and no two tensors that overlap
for the planner stop overlapping here. The peak of live bytes (`memory_lower_bound`) therefore
equals the planner's `MemoryPlan.lower_bounds`, with one exception: an input that is never read is
freed by the planner before the first instruction, while here nothing is earlier than
instruction 0, so it counts there too.

Tensors that share storage (a view and its base) are one block for the planner: the live-bytes
helpers count such a block once, over the union of its members' lifetimes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields

import pandas as pd
from torch.fx import GraphModule

from etlab.compiler import ExecutorchProgramManager, TensorSpec, align, linearize, live_bytes, specs_of
from etlab.facts.fx import node_op_name
from etlab.facts.source import module_path, source_line
from etlab.schema import write_atomic

COLUMNS = ["tensor", "mem_id", "offset", "size", "first_step", "last_step", "producing_op", "debug_handle"]


@dataclass
class PlannedTensor:
    """One planned tensor of a method: where it lives in which arena, and when."""

    tensor: str  # name of the node that defines it, with [k] for output k of a multi-output node
    mem_id: int
    offset: int
    size: int  # bytes of its data (the arena slot is this rounded up to the planner's alignment)
    first_step: int  # instruction that writes it (0 for what exists before the first instruction)
    last_step: int  # last instruction that reads it
    producing_op: str  # operator of the defining node ("placeholder" for inputs)
    debug_handle: int | None
    dtype: str
    shape: tuple[int, ...]
    storage: str  # the tensor whose memory this one shares; its own name when it owns it
    module: str  # innermost nn.Module path of the defining node ("" when unknown)
    source: str  # last line of the defining node's stack trace ("" when unknown)


def _planned_graph(program_manager, method_name: str) -> GraphModule:
    if not isinstance(program_manager, ExecutorchProgramManager):
        raise TypeError("program_manager must be an ExecutorchProgramManager (the result of to_executorch()), "
                        f"got {type(program_manager).__name__}")
    if not isinstance(method_name, str):
        raise TypeError(f"method_name must be a str, got {type(method_name).__name__}")
    methods = program_manager.methods
    if method_name not in methods:
        raise ValueError(f"method_name {method_name!r} is not a method of the program; methods are {sorted(methods)}")
    return program_manager.exported_program(method_name).graph_module


@dataclass
class InstructionSteps:
    """How the planner's steps map onto a method's runtime instructions (both recorded by the compiler)."""

    instructions: list[str]  # per instruction: "node (operator)", in execution order
    step_to_instruction: list[int]  # per planner step: the latest instruction at or before it, -1 before any


def instruction_steps(gm: GraphModule) -> InstructionSteps:
    """The runtime instructions of a planned and emitted graph, and where each planner step falls among them."""
    plan = gm.meta.get("memory_plan")
    labels = gm.meta.get("instruction_labels")
    if plan is None or labels is None or len(plan.step_to_instruction) != plan.num_steps:
        raise ValueError("the graph has no emitted memory plan; was it compiled with to_executorch()?")
    return InstructionSteps(list(labels), list(plan.step_to_instruction))


def planned_tensors(program_manager, method_name: str = "forward") -> list[PlannedTensor]:
    """Every tensor of the method that memory planning placed in an arena, in definition order."""
    gm = _planned_graph(program_manager, method_name)
    to_instruction = instruction_steps(gm).step_to_instruction
    names: dict[int, str] = {}  # id(spec) -> name of the node that first carries it
    out: list[PlannedTensor] = []
    pending: list[tuple[TensorSpec, PlannedTensor]] = []
    for node in linearize(gm):
        if node.op == "output":
            continue
        specs = specs_of(node.meta.get("spec"))
        for k, spec in enumerate(specs):
            if id(spec) in names:
                continue
            name = node.name if len(specs) == 1 else f"{node.name}[{k}]"  # one row per output
            names[id(spec)] = name
            if spec.mem_id is None or spec.const:
                continue
            if spec.mem_offset is None:
                raise ValueError(f"{method_name}: tensor {name!r} has no memory offset; was the program "
                                 "memory-planned (to_executorch())?")
            handle = node.meta.get("debug_handle")
            first, last = (max(to_instruction[s], 0) for s in spec.lifetime)
            t = PlannedTensor(
                tensor=name, mem_id=int(spec.mem_id), offset=int(spec.mem_offset), size=int(spec.nbytes),
                first_step=first, last_step=last, producing_op=node_op_name(node),
                debug_handle=int(handle) if isinstance(handle, int) else None,
                dtype=str(spec.dtype).replace("torch.", ""), shape=tuple(int(d) for d in spec.shape),
                storage="", module=module_path(node.meta.get("nn_module_stack")),
                source=source_line(node.meta.get("stack_trace")),
            )
            pending.append((spec, t))
            out.append(t)
    for spec, t in pending:
        t.storage = names.get(id(spec.root()), t.tensor)
    return out


def memory_plan_dataframe(program_manager, method_name: str = "forward") -> pd.DataFrame:
    """One row per planned tensor of a method.

    Columns: tensor, mem_id, offset, size, first_step, last_step, producing_op, debug_handle,
    then dtype, shape, storage, module, source. Steps are runtime instruction indices (see the
    module doc). `df.attrs` holds `method`, `num_steps` (instructions), `instructions` (what each
    runs, "node (operator)") and `buffer_sizes` (arena bytes per memory id, index 0 unused).
    """
    tensors = planned_tensors(program_manager, method_name)
    instructions = instruction_steps(_planned_graph(program_manager, method_name)).instructions
    cols = [f.name for f in fields(PlannedTensor)]
    df = pd.DataFrame([asdict(t) for t in tensors], columns=cols)
    df = df.astype({"mem_id": "int64", "offset": "int64", "size": "int64", "first_step": "int64",
                    "last_step": "int64", "debug_handle": "Int64"})
    df.attrs["method"] = method_name
    df.attrs["num_steps"] = len(instructions)
    df.attrs["instructions"] = instructions
    plan = program_manager.memory_plans.get(method_name)
    df.attrs["buffer_sizes"] = list(plan.buffer_sizes) if plan is not None else []
    return df


def _as_plan_frame(plan, method_name: str) -> pd.DataFrame:
    if isinstance(plan, pd.DataFrame):
        missing = [c for c in (*COLUMNS, "storage") if c not in plan.columns]
        if missing:
            raise ValueError(f"plan: not a memory_plan_dataframe() table, missing columns {missing}")
        return plan
    return memory_plan_dataframe(plan, method_name)


def _blocks(df: pd.DataFrame, aligned: bool) -> pd.DataFrame:
    """One row per storage block: mem_id, size, first_step, last_step."""
    sizes = df["size"].map(align) if aligned else df["size"]
    frame = df.assign(size=sizes)
    return frame.groupby(["mem_id", "storage"], as_index=False).agg(
        size=("size", "max"), first_step=("first_step", "min"), last_step=("last_step", "max"))


def live_bytes_per_step(plan, mem_id: int | None = None, *, aligned: bool = True,
                        method_name: str = "forward") -> pd.Series:
    """Bytes live during each instruction (a Series indexed by step, 0 .. num_steps-1).

    plan: a `memory_plan_dataframe()` table or an ExecutorchProgramManager (then `method_name`).
    mem_id: one arena, or None for all together. aligned: count each block's slot as the planner
    does (its size rounded up to 16 bytes), so the maximum matches `MemoryPlan.lower_bounds`
    (see the module doc for the one exception).
    """
    df = _as_plan_frame(plan, method_name)
    if mem_id is not None:
        if not isinstance(mem_id, int) or mem_id < 1:
            raise ValueError(f"mem_id must be a memory id >= 1 or None, got {mem_id!r}")
        df = df[df["mem_id"] == mem_id]
    last = int(df["last_step"].max()) + 1 if len(df) else 0
    num_steps = max(int(df.attrs.get("num_steps") or 0), last)
    blocks = _blocks(df, aligned)
    live = live_bytes(zip(blocks["first_step"].tolist(), blocks["last_step"].tolist(), blocks["size"].tolist()),
                      num_steps)
    series = pd.Series(live, index=pd.RangeIndex(num_steps, name="step"), name="live_bytes", dtype="int64")
    return series


def memory_lower_bound(plan, mem_id: int | None = None, *, aligned: bool = True, method_name: str = "forward") -> int:
    """The most bytes live during any one instruction: no plan of these lifetimes can use less."""
    live = live_bytes_per_step(plan, mem_id, aligned=aligned, method_name=method_name)
    return int(live.max()) if len(live) else 0


# --- Chrome trace -------------------------------------------------------------------------------


def _rows(df: pd.DataFrame, by_offset: bool) -> tuple[list[int], list[str]]:
    """A trace row (thread) per event, so that events on one row never overlap in time.

    by_offset: rows ordered by offset, one per offset unless tensors sharing it overlap in time
    (views of one storage); otherwise rows are lanes packed first-fit by start step.
    """
    row_of = [0] * len(df)
    labels: list[str] = []
    groups = df.groupby("offset", sort=True).groups if by_offset else {None: df.index}
    for key, idx in groups.items():
        lane_ends: list[int] = []  # last step of the latest event in each lane of this group
        first_row = len(labels)
        for i in sorted(idx, key=lambda i: (df.at[i, "first_step"], df.at[i, "last_step"])):
            start = int(df.at[i, "first_step"])
            lane = next((k for k, end in enumerate(lane_ends) if end < start), None)
            if lane is None:
                lane = len(lane_ends)
                lane_ends.append(0)
                labels.append(f"offset {key}" + (f" #{lane + 1}" if lane else "") if by_offset else f"lane {lane}")
            lane_ends[lane] = int(df.at[i, "last_step"])
            row_of[df.index.get_loc(i)] = first_row + lane
    return row_of, labels


def memory_trace_events(plan, enable_memory_offsets: bool = True, method_name: str = "forward",
                        ommit_metadata: bool = False) -> dict:
    """The Chrome-trace document `generate_memory_trace` writes (see there)."""
    df = _as_plan_frame(plan, method_name)
    events: list[dict] = []
    buffer_sizes = list(df.attrs.get("buffer_sizes") or [])
    for mem_id in sorted(df["mem_id"].unique().tolist()):
        part = df[df["mem_id"] == mem_id].reset_index(drop=True)
        arena = buffer_sizes[mem_id] if mem_id < len(buffer_sizes) else None
        label = f"mem_id {mem_id}" + (f" ({arena} bytes)" if arena is not None else "")
        events.append({"name": "process_name", "ph": "M", "pid": int(mem_id), "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": int(mem_id), "tid": 0,
                       "args": {"sort_index": int(mem_id)}})
        rows, labels = _rows(part, enable_memory_offsets)
        for tid, row_label in enumerate(labels):
            events.append({"name": "thread_name", "ph": "M", "pid": int(mem_id), "tid": tid,
                           "args": {"name": row_label}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": int(mem_id), "tid": tid,
                           "args": {"sort_index": tid}})
        for r, t in zip(rows, part.itertuples(index=False)):
            handle = None if pd.isna(t.debug_handle) else int(t.debug_handle)
            events.append({
                "name": t.tensor, "cat": "memory_allocation", "ph": "X",
                "ts": int(t.first_step), "dur": int(t.last_step - t.first_step + 1),
                "pid": int(mem_id), "tid": r,
                "args": {} if ommit_metadata else {
                    "size": int(t.size), "offset": int(t.offset), "mem_id": int(mem_id),
                    "producing_op": t.producing_op, "debug_handle": handle, "dtype": t.dtype,
                    "shape": list(t.shape), "storage": t.storage, "fqn": t.module, "source": t.source},
            })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"method": df.attrs.get("method", method_name), "time_unit": "instruction (1 instruction = 1 us)",
                      "num_steps": int(df.attrs.get("num_steps") or 0), "buffer_sizes": buffer_sizes,
                      "rows": "offset" if enable_memory_offsets else "lane"},
    }


def generate_memory_trace(program_manager, chrome_trace_filename: str | os.PathLike,
                          enable_memory_offsets: bool = True, method_name: str = "forward",
                          ommit_metadata: bool = False) -> dict:
    """Writes the method's memory plan as Chrome-trace JSON (Perfetto, chrome://tracing), atomically.

    One process per memory id; each planned tensor is a complete event from the instruction that
    writes it (`ts`) for its lifetime in instructions (`dur = last - first + 1`), with args size, offset,
    producing_op, debug_handle (and dtype, shape, storage, fqn, source). With
    enable_memory_offsets the rows (threads) are placed by offset, top to bottom, so the trace
    reads as the arena over time; otherwise tensors are packed into as few rows as possible.
    ommit_metadata (upstream's spelling): leave the events' args out, for a smaller file.
    Returns the written document.
    """
    if not isinstance(chrome_trace_filename, (str, os.PathLike)):
        raise TypeError(f"chrome_trace_filename must be a path, got {type(chrome_trace_filename).__name__}")
    doc = memory_trace_events(memory_plan_dataframe(program_manager, method_name), enable_memory_offsets,
                              method_name, ommit_metadata)
    write_atomic(chrome_trace_filename, json.dumps(doc, indent=1).encode())
    return doc
