"""Memory planning: lifetimes of every planned tensor, then offsets in one arena per memory id.

Steps are positions in emission order (control-flow branches inline, true branch first). Tensors
sharing storage (a view and its base, a cond result and what each branch returns) are planned as
one block living from the first member's definition to the last member's use. Algorithms:

- "naive": every block gets its own bytes (the upper bound).
- "greedy": best-fit reuse — blocks, largest first, go into the tightest gap left by blocks whose
  lifetimes overlap theirs (`_best_fit`); a few orderings are tried and the smallest arena kept,
  stopping at the first that reaches the lower bound.
- a callable `algo(blocks, mem_id) -> arena_size` that sets each block's `offset`.

Subclass MemoryPlanningPass and set `spec.mem_id` per node in `run` (then call the parent) to place
tensors in several arenas.

`share_mutable_buffers=True` plans the mutable buffers of all methods once, in memory id 2, shared
by every method of the program (`_shared_buffers`): `run` plans each method without them, and
`run_multimethod`, called once all methods are planned, places them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch.export.graph_signature import ExportGraphSignature, InputKind
from torch.fx import GraphModule, Node

from etlab.compiler import _shared_buffers
from etlab.compiler._best_fit import best_fit
from etlab.compiler._tensor_spec import ALIGNMENT, TensorSpec, align
from etlab.facts.fx import submodules_of


@dataclass(eq=False)
class Block:
    """Storage shared by one or more specs: planned as a unit."""

    specs: list[TensorSpec]
    size: int
    start: int
    end: int
    mem_id: int
    offset: int | None = None


@dataclass
class MemoryPlan:
    """The outcome for one method: arena sizes (index 0 reserved) and the per-step lower bounds."""

    buffer_sizes: list[int] = field(default_factory=lambda: [0])
    lower_bounds: list[int] = field(default_factory=lambda: [0])
    blocks: list[Block] = field(default_factory=list)
    num_steps: int = 0
    # per planner step: the latest runtime instruction at or before it (-1 before the first); set by
    # the emitter, so that analyses speak in instructions without re-deriving the emission order
    step_to_instruction: list[int] = field(default_factory=list)


def linearize(gm: GraphModule) -> Iterator[Node]:
    """Nodes in emission order, control-flow branches inlined before their cond node: the planner's steps."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.cond:
            for branch in submodules_of(node, gm):
                yield from linearize(branch)
        yield node


def specs_of(value) -> list[TensorSpec]:
    """The TensorSpecs in a node's "spec" (one, or a list/tuple of them)."""
    if isinstance(value, TensorSpec):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in specs_of(v)]
    return []


def _node_specs(node: Node) -> list[TensorSpec]:
    return specs_of(node.meta.get("spec"))


def compute_lifetimes(gm: GraphModule) -> tuple[list[TensorSpec], int]:
    """Sets spec.lifetime for every spec of the method; returns (specs in first-seen order, steps)."""
    order = list(linearize(gm))
    specs: dict[int, TensorSpec] = {}
    last = len(order) - 1
    for step, node in enumerate(order):
        for spec in _node_specs(node):
            if id(spec) not in specs:
                specs[id(spec)] = spec
                spec.lifetime = [step, step]
        for arg in node.all_input_nodes:
            for spec in _node_specs(arg):
                if id(spec) in specs:
                    spec.lifetime[1] = max(spec.lifetime[1], step)
    top_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in top_inputs:
        for spec in _node_specs(node):
            spec.lifetime[0] = 0
            if node.meta.get("mutable_buffer") is not None:
                spec.lifetime[1] = last  # state persists across calls
    for spec in specs_of([a.meta.get("spec") for a in gm.graph.output_node().all_input_nodes]):
        spec.lifetime[1] = last
    return list(specs.values()), len(order)


def _blocks(specs: list[TensorSpec]) -> list[Block]:
    groups: dict[int, Block] = {}
    for spec in specs:
        root = spec.root()
        block = groups.get(id(root))
        if block is None:
            block = groups[id(root)] = Block([], 0, spec.lifetime[0], spec.lifetime[1], root.mem_id)
        block.specs.append(spec)
        block.size = max(block.size, spec.allocated_memory)
        block.start, block.end = min(block.start, spec.lifetime[0]), max(block.end, spec.lifetime[1])
    return [b for b in groups.values() if b.mem_id is not None and not any(s.const for s in b.specs)]


