"""Emitter: one planned ExecuTorch graph -> one ExecutionPlan (values, instructions, operators, delegates).

Kernel calls pass every schema argument of the out-variant op in order (defaults filled in, out
tensors included), then the return value(s): one tensor's value, or a TensorList for several.
`torch.cond` becomes: JumpFalseCall(pred -> false branch), true branch, MoveCalls of its results,
an unconditional jump (JumpFalseCall on a constant False) past the false branch, false branch,
MoveCalls. Every kernel/delegate instruction records the debug handles of the node(s) it runs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch._ops import OpOverload
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from etlab.compiler._emit_values import ValueTable
from etlab.compiler._errors import CompileError
from etlab.compiler._memory_planning import linearize
from etlab.compiler._out_variants import kernel_name
from etlab.compiler._tensor_spec import TensorSpec
from etlab.facts.fx import node_op_name, submodules_of
from etlab.facts.lowered import LoweredBackendModule, executorch_call_delegate
from etlab.facts.source import stack_frames
from etlab.schema import program as P

aten = torch.ops.aten

_SYM_KERNELS = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.floordiv: "floordiv",
    operator.truediv: "truediv", operator.mod: "mod", operator.eq: "eq", operator.gt: "gt", operator.lt: "lt",
    operator.ge: "ge", operator.le: "le", operator.neg: "neg",
}


@dataclass
class EmittedMethod:
    """One method as emitted: its execution plan and the maps the devtools need (debug handles and delegates per
    instruction, outputs per instruction)."""

    plan: P.ExecutionPlan
    debug_handle_map: dict[int, list[int]] = field(default_factory=dict)
    delegate_map: dict[int, dict] = field(default_factory=dict)
    instruction_id_to_num_outs_map: dict[int, int] = field(default_factory=dict)


class _MethodEmitter:
    def __init__(self, name: str, gm: GraphModule, program: ExportedProgram, constants, delegates, config):
        self.name, self.gm, self.program, self.config = name, gm, program, config
        self.values = ValueTable(constants, config.emit_mutable_buffer_names)
        self.delegate_store = delegates
        self.instructions: list[P.Instruction] = []
        self.stacktraces: list[P.FrameList | None] = []
        self.labels: list[str] = []  # per instruction: what it runs, "node (operator)"
        self.operators: list[P.Operator] = []
        self._op_index: dict[tuple[str, str], int] = {}
        self.delegates: list[P.BackendDelegate] = []
        self.out = EmittedMethod(P.ExecutionPlan(name=name))

    # -- instructions ---------------------------------------------------------------------------------------
    def _append(self, args, node: Node | None, handles: list[int] | None = None, label: str | None = None) -> int:
        """Appends an instruction; records on `node` (meta "instruction") the index of the last one it emits."""
        self.instructions.append(P.Instruction(args))
        self.stacktraces.append(_frames(node) if node is not None else None)
        idx = len(self.instructions) - 1
        self.labels.append(label or (f"{node.name} ({node_op_name(node)})" if node is not None else ""))
        if node is not None:
            node.meta["instruction"] = idx
        if handles is None and node is not None and node.meta.get("debug_handle") is not None:
            handles = [node.meta["debug_handle"]]
        if handles:
            self.out.debug_handle_map[idx] = handles
        return idx

    def _operator(self, name: str, overload: str) -> int:
        key = (name, overload)
        if key not in self._op_index:
            self._op_index[key] = len(self.operators)
            self.operators.append(P.Operator(name=name, overload=overload))
        return self._op_index[key]

    def _kernel(self, node: Node, op: OpOverload, args: list[int]) -> None:
        self._append(P.KernelCall(op_index=self._operator(*kernel_name(op)), args=args), node)

    # -- graph walk -----------------------------------------------------------------------------------------
    def emit_graph(self, gm: GraphModule) -> None:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                self._emit_call(gm, node)

    def _emit_call(self, gm: GraphModule, node: Node) -> None:
        target = node.target
        if target is operator.getitem:
            src = node.args[0]
            if isinstance(node.meta.get("spec"), TensorSpec):
                self.values.node_index[node] = self.values.spec(node.meta["spec"])
            elif src in self.values.node_index and isinstance(self.values.node_index[src], list):
                self.values.node_index[node] = self.values.node_index[src][node.args[1]]
            return
        if target is torch.ops.higher_order.cond:
            self._emit_cond(gm, node)
        elif target is executorch_call_delegate:
            self._emit_delegate(gm, node)
        elif node.meta.get("et_view"):
            self._emit_view(node)
        elif target in _SYM_KERNELS:
            self._emit_sym(node)
        elif target is aten.copy_.default:
            dst = self.values.of_node(node.args[0], node)
            src = self.values.of_node(node.args[1], node)
            self._kernel(node, target, [dst, src, self.values.add(P.Bool(False)), dst])
        elif target is aten.sym_size.int:
            out = self.values.add(P.Int(0))
            self.values.node_index[node] = out
            self._kernel(node, target, [self.values.of_node(node.args[0], node),
                                        self.values.add(P.Int(node.args[1])), out])
        elif isinstance(target, OpOverload):
            self._emit_operator(node)
        else:
            raise CompileError.at(node, "cannot be emitted as a runtime instruction")

    def _emit_operator(self, node: Node) -> None:
        op: OpOverload = node.target
        spec = node.meta.get("spec")
        out_specs = spec if isinstance(spec, list) else [spec]
        out_names = [a for a in op._schema.arguments if a.is_out]
        args, rets = [], []
        out_i = 0
        for i, arg in enumerate(op._schema.arguments):
            if arg.is_out:
                if isinstance(arg.type, torch.ListType):  # Tensor(a!)[] out: all results as one list
                    idx = self.values.add(P.TensorList([self.values.spec(s) for s in out_specs]))
                    args.append(idx)
                    rets.append(idx)
                    continue
                if len(out_names) == 1:
                    idx = self.values.spec(out_specs[0]) if len(out_specs) == 1 else None
                    if idx is None:
                        raise CompileError.at(node, f"has {len(out_specs)} results but one out argument")
                else:
                    idx = self.values.spec(out_specs[out_i])
                    out_i += 1
                args.append(idx)
                rets.append(idx)
                continue
            if arg.name in node.kwargs:
                value = node.kwargs[arg.name]
            elif not arg.kwarg_only and i < len(node.args):
                value = node.args[i]
            elif arg.has_default_value():
                value = arg.default_value
            else:
                raise CompileError.at(node, f"argument {arg.name!r} is missing")
            args.append(self.values.argument(value, arg.type, node))
        if len(rets) == 1:
            args.append(rets[0])
        elif rets:
            args.append(self.values.add(P.TensorList(list(rets))))
        self._kernel(node, op, args)

    def _emit_view(self, node: Node) -> None:
        spec: TensorSpec = node.meta["spec"]
        root = spec.root()
        if not spec.dynamic and (root.const or (root.mem_id is not None and root.mem_offset is not None)):
            self.values.spec(spec)  # same memory as its base: no instruction
            return
        base = self.values.of_node(node.args[0], node)
        size = self.values.argument(list(node.args[1]), torch.ListType.ofInts(), node)
        out = self.values.spec(spec)
        idx = self._operator("executorch_prim::et_view", "default")
        self._append(P.KernelCall(op_index=idx, args=[base, size, out]), node)

    def _emit_sym(self, node: Node) -> None:
        name = _SYM_KERNELS[node.target]
        args = [self.values.argument(a, None, node) for a in node.args]
        is_bool = isinstance(node.meta.get("val"), (bool, torch.SymBool))
        out = self.values.add(P.Bool(False) if is_bool else P.Int(0))
        self.values.node_index[node] = out
        idx = self._operator(f"executorch_prim::{name}", "Scalar")
        self._append(P.KernelCall(op_index=idx, args=[*args, out]), node)

    def _emit_cond(self, gm: GraphModule, node: Node) -> None:
        pred, _, _, operands = node.args
        true_gm, false_gm = submodules_of(node, gm)
        pred_idx = self.values.of_node(pred, node) if isinstance(pred, Node) else self.values.add(P.Bool(bool(pred)))
        out_values = [self.values.spec(s) for s in node.meta["spec"]]
        self.values.node_index[node] = out_values
        jump_to_false = self._append(P.JumpFalseCall(cond_value_index=pred_idx), node, handles=[],
                                     label=f"{node.name}: jump to false branch")
        self._emit_branch(true_gm, operands, out_values, node)
        always_false = self.values.add(P.Bool(False))
        jump_to_end = self._append(P.JumpFalseCall(cond_value_index=always_false), node, handles=[],
                                   label=f"{node.name}: jump past false branch")
        self.instructions[jump_to_false].instr_args.destination_instruction = len(self.instructions)
        self._emit_branch(false_gm, operands, out_values, node)
        self.instructions[jump_to_end].instr_args.destination_instruction = len(self.instructions)
        node.meta["instruction"] = len(self.instructions) - 1  # a cond ends with its last result move

    def _emit_branch(self, branch: GraphModule, operands, out_values: list[int], cond: Node) -> None:
        for ph, operand in zip([n for n in branch.graph.nodes if n.op == "placeholder"], operands):
            if isinstance(operand, Node):
                self.values.node_index[ph] = self.values.of_node(operand, cond)
        self.emit_graph(branch)
        results = branch.graph.output_node().args[0]
        for i, (res, dst) in enumerate(zip(results if isinstance(results, (list, tuple)) else [results], out_values)):
            self._append(P.MoveCall(move_from=self.values.of_node(res, cond), move_to=dst), None,
                         label=f"{cond.name}: move result {i}")

    def _emit_delegate(self, gm: GraphModule, node: Node) -> None:
        lowered = getattr(gm, node.args[0].target)
        if not isinstance(lowered, LoweredBackendModule):
            raise CompileError.at(node, f"delegate target {node.args[0].target} is not a LoweredBackendModule")
        inputs = [self.values.argument(a, None, node) for a in node.args[1:]]
        spec = node.meta.get("spec")
        outputs = [self.values.spec(s) for s in (spec if isinstance(spec, list) else [spec])]
        self.values.node_index[node] = outputs
        index = len(self.delegates)
        if self.config.extract_delegate_segments:
            ref = P.BackendDelegateDataReference(location=P.DataLocation.SEGMENT,
                                                 index=self.delegate_store.add(lowered.processed_bytes))
        else:
            ref = P.BackendDelegateDataReference(location=P.DataLocation.INLINE,
                                                 index=self.delegate_store.add(lowered.processed_bytes))
        self.delegates.append(P.BackendDelegate(
            id=lowered.backend_id, processed=ref,
            compile_specs=[P.CompileSpec(key=c.key, value=bytes(c.value)) for c in lowered.compile_specs]))
        handles = [n.meta["debug_handle"] for n in lowered.original_module.graph.nodes
                   if n.op == "call_function" and n.meta.get("debug_handle") is not None]
        instr = self._append(P.DelegateCall(delegate_index=index, args=[*inputs, *outputs]), node, handles=handles)
        self.out.instruction_id_to_num_outs_map[instr] = len(outputs)
        self.out.delegate_map[instr] = {"name": lowered.backend_id, "delegate_map": dict(lowered.debug_handle_map)}

    # -- plan -----------------------------------------------------------------------------------------------
    def emit(self) -> EmittedMethod:
        gm, sig = self.gm, self.program.graph_signature
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # Parameters and buffers first, as they appear in the graph; then the user inputs.
        for node in placeholders:
            spec = node.meta.get("spec")
            if isinstance(spec, TensorSpec):
                self.values.node_index[node] = self.values.spec(spec, node)
        inputs = []
        for node, ispec in zip(placeholders, sig.input_specs):
            if ispec.kind == InputKind.USER_INPUT:
                if node not in self.values.node_index:
                    val = node.meta.get("val")
                    self.values.node_index[node] = self.values.argument(val if not isinstance(val, torch.SymInt)
                                                                        else 0, None, node)
                inputs.append(self.values.node_index[node])
        self.emit_graph(gm)
        outs = gm.graph.output_node().args[0]
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        outputs = [self.values.of_node(o, gm.graph.output_node()) for o, s in zip(outs, sig.output_specs)
                   if s.kind == OutputKind.USER_OUTPUT]
        plan = self.out.plan
        plan.values = self.values.values
        plan.inputs, plan.outputs = inputs, outputs
        plan.operators, plan.delegates = self.operators, self.delegates
        stack = self.stacktraces if self.config.emit_stacktrace else None
        plan.chains = [P.Chain(inputs=[], outputs=[], instructions=self.instructions,
                               stacktrace=[f or P.FrameList([]) for f in stack] if stack is not None else None)]
        gm.meta["instruction_labels"] = self.labels
        memory_plan = gm.meta.get("memory_plan")
        if memory_plan is not None:
            memory_plan.step_to_instruction = _step_to_instruction(gm)
        plan.non_const_buffer_sizes = list(memory_plan.buffer_sizes) if memory_plan is not None else [0]
        in_spec, out_spec = self.program.call_spec.in_spec, self.program.call_spec.out_spec
        plan.container_meta_type = P.ContainerMetadata(
            encoded_inp_str=pytree.treespec_dumps(in_spec) if in_spec is not None else "",
            encoded_out_str=pytree.treespec_dumps(out_spec) if out_spec is not None else "")
        return self.out


def _step_to_instruction(gm: GraphModule) -> list[int]:
    """Per planner step (`linearize` order): the latest instruction emitted at or before it, -1 before any."""
    latest, out = -1, []
    for node in linearize(gm):
        latest = node.meta.get("instruction", latest)
        out.append(latest)
    return out


def _frames(node: Node) -> P.FrameList | None:
    frames = stack_frames(node.meta.get("stack_trace"))
    if not frames:
        return None
    return P.FrameList([P.Frame(filename=f.filename, lineno=f.lineno, name=f.name, context=f.code) for f in frames])


def emit_method(name: str, gm: GraphModule, program: ExportedProgram, constants, delegates,
                config) -> EmittedMethod:
    """Emits one planned method. `constants`/`delegates` are shared by all methods of the program."""
    return _MethodEmitter(name, gm, program, constants, delegates, config).emit()
