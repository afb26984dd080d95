"""ExportedProgram (torch.export training IR) -> Edge-dialect ExportedProgram.

Edge graphs hold functional core-ATen OpOverloads (plus dim_order_ops and registered custom ops);
every call_function node carries meta 'debug_handle' (>= 1, shared by the nodes decomposed from one
exported node), 'stack_trace', 'nn_module_stack' and 'val'.

Steps, all in place on one copy of the graph: disabled autocast regions inlined; debug handles;
in-place ops to functional ops; per-node core decomposition (nested control-flow graphs too); views
to *_copy; clone/_to_copy to dim-order ops; Python scalars to constant tensors; dead-code removal;
user outputs made distinct; verification. Only when a mutation or a decomposition cannot be rewritten
node by node does the program go through torch's `run_decompositions` (a whole re-trace).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.fx import GraphModule, Node

from etlab.compiler import _edge_passes as passes
from etlab.compiler._autocast import inline_disabled_autocast
from etlab.compiler._config import EdgeCompileConfig
from etlab.compiler._decompose import NeedsRetrace, core_decompositions, decompose, onednn_off
from etlab.compiler._errors import CompileError
from etlab.compiler._functionalize import functionalize, has_mutation
from etlab.compiler._graph import fake_mode_of
from etlab.compiler._quantizer_fold import constant_values, fold_quantized_constants
from etlab.compiler._verify import verify_graph, verify_outputs
from etlab.facts.fx import all_graph_modules, copy_graph_module, submodules_of


def assign_debug_handles(gm: GraphModule) -> None:
    """Numbers every call_function node (submodules too, outermost first) from 1, keeping existing ones."""
    modules = list(all_graph_modules(gm))
    nodes = [n for m in modules for n in m.graph.nodes if n.op == "call_function"]
    next_handle = max((n.meta.get("debug_handle") or 0 for n in nodes), default=0) + 1
    for node in nodes:
        if not node.meta.get("debug_handle"):
            node.meta["debug_handle"] = next_handle
            next_handle += 1


def _renamed(spec, renamed: dict[str, str]):
    if isinstance(spec.arg, TensorArgument) and spec.arg.name in renamed:
        return dataclasses.replace(spec, arg=TensorArgument(renamed[spec.arg.name]))
    return spec


class _EdgeBuilder:
    """The program being lowered: graph, signature and constants, updated by the passes."""

    def __init__(self, ep: ExportedProgram):
        self.ep = ep
        val_map: dict[Node, Node] = {}
        self.gm = copy_graph_module(ep.graph_module, val_map, lazy=True)
        renamed = {old.name: new.name for old, new in val_map.items() if old.name != new.name}
        self.input_specs = [_renamed(s, renamed) for s in ep.graph_signature.input_specs]
        self.output_specs = [_renamed(s, renamed) for s in ep.graph_signature.output_specs]
        self.constants = dict(ep.constants)
        self.fake_mode = fake_mode_of(self.gm) or torch._subclasses.fake_tensor.FakeTensorMode()
        self._constant_cache: dict[tuple, Node] = {}

    # -- constants -----------------------------------------------------------------------------------------
    def make_constant(self, value: torch.Tensor, user: Node) -> Node:
        """A lifted constant input (top graph) or a get_attr (control-flow subgraph) holding `value`."""
        graph = user.graph
        key = (id(graph), value.dtype, value.item() if value.dim() == 0 else id(value))
        if key in self._constant_cache:
            return self._constant_cache[key]
        with self.fake_mode:
            fake = torch.empty(tuple(value.shape), dtype=value.dtype)
        if graph is self.gm.graph:
            name = self._fresh_name("_lifted_tensor_constant")
            placeholders = [n for n in graph.nodes if n.op == "placeholder"]
            first_user = next((i for i, s in enumerate(self.input_specs) if s.kind == InputKind.USER_INPUT),
                              len(placeholders))
            anchor = placeholders[first_user] if first_user < len(placeholders) else None
            ctx = graph.inserting_before(anchor) if anchor is not None else graph.inserting_after(
                placeholders[-1] if placeholders else None)
            with ctx:
                node = graph.placeholder(name)
            self.input_specs.insert(first_user, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), name))
            self.constants[name] = value
        else:
            node = self._branch_operand(graph, value, user, fake)
        node.meta["val"] = fake
        self._constant_cache[key] = node
        return node

    def _branch_operand(self, graph: torch.fx.Graph, value: torch.Tensor, user: Node, fake) -> Node:
        """A constant used inside a cond branch: lifted at the top and passed in as an extra operand."""
        cond = self._cond_calling(graph)
        outer = self.make_constant(value, cond)
        cond.args = (*cond.args[:3], [*cond.args[3], outer])
        result = None
        for branch in submodules_of(cond, cond.graph.owning_module):
            last = [n for n in branch.graph.nodes if n.op == "placeholder"][-1]
            with branch.graph.inserting_after(last):
                ph = branch.graph.placeholder(self._fresh_name("_constant_operand", branch))
            ph.meta["val"] = fake
            if branch.graph is graph:
                result = ph
        return result

    def _cond_calling(self, graph: torch.fx.Graph) -> Node:
        for gm in all_graph_modules(self.gm):
            for node in gm.graph.nodes:
                if node.op == "call_function" and node.target is torch.ops.higher_order.cond and any(
                        sub.graph is graph for sub in submodules_of(node, gm)):
                    return node
        raise CompileError("a control-flow branch is not called by any torch.cond", op="cond")

    def _fresh_name(self, prefix: str, module=None) -> str:
        taken = set(self.constants) | {n.name for n in self.gm.graph.nodes}
        if isinstance(module, GraphModule):
            taken |= {n.name for n in module.graph.nodes} | {str(n.target) for n in module.graph.nodes}
        i = 0
        while f"{prefix}{i}" in taken or (module is not None and hasattr(module, f"{prefix}{i}")):
            i += 1
        return f"{prefix}{i}"

    # -- signature -----------------------------------------------------------------------------------------
    def add_mutations(self, mutated: dict[Node, Node]) -> None:
        """Adds a mutation output (before the user outputs) for each placeholder written in place."""
        if not mutated:
            return
        specs = {s.arg.name: s for s in self.input_specs if isinstance(s.arg, TensorArgument)}
        out_node = self.gm.graph.output_node()
        outs = list(out_node.args[0])
        new_specs, new_outs = [], []
        for placeholder, value in mutated.items():
            spec = specs[placeholder.name]
            if spec.kind == InputKind.BUFFER:
                kind = OutputKind.BUFFER_MUTATION
            elif spec.kind == InputKind.USER_INPUT:
                kind = OutputKind.USER_INPUT_MUTATION
            else:
                raise CompileError.at(value, f"writes {spec.kind.name.lower()} {spec.target!r} in place; only "
                                             "buffers and user inputs may be mutated")
            new_specs.append(OutputSpec(kind, TensorArgument(value.name), spec.target or placeholder.name))
            new_outs.append(value)
        n_mut = self.first_user_output()
        self.output_specs[n_mut:n_mut] = new_specs
        outs[n_mut:n_mut] = new_outs
        out_node.args = (tuple(outs),)

    def first_user_output(self) -> int:
        return sum(1 for s in self.output_specs if s.kind != OutputKind.USER_OUTPUT)

    def build(self) -> ExportedProgram:
        out_node = self.gm.graph.output_node()
        outs = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else [out_node.args[0]]
        output_specs = []
        for spec, node in zip(self.output_specs, outs):
            arg = TensorArgument(node.name) if isinstance(node, Node) and isinstance(spec.arg, TensorArgument) \
                else spec.arg
            output_specs.append(OutputSpec(spec.kind, arg, spec.target))
        used = {n.name for n in self.gm.graph.nodes if n.op == "placeholder"}
        input_specs = [s for s in self.input_specs if not isinstance(s.arg, TensorArgument) or s.arg.name in used]
        live_targets = {s.target for s in input_specs}
        state_dict = {k: v for k, v in self.ep.state_dict.items() if k in live_targets}
        constants = {k: v for k, v in self.constants.items() if k in live_targets}
        return ExportedProgram(  # generates the edge graph's code: self.gm's own code is never generated
            root=self.gm, graph=self.gm.graph,
            graph_signature=ExportGraphSignature(input_specs, output_specs),
            state_dict=state_dict, range_constraints=dict(self.ep.range_constraints),
            module_call_graph=list(self.ep.module_call_graph), example_inputs=self.ep.example_inputs,
            constants=constants, verifiers=list(self.ep.verifiers),
        )


def _drop_unused_placeholders(builder: _EdgeBuilder) -> None:
    """Parameters/buffers/constants nothing reads (BatchNorm's num_batches_tracked) leave the program."""
    for node in list(builder.gm.graph.nodes):
        if node.op != "placeholder" or node.users:
            continue
        spec = next((s for s in builder.input_specs if isinstance(s.arg, TensorArgument) and s.arg.name == node.name),
                    None)
        if spec is not None and spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            builder.gm.graph.erase_node(node)


def _lower(builder: _EdgeBuilder, config: EdgeCompileConfig) -> None:
    gm = builder.gm
    for sub in list(all_graph_modules(gm)):
        inline_disabled_autocast(sub)
    assign_debug_handles(gm)
    if has_mutation(gm):
        builder.add_mutations(functionalize(gm))
    for sub in all_graph_modules(gm):
        if sub is not gm and has_mutation(sub):
            raise NeedsRetrace("mutation inside a control-flow branch")
        passes.fold_constant_factories(sub, builder.make_constant, config)
        decompose(sub, builder.fake_mode, config)


def to_edge_program(ep: ExportedProgram, config: EdgeCompileConfig | None = None) -> ExportedProgram:
    """Lowers one exported method to the Edge dialect (see module docstring). The input is not modified."""
    if not isinstance(ep, ExportedProgram):
        raise TypeError(f"to_edge expects a torch.export.ExportedProgram, got {type(ep).__name__}")
    config = config or EdgeCompileConfig()
    builder = _EdgeBuilder(ep)
    try:
        _lower(builder, config)
    except NeedsRetrace:
        table = {op: fn for op, fn in core_decompositions().items() if op not in config._preserve_ops}
        with onednn_off():  # portable RNN decompositions (see _decompose)
            builder = _EdgeBuilder(ep.run_decompositions(table))
        _lower(builder, config)
    fold_quantized_constants(builder.gm, constant_values(builder.input_specs, builder.output_specs,
                                                         builder.ep.state_dict, builder.constants),
                             builder.make_constant)
    for sub in all_graph_modules(builder.gm):
        passes.views_to_copies(sub, builder.fake_mode)
        if not config._skip_dim_order:
            passes.to_dim_order_ops(sub)
        passes.scalars_to_tensors(sub, builder.make_constant)
        passes.remove_dead_code(sub)
    _drop_unused_placeholders(builder)
    first_user = builder.first_user_output()
    verify_outputs(builder.gm, first_user)
    passes.fresh_outputs(builder.gm, first_user)
    for sub in all_graph_modules(builder.gm):
        verify_graph(sub, config, ep.range_constraints)
    return builder.build()
