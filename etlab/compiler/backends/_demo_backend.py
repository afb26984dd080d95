"""DemoBackend: a small backend that takes float32 add / mul / linear (mm, addmm, permute) partitions.

It exists to exercise delegation end to end: `DemoPartitioner` tags the supported nodes,
`DemoBackend.preprocess` compiles a partition into the byte format of `_demo_format`, and the
runtime half (`etlab.runtime.backends.demo_backend`) executes those bytes, reporting one profiling
event per op under the identifiers recorded here with `DelegateMappingBuilder`.

Compile spec: `CompileSpec("identifiers", b"generated")` (default; ops get ids 0, 1, ...) or
`b"names"` (ops are identified by their node names).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etlab.compiler._delegation import (
    BackendDetails,
    DelegateMappingBuilder,
    DelegationError,
    DelegationSpec,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    tag_groups,
)
from etlab.compiler.backends._demo_format import DemoOp, DemoProgram, Opcode, encode_demo_program
from etlab.facts.fx import op_name
from etlab.facts.lowered import DELEGATION_REFUSAL_META, CompileSpec, DelegationRefusal

aten = torch.ops.aten
_OPCODES = {
    aten.add.Tensor: Opcode.ADD,
    aten.mul.Tensor: Opcode.MUL,
    aten.mm.default: Opcode.MM,
    aten.addmm.default: Opcode.ADDMM,
    aten.permute.default: Opcode.PERMUTE,
    aten.permute_copy.default: Opcode.PERMUTE,
}
_TENSOR_ARITY = {Opcode.ADD: 2, Opcode.MUL: 2, Opcode.MM: 2, Opcode.ADDMM: 3, Opcode.PERMUTE: 1}
# Keyword arguments accepted only at their neutral value.
_NEUTRAL_KWARGS = {"alpha": 1, "beta": 1}
IDENTIFIERS_KEY = "identifiers"


BACKEND_ID = "DemoBackend"
_OPS_TEXT = "add.Tensor, mul.Tensor, mm, addmm and permute(_copy)"


def _static_float32(value) -> bool:
    return (isinstance(value, torch.Tensor) and value.dtype == torch.float32
            and all(isinstance(d, int) for d in value.shape))


def _tensor_refusal(value, what: str) -> DelegationRefusal | None:
    """Why a value (a node's result or operand) is not a float32 tensor of static shape, or None."""
    if not isinstance(value, torch.Tensor):
        return DelegationRefusal(BACKEND_ID, "dtype", f"{what} is not a tensor",
                                 "the backend computes on float32 tensors only")
    if value.dtype != torch.float32:
        return DelegationRefusal(BACKEND_ID, "dtype", f"{what} is {str(value.dtype).replace('torch.', '')}, "
                                 "not float32", "cast to float32 before this op if the precision allows")
    dynamic = [i for i, d in enumerate(value.shape) if not isinstance(d, int)]
    if dynamic:
        return DelegationRefusal(BACKEND_ID, "dynamic_shape", f"{what} has dynamic dimension(s) {dynamic} "
                                 f"(shape {list(value.shape)})", "export with a static size for those dimensions")
    return None


def why_unsupported(node: Node) -> DelegationRefusal | None:
    """Why DemoBackend cannot run `node` (a `DelegationRefusal`: category, reason, hint), or None if it can."""
    if node.op != "call_function" or node.target not in _OPCODES:
        what = op_name(node.target) if node.op == "call_function" else f"a {node.op} node"
        return DelegationRefusal(BACKEND_ID, "operator", f"the backend does not run {what} (only {_OPS_TEXT})",
                                 "none: the op runs on the portable kernels")
    opcode = _OPCODES[node.target]
    refusal = _tensor_refusal(node.meta.get("val"), "its result")
    if refusal is not None:
        return refusal
    arity = _TENSOR_ARITY[opcode]
    tensors = node.args[:arity]
    if len(tensors) != arity or not all(isinstance(a, Node) for a in tensors):
        return DelegationRefusal(BACKEND_ID, "argument", f"it needs {arity} tensor operands, got {tensors!r}",
                                 "pass tensors, not Python scalars, as the operands")
    for i, a in enumerate(tensors):
        refusal = _tensor_refusal(a.meta.get("val"), f"operand {i} ({a.name})")
        if refusal is not None:
            return refusal
    if opcode == Opcode.PERMUTE:
        dims = node.args[1] if len(node.args) > 1 else None
        if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) for d in dims):
            return DelegationRefusal(BACKEND_ID, "argument", f"its permutation {dims!r} is not a list of ints")
    elif len(node.args) > arity:
        return DelegationRefusal(BACKEND_ID, "argument", f"extra positional arguments {node.args[arity:]!r}")
    for key, value in node.kwargs.items():
        if _NEUTRAL_KWARGS.get(key, object()) != value:
            return DelegationRefusal(BACKEND_ID, "argument", f"keyword argument {key}={value!r} (only "
                                     f"{_NEUTRAL_KWARGS} at their default are supported)",
                                     f"fold {key} into an explicit mul before the op")
    return None


