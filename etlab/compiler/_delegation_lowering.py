"""Graph surgery behind `to_backend`: cut a tagged partition out, splice its delegate call in.

A partition is the set of call_function nodes sharing one delegation tag. Cutting it out yields a
self-contained ExportedProgram whose user inputs are the values flowing into the partition and
whose outputs are the values used outside it; parameter/buffer/constant placeholders used only by
the partition become that program's own inputs (and leave the parent). The parent then calls

    lowered_module_<i> = get_attr
    delegate = executorch_call_delegate(lowered_module_<i>, *inputs)
    out_k = getitem(delegate, k)          # one per partition output
"""

from __future__ import annotations

import copy
import heapq
import itertools
import operator
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    SymBoolArgument,
    SymFloatArgument,
    SymIntArgument,
    TensorArgument,
)
from torch.fx import Graph, GraphModule, Node
from torch.utils import _pytree as pytree

from etlab.compiler._errors import CompileError
from etlab.facts.lowered import LoweredBackendModule, executorch_call_delegate

TAG_KEY = "delegation_tag"
_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
# Node meta worth keeping on the getitem that stands in for a delegated node's value.
_OUTPUT_META_KEYS = ("val", "tensor_meta", "stack_trace", "nn_module_stack")


class DelegationError(CompileError):
    """A partitioner or backend asked for something `to_backend` cannot do; the message says what."""


@dataclass
class WorkingProgram:
    """An ExportedProgram taken apart so partitions can be cut out one after another."""

    graph_module: GraphModule
    input_specs: list[InputSpec]
    output_specs: list[OutputSpec]
    state_dict: dict
    constants: dict
    range_constraints: dict
    module_call_graph: list
    example_inputs: object
    verifiers: list
    next_debug_handle: int

    @classmethod
    def from_program(cls, ep: ExportedProgram) -> WorkingProgram:
        """The parts of an ExportedProgram, with the next free debug handle, ready for partitions to be cut out."""
        sig = ep.graph_signature
        return cls(ep.graph_module, list(sig.input_specs), list(sig.output_specs), dict(ep.state_dict),
                   dict(ep.constants), dict(ep.range_constraints), list(ep.module_call_graph),
                   ep.example_inputs, list(ep.verifiers), _max_debug_handle(ep.graph_module) + 1)

    def to_program(self) -> ExportedProgram:
        """The parts put back together as an ExportedProgram, its graph linted and recompiled first."""
        self.graph_module.graph.lint()
        self.graph_module.recompile()
        return ExportedProgram(
            root=self.graph_module, graph=self.graph_module.graph,
            graph_signature=ExportGraphSignature(self.input_specs, self.output_specs),
            state_dict=self.state_dict, range_constraints=self.range_constraints,
            module_call_graph=self.module_call_graph, example_inputs=self.example_inputs,
            constants=self.constants, verifiers=self.verifiers)

    def take_debug_handle(self) -> int:
        """A debug handle no node of the program uses yet (for a delegate call node)."""
        handle = self.next_debug_handle
        self.next_debug_handle += 1
        return handle


@dataclass
class PartitionCut:
    """One tag's partition: its nodes, the parent values at its boundary, and its own program."""

    tag: str
    members: list[Node]  # call_function nodes, in graph order
    owned_constants: list[Node]  # parent constants the partition reads (copied if read outside it too)
    inputs: list[Node]  # parent values the delegate call takes, in order
    outputs: list[Node]  # members whose values are used outside the partition, in order
    program: ExportedProgram


def program_with_shared_state(ep: ExportedProgram) -> ExportedProgram:
    """A copy of `ep` with its own graph and node meta (safe to tag) but the same tensors."""
    graph = Graph()
    graph._codegen = copy.deepcopy(ep.graph._codegen)
    env: dict[Node, Node] = {}
    for node in ep.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    gm = GraphModule(ep.graph_module, graph)
    gm.meta.update(ep.graph_module.meta)
    sig = ep.graph_signature
    return ExportedProgram(
        root=gm, graph=graph, graph_signature=ExportGraphSignature(list(sig.input_specs), list(sig.output_specs)),
        state_dict=dict(ep.state_dict), range_constraints=dict(ep.range_constraints),
        module_call_graph=list(ep.module_call_graph), example_inputs=ep.example_inputs,
        constants=dict(ep.constants), verifiers=list(ep.verifiers))


