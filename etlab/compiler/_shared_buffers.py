"""Mutable buffers shared by the methods of one program (`MemoryPlanningPass(share_mutable_buffers=True)`).

A buffer a method mutates (an LLM's KV cache) is state of the module, not of one method: `prefill`
writes the cache `decode` reads. Upstream ExecuTorch lays such a program out as follows, and so
does etlab, byte for byte:

- each method is planned as usual, its mutable buffers left out: activations in memory id 1;
- after every method is planned, each buffer (by fully-qualified name, first seen first: methods in
  the order the program's dict gave them, placeholders in graph order) gets its own bytes of memory
  id 2, one after the other (each rounded up to the alignment), the same offset in every method;
- a buffer one method only reads but another mutates is state in both (planned in memory id 2, not
  stored as a constant);
- every method's `non_const_buffer_sizes` becomes [0, activations, state bytes], the state size the
  same in all of them.

A runtime that gives all methods of a program one memory id 2 (upstream's and etlab's) then lets
`decode` see what `prefill` wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.export.graph_signature import InputKind
from torch.fx import GraphModule, Node

from etlab.compiler._tensor_spec import ALIGNMENT, TensorSpec, align

SHARED_MEM_ID = 2  # activations stay in memory id 1; shared state is memory id 2 (upstream's convention)


@dataclass
class StateBuffer:
    """One placeholder of one method that holds a (possibly) shared buffer."""

    fqn: str
    node: Node
    spec: TensorSpec
    mutated: bool  # the method writes it (a BUFFER_MUTATION); else it only reads it


@dataclass
class SharedBufferState:
    """What the planner collects from every method before placing the shared buffers."""

    methods: list[tuple[GraphModule, object, list[StateBuffer]]] = field(default_factory=list)  # (gm, plan, buffers)


def state_buffers(gm: GraphModule) -> list[StateBuffer]:
    """The buffer placeholders of a method in graph order: mutated ones (`meta["mutable_buffer"]`) and
    read-only ones (a BUFFER input the method keeps as a constant), which are state too when another
    method of the program mutates them."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        spec = node.meta.get("spec")
        if not isinstance(spec, TensorSpec):
            continue
        fqn = node.meta.get("mutable_buffer")
        if fqn:
            out.append(StateBuffer(str(fqn), node, spec, True))
        elif node.meta.get("input_kind") == InputKind.BUFFER and spec.fqn:
            out.append(StateBuffer(spec.fqn, node, spec, False))
    return out


def exclude_from_method_plan(buffers: list[StateBuffer]) -> None:
    """Mutated buffers are placed across methods later, not in the method's own arena."""
    for b in buffers:
        if b.mutated:
            if b.spec.mem_offset is not None or b.spec.mem_id not in (None, 1):
                raise ValueError(f"cannot share mutable buffer {b.fqn!r}: it already has memory id "
                                 f"{b.spec.mem_id} / offset {b.spec.mem_offset}")
            b.spec.mem_id = None


def check_default_mem_ids(plan, method: str) -> None:
    """Sharing puts state in memory id 2, so everything else of the method must be in memory id 1."""
    if len(plan.buffer_sizes) > 2:
        raise ValueError(f"method {method!r}: cannot share mutable buffers when the plan uses memory ids "
                         f"{list(range(1, len(plan.buffer_sizes)))}; every other tensor must be in memory id 1")


def place_shared_buffers(state: SharedBufferState, alignment: int = ALIGNMENT) -> tuple[int, dict[str, int]]:
    """Gives every shared buffer its offset in memory id 2 (see the module doc); returns the state
    size and each buffer's offset. The same buffer must have the same dtype and shape in every method."""
    mutated: dict[str, list[StateBuffer]] = {}
    read_only: dict[str, list[StateBuffer]] = {}
    for _gm, _plan, buffers in state.methods:
        for b in buffers:
            (mutated if b.mutated else read_only).setdefault(b.fqn, []).append(b)
    offsets: dict[str, int] = {}
    arena = 0
    for fqn, entries in mutated.items():
        entries = entries + read_only.get(fqn, [])
        first = entries[0].spec
        for b in entries:
            if (b.spec.dtype, tuple(b.spec.shape)) != (first.dtype, tuple(first.shape)):
                raise ValueError(f"mutable buffer {fqn!r} is {b.spec.dtype} {list(b.spec.shape)} in one method and "
                                 f"{first.dtype} {list(first.shape)} in another; a shared buffer must match")
            b.spec.const, b.spec.data = False, None
            b.spec.mem_id, b.spec.mem_offset = SHARED_MEM_ID, arena
            b.node.meta["mutable_buffer"] = fqn  # state in this method too, even if it only reads it
        offsets[fqn] = arena
        arena += align(first.nbytes, alignment)
    return arena, offsets