class _DemoSupport(OperatorSupportBase):
    def is_node_supported(self, submodules, node: Node) -> bool:
        return why_unsupported(node) is None


class DemoPartitioner(Partitioner):
    """Tags maximal convex groups of DemoBackend-supported nodes, one tag (`demo_<i>`) per group.

    Groups made only of permutes are left alone: there is nothing to compute in them. Every
    call_function node left out gets `node.meta[DELEGATION_REFUSAL_META]`, the reason.
    """

    def __init__(self, compile_specs: list[CompileSpec] | None = None):
        self.delegation_spec = DelegationSpec(BACKEND_ID, list(compile_specs or []))

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tags the nodes DemoBackend will take (one tag per convex group) and records, on every node it leaves out,
        why: the delegation explainer's reasons."""
        gm = exported_program.graph_module
        order = {node: i for i, node in enumerate(gm.graph.nodes)}
        proposed = CapabilityBasedPartitioner(gm, _DemoSupport(), allows_single_node_partition=True)
        groups = [sorted(p.nodes, key=order.__getitem__) for p in proposed.propose_partitions()]
        permutes_only = DelegationRefusal(BACKEND_ID, "partition_size",
                                          "its partition holds only permutes: nothing to compute",
                                          "none: a permute alone runs as cheaply on the portable kernels")
        tags = tag_groups(groups, order, self.delegation_spec, "demo_",
                          lambda nodes: permutes_only if all(_OPCODES[n.target] == Opcode.PERMUTE for n in nodes)
                          else None)
        for node in gm.graph.nodes:
            if node.op == "call_function" and "delegation_tag" not in node.meta \
                    and DELEGATION_REFUSAL_META not in node.meta:
                refusal = why_unsupported(node)
                if refusal is not None:
                    node.meta[DELEGATION_REFUSAL_META] = refusal
        return PartitionResult(exported_program, tags)


def _identifier_style(compile_specs: list[CompileSpec]) -> str:
    style = "generated"
    for spec in compile_specs:
        if spec.key != IDENTIFIERS_KEY:
            raise DelegationError(f"DemoBackend: unknown compile spec {spec.key!r} (known: {IDENTIFIERS_KEY!r})")
        style = spec.value.decode("utf-8", errors="replace")
        if style not in ("generated", "names"):
            raise DelegationError(f"DemoBackend: compile spec {IDENTIFIERS_KEY!r} must be b'generated' or b'names', "
                                  f"got {spec.value!r}")
    return style