def check_partitioner_kept_graph(original: ExportedProgram, tagged: ExportedProgram, partitioner: str) -> None:
    """Partitioners may only add tags; a changed graph would silently drop or duplicate work."""
    if not isinstance(tagged, ExportedProgram):
        raise DelegationError(f"{partitioner}.partition returned tagged_exported_program of type "
                              f"{type(tagged).__name__}; expected an ExportedProgram")

    def shape(ep: ExportedProgram) -> list[tuple]:
        return [(n.op, n.name, str(n.target), tuple(a.name for a in n.all_input_nodes)) for n in ep.graph.nodes]

    before, after = shape(original), shape(tagged)
    if before != after:
        diff = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
        where = before[diff][1] if diff < len(before) else "the end of the graph"
        raise DelegationError(f"{partitioner}.partition changed the graph (first difference at node {where}); "
                              "a partitioner may only set node.meta['delegation_tag']")


def nodes_by_tag(graph: Graph, partition_tags: dict, partitioner: str) -> dict[str, list[Node]]:
    """Tag -> tagged nodes in graph order, rejecting tags and node kinds that cannot be delegated."""
    found: dict[str, list[Node]] = {}
    for node in graph.nodes:
        tag = node.meta.get(TAG_KEY)
        if tag is None:
            continue
        if tag not in partition_tags:
            raise DelegationError(f"{partitioner} tagged node {node.name!r} with {tag!r}, which is not a key of "
                                  f"partition_tags ({sorted(partition_tags)})")
        if node.op not in ("call_function", "placeholder"):
            raise DelegationError(f"{partitioner} tagged {node.op} node {node.name!r}; only operator "
                                  "(call_function) nodes and parameter/buffer placeholders can be delegated")
        found.setdefault(tag, []).append(node)
    return found


def collect_partition(work: WorkingProgram, tag: str, tagged: list[Node], copy_shared_constants: bool = False
                      ) -> PartitionCut:
    """Validate one tag's partition and build the ExportedProgram the backend will compile.

    Constants read only by the partition move into its program. Constants read outside it too are
    passed in as inputs, or, with `copy_shared_constants` (backends that compile weights into
    their payload, such as XNNPACK), copied into its program as well and kept in the parent.
    """
    spec_of = {getattr(spec.arg, "name", None): spec for spec in work.input_specs}
    mutated = {spec.target for spec in work.output_specs
               if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION)}
    members = [n for n in tagged if n.op == "call_function"]
    if not members:
        raise DelegationError(f"partition {tag!r} tags only placeholders ({[n.name for n in tagged]}); "
                              "it needs at least one operator node")
    member_set = set(members)

    def is_constant(node: Node) -> bool:
        spec = spec_of.get(node.name) if node.op == "placeholder" else None
        return spec is not None and spec.kind in _CONSTANT_KINDS and spec.target not in mutated

    def is_movable_constant(node: Node) -> bool:
        return is_constant(node) and all(user in member_set for user in node.users)

    for node in tagged:
        if node.op == "placeholder" and not is_movable_constant(node):
            raise DelegationError(
                f"partition {tag!r} tags placeholder {node.name!r}, but only parameters, buffers and constants "
                "that are not mutated and are used by this partition alone can move into a partition "
                f"(its users: {[u.name for u in node.users]})")
    _check_convex(work.graph_module.graph, member_set, tag)

    order = {n: i for i, n in enumerate(work.graph_module.graph.nodes)}
    boundary: dict[Node, None] = {}
    for node in members:
        for source in node.all_input_nodes:
            if source not in member_set:
                boundary[source] = None
    owns = is_constant if copy_shared_constants else is_movable_constant
    owned = sorted((n for n in boundary if owns(n)), key=order.__getitem__)
    owned_set = set(owned)
    inputs = sorted((n for n in boundary if n not in owned_set), key=order.__getitem__)
    outputs = [n for n in members if any(user not in member_set for user in n.users)]
    if not outputs:
        raise DelegationError(f"partition {tag!r} ({[n.name for n in members]}) produces no value used outside it")
    for node in outputs:
        if isinstance(node.meta.get("val"), (list, tuple)):
            raise DelegationError.at(node, f"partition {tag!r}: node {node.name!r} returns several values and "
                                           "its getitem users are outside the partition; tag those getitem nodes too")
    program = _partition_program(work, spec_of, owned, inputs, members, outputs)
    return PartitionCut(tag, members, owned, inputs, outputs, program)