def live_bytes(intervals: Iterable[tuple[int, int, int]], num_steps: int) -> list[int]:
    """Bytes live at each step 0 .. num_steps-1, from (first step, last step, bytes) per block."""
    delta = [0] * (num_steps + 1)
    for start, end, size in intervals:
        delta[start] += size
        delta[min(end, num_steps - 1) + 1] -= size
    live, acc = [], 0
    for d in delta[:num_steps]:
        acc += d
        live.append(acc)
    return live


def lower_bound(blocks: list[Block], num_steps: int) -> int:
    """Max over steps of the bytes live at that step: no plan can use less."""
    return max(live_bytes(((b.start, b.end, b.size) for b in blocks), num_steps), default=0)


def naive(blocks: list[Block], mem_id: int) -> int:
    """Places blocks one after another, never reusing memory: the baseline (and a debugging aid when reuse is
    suspected)."""
    offset = 0
    for b in blocks:
        b.offset = offset
        offset += align(b.size)
    return offset


def greedy(blocks: list[Block], mem_id: int) -> int:
    """Best-fit placement tried in a few block orders, keeping the smallest arena; stops early once an order reaches
    the lower bound (the bytes live at the busiest step)."""
    orders = [
        lambda b: (-b.size, b.start),
        lambda b: (b.start, -b.size),
        lambda b: (-(b.end - b.start), -b.size),
        lambda b: (-b.size * (b.end - b.start + 1), b.start),
    ]
    best_size, best_offsets = None, None
    bound = lower_bound(blocks, max((b.end for b in blocks), default=-1) + 1)
    for key in orders:
        size = best_fit(sorted(blocks, key=key))
        if best_size is None or size < best_size:
            best_size, best_offsets = size, [b.offset for b in blocks]
        if best_size <= bound:  # no order can do better than the bytes live at the busiest step
            break
    for b, off in zip(blocks, best_offsets or []):
        b.offset = off
    return best_size or 0


ALGORITHMS: dict[str, Callable[[list[Block], int], int]] = {"naive": naive, "greedy": greedy}