class DemoBackend(BackendDetails):
    """The demo delegate's ahead-of-time half: lowers a tagged partition to the demo bytecode that `etlab.runtime`'s
    DemoBackend runtime interprets (a small, readable model of a real backend)."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        """The partition as demo bytecode plus its debug-handle map (delegate instruction -> the edge nodes it
        computes), which lets the Inspector attribute delegate events to source ops."""
        builder = DelegateMappingBuilder(generated_identifiers=_identifier_style(compile_specs) == "generated")
        program = _DemoLowering(edge_program, builder).run()
        return PreprocessResult(encode_demo_program(program), builder.get_delegate_mapping())


class _DemoLowering:
    """Walks one partition's graph and fills a DemoProgram.

    Constants are materialized lazily, so a weight consumed only by a permute is stored once,
    already permuted; the folded permute's debug handle joins the mapping of the op that reads it.
    """

    def __init__(self, ep: ExportedProgram, builder: DelegateMappingBuilder):
        self.ep = ep
        self.builder = builder
        self.program = DemoProgram()
        self.slot: dict[Node, int] = {}
        self.constant: dict[Node, torch.Tensor] = {}
        self.folded_handles: dict[Node, set[int]] = {}

    def run(self) -> DemoProgram:
        sig = self.ep.graph_signature
        targets = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        graph_outputs = set(self.ep.graph.output_node().all_input_nodes)
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, targets.get(node.name))
            elif node.op == "call_function":
                refusal = why_unsupported(node)
                if refusal is not None:
                    raise DelegationError.at(node, f"DemoBackend cannot lower node {node.name!r}: {refusal.reason}")
                if (_OPCODES[node.target] == Opcode.PERMUTE and node.args[0] in self.constant
                        and node not in graph_outputs):
                    self._fold_permute(node)
                else:
                    self._op(node)
            elif node.op == "output":
                self._outputs(node)
            else:
                raise DelegationError(f"DemoBackend cannot lower {node.op} node {node.name!r}")
        return self.program

    def _placeholder(self, node: Node, target: str | None) -> None:
        if target is None:
            if not _static_float32(node.meta.get("val")):
                raise DelegationError(f"DemoBackend: input {node.name!r} is not a float32 tensor of static shape")
            self.slot[node] = self.program.add_value(node.meta["val"].shape)
            self.program.inputs.append(self.slot[node])
            return
        tensor = self.ep.state_dict[target] if target in self.ep.state_dict else self.ep.constants[target]
        if tensor.dtype != torch.float32:
            raise DelegationError(f"DemoBackend: constant {target!r} is {tensor.dtype}, not float32")
        self.constant[node] = tensor.detach()

    def _fold_permute(self, node: Node) -> None:
        source = node.args[0]
        self.constant[node] = self.constant[source].permute(node.args[1]).contiguous()
        handle = node.meta.get("debug_handle")
        self.folded_handles[node] = self.folded_handles.get(source, set()) | ({handle} if handle is not None else set())

    def _input_slot(self, node: Node) -> int:
        if node not in self.slot:  # a constant, stored on first use
            self.slot[node] = self.program.add_value(self.constant[node].shape, self.constant[node])
        return self.slot[node]

    def _op(self, node: Node) -> None:
        opcode = _OPCODES[node.target]
        operands = node.args[:_TENSOR_ARITY[opcode]]
        inputs = [self._input_slot(a) for a in operands]
        self.slot[node] = output = self.program.add_value(node.meta["val"].shape)
        attrs = list(node.args[1]) if opcode == Opcode.PERMUTE else []
        handles = {node.meta.get("debug_handle")}
        for operand in operands:
            handles |= self.folded_handles.get(operand, set())
        handles.discard(None)
        op = DemoOp(opcode, inputs, [output], attrs)
        # Nodes without debug handles (a program that never went through to_edge) stay unmapped.
        if handles:
            if self.builder.generated_identifiers:
                op.debug_id = self.builder.insert_delegate_mapping_entry(handles=sorted(handles))
            else:
                op.name = self.builder.insert_delegate_mapping_entry(handles=sorted(handles), identifier=node.name)
        self.program.ops.append(op)

    def _outputs(self, node: Node) -> None:
        produced = {out for op in self.program.ops for out in op.outputs}
        for value in node.args[0]:
            slot = self.slot.get(value) if isinstance(value, Node) else None
            if slot is None or slot not in produced:
                raise DelegationError(f"DemoBackend: output {value!r} is not computed by the partition "
                                      "(an input or constant returned as is)")
            if slot in self.program.outputs:
                raise DelegationError(f"DemoBackend: output {value.name!r} is returned twice")
            self.program.outputs.append(slot)