def _check_convex(graph: Graph, member_set: set[Node], tag: str) -> None:
    # `downstream` holds outside nodes that depend on the partition; a member depending on one of
    # them means the partition's output feeds back into its input through the rest of the graph.
    downstream: set[Node] = set()
    for node in graph.nodes:
        sources = node.all_input_nodes
        if node in member_set:
            via = next((s for s in sources if s in downstream), None)
            if via is not None:
                raise DelegationError.at(
                    node, f"partition {tag!r} is not convex: its node {node.name!r} depends on {via.name!r}, which is "
                    "outside the partition yet depends on it, so delegating it would create a cycle; "
                    f"tag {via.name!r} too or split the partition")
        elif any(s in member_set or s in downstream for s in sources):
            downstream.add(node)


def _argument_for(node: Node, name: str):
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return TensorArgument(name=name)
    if isinstance(val, torch.SymInt):
        return SymIntArgument(name=name)
    if isinstance(val, torch.SymFloat):
        return SymFloatArgument(name=name)
    if isinstance(val, torch.SymBool):
        return SymBoolArgument(name=name)
    if val is None or isinstance(val, (int, float, bool, str)):
        return ConstantArgument(name=name, value=val)
    raise DelegationError(f"value {node.name!r} crosses a partition boundary but its meta['val'] is a "
                          f"{type(val).__name__}; only tensors and scalars can")


def _partition_program(work: WorkingProgram, spec_of: dict, owned: list[Node], inputs: list[Node],
                       members: list[Node], outputs: list[Node]) -> ExportedProgram:
    graph = Graph()
    env: dict[Node, Node] = {}
    input_specs: list[InputSpec] = []
    state_dict: dict = {}
    constants: dict = {}
    for node in owned:
        spec = spec_of[node.name]
        env[node] = placeholder = graph.placeholder(node.name)
        placeholder.meta = copy.copy(node.meta)
        input_specs.append(InputSpec(spec.kind, TensorArgument(name=node.name), spec.target, spec.persistent))
        in_state_dict = spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent)
        (state_dict if in_state_dict else constants)[spec.target] = (
            work.state_dict if in_state_dict else work.constants)[spec.target]
    for node in inputs:
        env[node] = placeholder = graph.placeholder(node.name)
        placeholder.meta = {key: node.meta[key] for key in ("val", "tensor_meta") if key in node.meta}
        input_specs.append(InputSpec(InputKind.USER_INPUT, _argument_for(node, placeholder.name), None))
    for node in members:
        env[node] = copied = graph.node_copy(node, env.__getitem__)
        copied.meta.pop(TAG_KEY, None)
    graph.output(tuple(env[n] for n in outputs))
    output_args = [_argument_for(n, env[n].name) for n in outputs]
    output_specs = [OutputSpec(OutputKind.USER_OUTPUT, arg, None) for arg in output_args]

    user_args = [spec.arg for spec in input_specs if spec.kind == InputKind.USER_INPUT]
    in_spec = pytree.tree_structure((tuple(range(len(user_args))), {}))
    out_spec = pytree.tree_structure(tuple(range(len(outputs))))
    call_signature = ModuleCallSignature(inputs=user_args, outputs=output_args, in_spec=in_spec, out_spec=out_spec,
                                         forward_arg_names=[arg.name for arg in user_args])
    return ExportedProgram(
        root=GraphModule(torch.nn.Module(), graph), graph=graph,
        graph_signature=ExportGraphSignature(input_specs, output_specs), state_dict=state_dict,
        range_constraints=dict(work.range_constraints), module_call_graph=[ModuleCallEntry("", call_signature)],
        example_inputs=None, constants=constants, verifiers=list(work.verifiers))


