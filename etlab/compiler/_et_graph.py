"""Edge program -> ExecuTorch graph: write-backs for mutated buffers, out variants, views, tensor specs.

The result keeps the edge graph's structure; node targets become out-variant ops (aten.add.out)
with the functional op kept in meta['edge_op'], and every tensor value gets meta['spec'] (a
TensorSpec, or a list of them for multi-output nodes). Views that can share their base's memory
(view_copy not feeding the output) stay `aten.view_copy.default` with meta['et_view'] = True.
"""

from __future__ import annotations

import operator

import torch
from torch._ops import HigherOrderOperator, OpOverload
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule, Node

from etlab.compiler import _dim_order_ops
from etlab.compiler._errors import CompileError
from etlab.compiler._graph import call
from etlab.compiler._out_variants import out_variant
from etlab.compiler._shapes import dim_order_of
from etlab.compiler._tensor_spec import TensorSpec, spec_from_val
from etlab.facts.fx import copy_graph_module, submodules_of

aten = torch.ops.aten

# Ops emitted as they are (not out variants).
_AS_IS = {aten.copy_.default, aten.sym_size.int, aten.sym_numel.default, aten.sym_storage_offset.default}


def _outputs(gm: GraphModule) -> list:
    args = gm.graph.output_node().args[0]
    return list(args) if isinstance(args, (tuple, list)) else [args]


def insert_write_backs(gm: GraphModule, ep: ExportedProgram) -> None:
    """A mutated buffer/input gets `aten.copy_(placeholder, new_value)` before the output."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    by_target = {s.target: ph for s, ph in zip(ep.graph_signature.input_specs, phs) if s.kind == InputKind.BUFFER}
    by_name = {s.arg.name: ph for s, ph in zip(ep.graph_signature.input_specs, phs)
               if s.kind == InputKind.USER_INPUT}
    out_node = gm.graph.output_node()
    for spec, value in zip(ep.graph_signature.output_specs, _outputs(gm)):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            target = by_target[spec.target]
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            target = by_name[spec.target]
        else:
            continue
        with gm.graph.inserting_before(out_node):
            call(gm.graph, aten.copy_.default, (target, value), like=value, val=target.meta.get("val"))


def _fresh_branch_outputs(branch: GraphModule) -> None:
    """A branch returning its own input (or one value twice) returns a copy: outputs need their own memory."""
    out_node = branch.graph.output_node()
    outs, seen = _outputs(branch), set()
    for i, o in enumerate(outs):
        if isinstance(o, Node) and (o.op in ("placeholder", "get_attr") or o in seen):
            with branch.graph.inserting_before(out_node):
                outs[i] = call(branch.graph, _dim_order_ops.clone_dim_order, (o,),
                               {"dim_order": dim_order_of(o.meta["val"])}, like=o, val=o.meta.get("val"))
        seen.add(outs[i])
    out_node.args = (tuple(outs),)


def to_out_variants(gm: GraphModule) -> None:
    """Retargets each functional op call (in cond branches too) to its out variant, since the runtime's kernels write
    into memory that planning placed; view_copy nodes that are not outputs become views instead. A CompileError
    names an op with no out variant (no kernel could run it)."""
    output_users = set(_outputs(gm))
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if isinstance(node.target, HigherOrderOperator):
            if node.target is torch.ops.higher_order.cond:
                for branch in submodules_of(node, gm):
                    _fresh_branch_outputs(branch)
                    to_out_variants(branch)
            continue
        if not isinstance(node.target, OpOverload) or node.target in _AS_IS:
            continue
        if node.target is aten.view_copy.default and node not in output_users:
            node.meta["et_view"] = True
            continue
        out = out_variant(node.target)
        if out is None:
            raise CompileError.at(node, "has no out variant (an overload with out= arguments), so no runtime kernel "
                                        "can run it")
        node.meta["edge_op"] = node.target
        node.target = out


class _SpecBuilder:
    def __init__(self, ep: ExportedProgram, range_constraints: dict):
        self.ep = ep
        self.ranges = range_constraints

    def spec(self, val, name: str) -> TensorSpec | list | None:
        if isinstance(val, torch.Tensor):
            try:
                return spec_from_val(val, self.ranges, name)
            except ValueError as e:
                raise CompileError(str(e)) from None
        if isinstance(val, (tuple, list)):
            return [self.spec(v, f"{name}[{i}]") for i, v in enumerate(val)]
        return None

    def assign(self, gm: GraphModule, placeholder_specs: list | None = None) -> None:
        """Sets meta['spec'] on every tensor-valued node of gm; `placeholder_specs` for branch graphs."""
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if placeholder_specs is not None:
            for node, spec in zip(phs, placeholder_specs):
                node.meta["spec"] = spec
        else:
            self._top_placeholders(gm, phs)
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(gm, node.target)
                if isinstance(value, torch.Tensor):
                    spec = self.spec(node.meta.get("val", value), node.name)
                    spec.const, spec.mem_id, spec.data = True, None, value
                    node.meta["spec"] = spec
            elif node.op == "call_function":
                self._call(gm, node)

    def _top_placeholders(self, gm: GraphModule, phs: list[Node]) -> None:
        sig = self.ep.graph_signature
        mutated = {s.target for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
        for node, ispec in zip(phs, sig.input_specs):
            spec = self.spec(node.meta.get("val"), node.name)
            node.meta["input_kind"] = ispec.kind
            if isinstance(spec, TensorSpec):
                if ispec.kind in (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR) or (
                        ispec.kind == InputKind.BUFFER and ispec.target not in mutated):
                    value = self.ep.state_dict.get(ispec.target)
                    if value is None:
                        value = self.ep.constants[ispec.target]
                    spec.const, spec.mem_id, spec.data = True, None, value
                    spec.fqn = ispec.target if ispec.kind != InputKind.CONSTANT_TENSOR else None
                elif ispec.kind == InputKind.BUFFER:
                    node.meta["mutable_buffer"] = ispec.target
            node.meta["spec"] = spec

    def _call(self, gm: GraphModule, node: Node) -> None:
        if node.target is operator.getitem:
            src = node.args[0].meta.get("spec")
            node.meta["spec"] = src[node.args[1]] if isinstance(src, list) else None
            return
        if node.target is aten.copy_.default:
            node.meta["spec"] = node.args[0].meta["spec"]
            return
        spec = self.spec(node.meta.get("val"), node.name)
        if node.meta.get("et_view"):
            spec.storage = node.args[0].meta["spec"]
        node.meta["spec"] = spec
        if node.target is torch.ops.higher_order.cond:
            operands = node.args[3]
            operand_specs = [a.meta.get("spec") if isinstance(a, Node) else None for a in operands]
            for branch in submodules_of(node, gm):
                self.assign(branch, operand_specs)
                for out_spec, value in zip(spec, _outputs(branch)):
                    value.meta["spec"].storage = out_spec  # both branches write where the cond's result lives


def build_et_graph(edge: ExportedProgram) -> GraphModule:
    """The ExecuTorch graph of one edge method (a new GraphModule; the edge program is not modified)."""
    gm = copy_graph_module(edge.graph_module, lazy=True)  # code generated on first use, after the rewrites
    insert_write_backs(gm, edge)
    to_out_variants(gm)
    _SpecBuilder(edge, edge.range_constraints).assign(gm)
    return gm
