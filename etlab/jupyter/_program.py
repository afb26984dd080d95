"""What the .pte viewer shows, computed from the verified file alone (no torch graph needed):
the summary, the instruction graph (a `GraphModel` the shared graph_view.js draws) and the memory
plan (planned tensors with their lifetimes over instruction steps).

Also the program's signature: which instructions call a kernel and which a delegate, per method.
A .pte, its .etrecord and its .etdp runs agree on it, so it groups files by program and tells a
mismatched pair apart (see `signature_hash`, `etlab.inspector.run_mismatch`, which also defines
the signature: `pte_signature`, re-exported here as `signature`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

from etlab.facts.pte_memory import dtype_name, memory_plan, tensor_bytes
from etlab.inspector import op_label
from etlab.inspector import pte_signature as signature
from etlab.jupyter._dataflow import Source, instruction_flow
from etlab.schema.program import DelegateCall, JumpFalseCall, KernelCall, PteFile, Tensor


def signature_hash(sig: dict[str, list[list]]) -> str:
    """A short stable hash of a signature: files with the same hash are of the same program."""
    text = json.dumps({m: sorted(map(tuple, rows)) for m, rows in sorted(sig.items())}, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _value_label(values, idx: int) -> str:
    v = values[idx].val if 0 <= idx < len(values) else None
    if isinstance(v, Tensor):
        return f"{dtype_name(v)}{list(v.sizes or ())}"
    return type(v).__name__ if v is not None else "none"


def method_summary(pte: PteFile, plan) -> dict:
    """One method's row of the summary: inputs/outputs, operators with call counts, delegates, arenas."""
    values = plan.values or ()
    instructions = [ins for chain in plan.chains or () for ins in chain.instructions or ()]
    ops = [op_label(o) for o in plan.operators or ()]
    counts = {name: 0 for name in ops}
    delegate_calls = {}
    for ins in instructions:
        a = ins.instr_args
        if isinstance(a, KernelCall) and 0 <= a.op_index < len(ops):
            counts[ops[a.op_index]] += 1
        elif isinstance(a, DelegateCall):
            delegate_calls[a.delegate_index] = delegate_calls.get(a.delegate_index, 0) + 1
    const_bytes = 0
    for ev in values:
        t = ev.val
        if isinstance(t, Tensor) and t.allocation_info is None and t.data_buffer_idx > 0:
            const_bytes += tensor_bytes(t)
    return {
        "name": str(plan.name),
        "inputs": [_value_label(values, int(i)) for i in plan.inputs or ()],
        "outputs": [_value_label(values, int(i)) for i in plan.outputs or ()],
        "instructions": len(instructions),
        "values": len(values),
        "operators": [{"name": k, "calls": v} for k, v in counts.items()],
        "delegates": [{"index": i, "backend": str(d.id), "calls": delegate_calls.get(i, 0)}
                      for i, d in enumerate(plan.delegates or ())],
        "arena_bytes": [int(s) for s in list(plan.non_const_buffer_sizes or ())[1:]],
        "constant_bytes": const_bytes,
    }


def instruction_graph(plan):
    """The method as a graph of its instructions (a `GraphModel`): an edge from the instruction (or
    method input) that produced a value to every instruction that reads it, following out arguments,
    multi-output results, tensor lists, delegate calls, views and cond branches (`_dataflow`); each
    node's shapes are the planned shapes of what it writes; delegate calls colored by backend."""
    from etlab.visualizer import GraphModel, GraphNode

    values = plan.values or ()
    ops = [op_label(o) for o in plan.operators or ()]
    delegates = [str(d.id) for d in plan.delegates or ()]
    model = GraphModel(title=f"instructions of {plan.name!r}", kind="runtime", method=str(plan.name))
    colors = ["#d62728", "#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#8c564b"]
    node_of: dict[Source, int] = {}
    for i in plan.inputs or ():
        node = GraphNode(id=len(model.nodes), name=f"input_{len(model.nodes)}", kind="input", op="placeholder",
                         group=None, shapes=_shapes(values, [int(i)]))
        model.nodes.append(node)
        node_of[("input", int(i))] = node.id
    flow = instruction_flow(plan)
    edges: set[tuple[int, int]] = set()

    def link(sources, dst: int) -> None:
        for src in sources:
            if src in node_of and node_of[src] != dst:
                edges.add((node_of[src], dst))

    for f in flow.steps:
        a, step = f.instruction.instr_args, f.step
        if isinstance(a, KernelCall):
            op = ops[a.op_index] if 0 <= a.op_index < len(ops) else f"op #{a.op_index}"
            node = GraphNode(id=len(model.nodes), name=f"{step}: {op.split('::')[-1]}", kind="op", op=op, group=None)
        elif isinstance(a, DelegateCall):
            backend = delegates[a.delegate_index] if 0 <= a.delegate_index < len(delegates) else "?"
            model.backend_colors.setdefault(backend, colors[len(model.backend_colors) % len(colors)])
            node = GraphNode(id=len(model.nodes), name=f"{step}: {backend} #{a.delegate_index}", kind="delegate",
                             op="executorch_call_delegate", group=None, backend=backend)
        elif isinstance(a, JumpFalseCall) and any(f.sources.values()):  # a computed condition, not a goto
            node = GraphNode(id=len(model.nodes), name=f"{step}: jump if false", kind="control_flow",
                             op="jump_false", group=None)
        else:
            continue
        node.handles = [step]  # the instruction id: what the memory plan and the run's events key on
        node.shapes = _shapes(values, f.writes)
        model.nodes.append(node)
        node_of[("step", step)] = node.id
        for r in f.reads:
            link(f.sources.get(r, ()), node.id)
    for o in plan.outputs or ():
        node = GraphNode(id=len(model.nodes), name=f"output_{len(model.nodes)}", kind="output", op="output",
                         group=None, shapes=_shapes(values, [int(o)]))
        model.nodes.append(node)
        link(flow.outputs.get(int(o), ()), node.id)
    model.edges = sorted(edges)
    return model


def _shapes(values, idxs: list[int]) -> list[list]:
    out = []
    for i in idxs:
        v = values[i].val if 0 <= i < len(values) else None
        if isinstance(v, Tensor):
            out.append([int(s) for s in v.sizes or ()])
    return out


def memory_plan_view(pte: PteFile, method: str | None = None) -> dict:
    """The memory plan of one method (the first when `method` is not one): planned tensors and step count."""
    plans = list(pte.program.execution_plan or ())
    plan = next((p for p in plans if p.name == method), plans[0] if plans else None)
    if plan is None:
        return {"memory": [], "steps": 0}
    return {"memory": [asdict(b) for b in memory_plan(plan)],
            "steps": sum(len(c.instructions or ()) for c in plan.chains or ())}


def pte_view(pte: PteFile, *, method: str | None = None) -> dict:
    """Everything the .pte viewer draws, as JSON-ready data."""
    plans = list(pte.program.execution_plan or ())
    if not plans:
        return {"methods": [], "graph": None, "memory": [], "signature": "", "segments": len(pte.segments)}
    plan = next((p for p in plans if p.name == method), plans[0])
    sig = signature(pte)
    return {
        "version": pte.program.version,
        "segments": len(pte.segments),
        "segment_bytes": sum(len(s) for s in pte.segments),
        "methods": [method_summary(pte, p) for p in plans],
        "method": str(plan.name),
        "graph": instruction_graph(plan).to_json(),
        **memory_plan_view(pte, str(plan.name)),
        "signature": signature_hash(sig),
    }