def splice_delegate(work: WorkingProgram, cut: PartitionCut, lowered: LoweredBackendModule) -> Node:
    """Replace the partition's nodes in the parent by a call of `lowered`; returns the call node."""
    gm = work.graph_module
    graph = gm.graph
    index = 0
    while hasattr(gm, f"lowered_module_{index}"):
        index += 1
    name = f"lowered_module_{index}"
    gm.add_submodule(name, lowered)

    with graph.inserting_after(cut.members[-1]):
        module_node = graph.get_attr(name)
    with graph.inserting_after(module_node):
        call = graph.call_function(executorch_call_delegate, (module_node, *cut.inputs))
    module_node.meta["debug_handle"] = work.take_debug_handle()
    call.meta["val"] = tuple(n.meta.get("val") for n in cut.outputs)
    call.meta["debug_handle"] = work.take_debug_handle()

    renamed: dict[str, str] = {}
    previous = call
    for position, node in enumerate(cut.outputs):
        with graph.inserting_after(previous):
            item = graph.call_function(operator.getitem, (call, position))
        item.meta.update({key: node.meta[key] for key in _OUTPUT_META_KEYS if key in node.meta})
        item.meta["debug_handle"] = work.take_debug_handle()
        node.replace_all_uses_with(item)
        renamed[node.name] = item.name
        previous = item

    for node in reversed(cut.members):
        graph.erase_node(node)
    _drop_owned_constants(work, cut.owned_constants)
    work.output_specs = [
        OutputSpec(spec.kind, type(spec.arg)(name=renamed[spec.arg.name]), spec.target)
        if isinstance(spec.arg, (TensorArgument, SymIntArgument, SymFloatArgument, SymBoolArgument))
        and spec.arg.name in renamed else spec
        for spec in work.output_specs]
    # The call sits after the partition's last node; outside users placed between partition
    # nodes now come before the value they read, so restore a topological order.
    if not _is_topologically_sorted(graph):
        _stable_toposort(graph)
    return call


def _drop_owned_constants(work: WorkingProgram, owned: list[Node]) -> None:
    if not owned:
        return
    owned = [node for node in owned if not node.users]  # shared constants stay for their other readers
    if not owned:
        return
    names = {node.name for node in owned}
    for node in owned:
        work.graph_module.graph.erase_node(node)
    dropped = [spec for spec in work.input_specs if getattr(spec.arg, "name", None) in names]
    work.input_specs = [spec for spec in work.input_specs if getattr(spec.arg, "name", None) not in names]
    still_used = {spec.target for spec in work.input_specs}
    for spec in dropped:
        if spec.target not in still_used:
            work.state_dict.pop(spec.target, None)
            work.constants.pop(spec.target, None)


def _is_topologically_sorted(graph: Graph) -> bool:
    seen: set[Node] = set()
    for node in graph.nodes:
        if any(source not in seen for source in node.all_input_nodes):
            return False
        seen.add(node)
    return True


def _stable_toposort(graph: Graph) -> None:
    """Reorder nodes topologically, keeping the current order wherever dependencies allow."""
    nodes = list(graph.nodes)
    index = {node: i for i, node in enumerate(nodes)}
    waiting = {node: len(node.all_input_nodes) for node in nodes}
    ready = [index[node] for node in nodes if waiting[node] == 0]
    heapq.heapify(ready)
    ordered: list[Node] = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        ordered.append(node)
        for user in node.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, index[user])
    if len(ordered) != len(nodes):
        raise DelegationError("the graph has a cycle after delegation; this is a bug in etlab's to_backend")
    for before, node in itertools.pairwise(ordered):
        before.append(node)


def _max_debug_handle(gm: torch.nn.Module) -> int:
    """Largest debug handle in `gm`, its nested graphs and already-lowered partitions."""
    largest = 0
    if isinstance(gm, GraphModule):
        for node in gm.graph.nodes:
            handle = node.meta.get("debug_handle")
            if isinstance(handle, int):
                largest = max(largest, handle)
    for child in gm.children():
        if isinstance(child, LoweredBackendModule):
            largest = max(largest, _max_debug_handle(child.original_module.graph_module))
        elif isinstance(child, GraphModule):
            largest = max(largest, _max_debug_handle(child))
    return largest