class MemoryPlanningPass:
    """Plans every non-constant tensor of a method into arenas (memory ids >= 1).

    alloc_graph_input / alloc_graph_output: plan user inputs / outputs too (otherwise the caller
    provides their memory at run time). alloc_mutable_buffers: plan mutable buffers (etlab always
    does). share_mutable_buffers: one copy of each mutable buffer for all methods of the program, in
    memory id 2 (see the module doc); pair it with ExecutorchBackendConfig(emit_mutable_buffer_names=True)
    to record each buffer's name in the program, as upstream's examples do.
    """

    def __init__(self, memory_planning_algo: str | Callable = "greedy", alloc_graph_input: bool = True,
                 alloc_graph_output: bool = True, alloc_mutable_buffers: bool = True,
                 share_mutable_buffers: bool = False, alignment: int = ALIGNMENT):
        if share_mutable_buffers and not alloc_mutable_buffers:
            raise ValueError("share_mutable_buffers is only meaningful when alloc_mutable_buffers is True")
        if not alloc_mutable_buffers:
            raise ValueError("alloc_mutable_buffers=False (mutable buffers provided at run time) is not supported")
        if isinstance(memory_planning_algo, str) and memory_planning_algo not in ALGORITHMS:
            raise ValueError(f"memory_planning_algo must be one of {sorted(ALGORITHMS)} or a callable, "
                             f"got {memory_planning_algo!r}")
        if alignment != ALIGNMENT:
            raise ValueError(f"only {ALIGNMENT}-byte alignment is supported, got {alignment}")
        self.memory_planning_algo = memory_planning_algo
        self.alloc_graph_input = alloc_graph_input
        self.alloc_graph_output = alloc_graph_output
        self.alloc_mutable_buffers = alloc_mutable_buffers
        self.share_mutable_buffers = share_mutable_buffers
        self._graph_signature: ExportGraphSignature | None = None
        self._shared = _shared_buffers.SharedBufferState()

    def __call__(self, graph_module: GraphModule):
        return self.call(graph_module)

    def call(self, graph_module: GraphModule):
        """Plans `graph_module` (the pass interface; `run` with the graph signature given at construction)."""
        return self.run(graph_module, self._graph_signature)

    def run(self, graph_module: GraphModule, graph_signature: ExportGraphSignature | None = None) -> MemoryPlan:
        """Sets mem_id/mem_offset on every planned spec; stores and returns the MemoryPlan. With
        share_mutable_buffers, the method's buffers wait for `run_multimethod`."""
        self._mark_unplanned_io(graph_module)
        buffers = _shared_buffers.state_buffers(graph_module) if self.share_mutable_buffers else []
        _shared_buffers.exclude_from_method_plan(buffers)
        specs, steps = compute_lifetimes(graph_module)
        blocks = _blocks(specs)
        algo = self.memory_planning_algo
        algo = ALGORITHMS[algo] if isinstance(algo, str) else algo
        plan = MemoryPlan(num_steps=steps, blocks=blocks)
        mem_ids = sorted({b.mem_id for b in blocks})
        n_arenas = max(mem_ids, default=0)
        plan.buffer_sizes = [0] * (n_arenas + 1)
        plan.lower_bounds = [0] * (n_arenas + 1)
        for mem_id in mem_ids:
            if mem_id < 1:
                raise ValueError(f"memory id {mem_id} is reserved; planned tensors use ids >= 1")
            arena = [b for b in blocks if b.mem_id == mem_id]
            size = algo(arena, mem_id)
            for b in arena:
                if b.offset is None or b.offset % ALIGNMENT:
                    raise ValueError(f"memory planning algorithm left block of {b.specs[0]} at offset {b.offset}")
                for spec in b.specs:
                    spec.mem_id, spec.mem_offset = mem_id, b.offset
                size = max(size, b.offset + b.size)
            plan.buffer_sizes[mem_id] = align(size)
            plan.lower_bounds[mem_id] = lower_bound(arena, steps)
        graph_module.meta["memory_plan"] = plan
        if self.share_mutable_buffers:
            _shared_buffers.check_default_mem_ids(plan, str(graph_module.meta.get("method", "?")))
            self._shared.methods.append((graph_module, plan, buffers))
        return plan

    def run_multimethod(self) -> None:
        """After `run` on every method of a program: places the shared mutable buffers (nothing to do
        without share_mutable_buffers). Starts afresh for the next program."""
        state, self._shared = self._shared, _shared_buffers.SharedBufferState()
        if not self.share_mutable_buffers:
            return
        arena, offsets = _shared_buffers.place_shared_buffers(state, ALIGNMENT)
        shared_id = _shared_buffers.SHARED_MEM_ID
        for _gm, plan, buffers in state.methods:  # every method: [0, activations, state]
            while len(plan.buffer_sizes) < shared_id:
                plan.buffer_sizes.append(0)
                plan.lower_bounds.append(0)
            plan.buffer_sizes.append(arena)
            plan.lower_bounds.append(arena)  # state is live all the time: nothing can reuse it
            for fqn in dict.fromkeys(b.fqn for b in buffers if b.fqn in offsets):
                specs = [b.spec for b in buffers if b.fqn == fqn]
                plan.blocks.append(Block(specs, specs[0].allocated_memory, 0, max(plan.num_steps - 1, 0), shared_id,
                                         offsets[fqn]))

    def discard_multimethod(self) -> None:
        """Forgets the methods `run` collected (a compile that failed before `run_multimethod`)."""
        self._shared = _shared_buffers.SharedBufferState()

    def _mark_unplanned_io(self, gm: GraphModule) -> None:
        if not self.alloc_graph_input:
            for node in gm.graph.nodes:
                if node.op == "placeholder" and node.meta.get("input_kind") == InputKind.USER_INPUT:
                    for spec in _node_specs(node):
                        spec.mem_id = None
        if not self.alloc_graph_output:
            n_mut = gm.meta.get("num_mutation_outputs", 0)
            outs = gm.graph.output_node().args[0]
            outs = outs if isinstance(outs, (tuple, list)) else [outs]
            for o in list(outs)[n_mut:]:
                if isinstance(o, Node):
                    for spec in _node_specs(o):
                        spec.root().mem_id = None
