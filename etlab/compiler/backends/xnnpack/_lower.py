"""One partition (an Edge ExportedProgram) -> an XNNGraph: the values, constants and nodes XNNPACK runs.

What happens on the way, in one walk over the partition's nodes:

- Constants: parameters, buffers and every op computed only from them (the weight's permute of
  a linear, a dequantized weight) are evaluated here once and stored in the layout the consuming
  node wants (OHWI filters, [out, in] fully-connected weights, NHWC broadcast operands), as named
  data (`_builder`), in the .ptd its weights' external tag names if they carry one.
- Layout: XNNPACK's convolutions, pooling and resizes work on NHWC. Each Edge value may exist in
  the graph as its own (NCHW / contiguous) layout, as NHWC, or both; a transpose is written only
  when a consumer needs the layout a value does not have yet, once per value. Layout-agnostic ops
  (elementwise, activations, concat, slice, pad) run in whatever layout their input already has,
  so a chain of convolutions stays NHWC between the partition's input and output.
- Folding and fusion (`_fusion`): batch norm after a convolution goes into its weights and bias;
  relu / relu6 / hardtanh / clamp goes into the producing node's output_min/max.
- Debug handles: every XNNPACK node carries the debug handle of the Edge node it came from (as
  upstream stores it); the returned map lists, per handle, the Edge nodes folded into that node
  (batch norm, activation, constant permutes), so profiling events join to all of them. Layout
  transposes added here carry upstream's "no handle" value 65535.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etlab.compiler._delegation_lowering import DelegationError
from etlab.compiler._external_constants import DELEGATE_CONSTANT_TAG
from etlab.compiler._named_data import NamedDataStoreOutput
from etlab.compiler.backends.xnnpack import _fusion
from etlab.compiler.backends.xnnpack._builder import FLOAT16, FLOAT32, GraphBuilder, QuantSpec
from etlab.compiler.backends.xnnpack._checks import Context, dim_upper, op_key
from etlab.compiler.backends.xnnpack._quant import (
    CHOOSE_QPARAMS,
    DQ_DYNAMIC,
    dequantized_source,
    dynamic_source,
    is_dq,
    is_quantized_source,
    plan_quantized,
    spec_of,
)
from etlab.compiler.backends.xnnpack._support import why_unsupported
from etlab.schema.xnnpack import FLAG_EXTERNAL_INPUT, FLAG_EXTERNAL_OUTPUT, INVALID_VALUE_ID

NCHW, NHWC = "nchw", "nhwc"  # NCHW: the Edge tensor's own contiguous layout, whatever its rank
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
FLAG_TRANSPOSE_WEIGHTS = 0x1
FLAG_ALIGN_CORNERS = 0x8
FLAG_KEEP_DIMS = 0x40


def channels_last(rank: int) -> tuple[int, ...]:
    """The permutation to the channels-last form: NCHW -> NHWC; a 3-D [N, C, L] (a 1-D convolution's
    operand) -> [N, L, C], which is the memory order of [N, L, 1, C], the NHWC of its unit-width 2-D view."""
    return (0, *range(2, rank), 1)


def channels_first(rank: int) -> tuple[int, ...]:
    """The inverse of `channels_last(rank)`."""
    return (0, rank - 1, *range(1, rank - 1))


def _permuted(shape: Sequence[int], perm: Sequence[int]) -> list[int]:
    return [int(shape[p]) for p in perm]


def _same_memory_order(shape: Sequence[int]) -> bool:
    """NCHW and NHWC hold a 4-D tensor's elements in the same order (one channel, or 1x1 spatial)."""
    return len(shape) == 4 and (shape[1] == 1 or shape[2] * shape[3] == 1)


class Lowering:
    """Walks one partition and fills a GraphBuilder; `run()` returns (payload bytes, debug handle map)."""

    def __init__(self, ep: ExportedProgram, handlers: dict):
        self.ep = ep
        self.handlers = handlers  # op key -> fn(lowering, node), from `_ops`
        self.graph = ep.graph
        self.b = GraphBuilder()
        self.ctx = Context(ep)
        self.values: dict[Node, dict[str, int]] = {}
        self.quant: dict[int, QuantSpec] = {}  # value id -> its quantization (int8 paths)
        self.constants: dict[Node, torch.Tensor] = {}
        self.constant_ids: dict[tuple, int] = {}
        self.absorbed: dict[Node, set[int]] = {}  # node -> debug handles of nodes folded into it
        self.out_ext: dict[Node, int] = {}
        self.debug_map: dict[int, set[int]] = {}
        self.plan: _fusion.FusionPlan | None = None
        self.qplan: dict[Node, Node] = {}  # op -> the quantize node its int8 result is written as
        self.int8_views: dict[tuple[Node, str], int] = {}  # (view of a dequantize, layout) -> int8 value
        self.int8_results: dict[Node, int] = {}  # quantized op whose views precede its quantize -> int8 value
        self.shape_op = handlers["int8 view"]  # writes a view / permute on int8 values

    # --- driver ---------------------------------------------------------------------------------

    def run(self) -> tuple[bytes, dict[int, tuple[int, ...]], NamedDataStoreOutput]:
        """Lowers the partition: the payload bytes, the debug-handle map (XNNPACK node -> edge handles) and named
        data for weights kept outside the payload."""
        sig = self.ep.graph_signature
        targets = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        user_inputs = []
        for node in self.graph.nodes:
            if node.op != "placeholder":
                continue
            target = targets.get(node.name)
            if target is not None:
                tensor = self.ep.state_dict[target] if target in self.ep.state_dict else self.ep.constants[target]
                self.constants[node] = tensor.detach()
            else:
                user_inputs.append(node)
        outputs = list(self.graph.output_node().args[0])
        for node in outputs:
            if not isinstance(node, Node) or node.op == "placeholder":
                raise DelegationError(f"XnnpackBackend: the partition returns {node!r}, an input or a Python value, "
                                      "as is; XNNPACK outputs must be computed by the partition")
            if node in self.out_ext:
                raise DelegationError(f"XnnpackBackend: output {node.name!r} is returned twice")
            self.out_ext[node] = len(user_inputs) + len(self.out_ext)
        self.b.num_externs = len(user_inputs) + len(outputs)
        for position, node in enumerate(user_inputs):
            t = self.tensor(node)
            if t is None:
                raise DelegationError(f"XnnpackBackend: input {node.name!r} is not a tensor")
            quant = self._input_quant(node) if is_quantized_source(node) else None
            vid = self.b.value(self.out_shape(node, NCHW), external_id=position, flags=FLAG_EXTERNAL_INPUT,
                               quant=quant, datatype=None if quant is not None else self.float_datatype(node))
            self.values[node] = {NCHW: vid}
            if quant is not None:
                self.quant[vid] = quant

        calls = [n for n in self.graph.nodes if n.op == "call_function"]
        self._fold_constants(calls)
        self.plan = _fusion.plan(calls, self.constants, set(outputs))
        self.qplan = plan_quantized(calls, self.constants, lambda n: _fusion.consumers(self.plan, n))
        written_by_op = set(self.qplan.values())
        int8_only = self._int8_only_views(calls)
        for node in calls:
            if (node in self.constants or node in self.plan.alias or node in written_by_op or self._lazy(node)
                    or node in int8_only):
                continue
            refusal = why_unsupported(node, ctx=self.ctx)
            if refusal is not None:
                raise DelegationError.at(node, f"XnnpackBackend cannot lower node {node.name!r}: {refusal.reason}")
            self._lower(node)
        for node in outputs:
            self._finish_output(node)
        debug_map = {h: tuple(sorted(hs)) for h, hs in self.debug_map.items()}
        return self.b.serialize(), debug_map, self.b.named.get_named_data_store_output()

    def _int8_only_views(self, calls: list[Node]) -> set[Node]:
        """Views / permutes of dequantized values read only by ops running quantized: no float copy."""
        found: set[Node] = set()
        for node in reversed(calls):
            if node in self.qplan or dequantized_source(node) is None or is_dq(node):
                continue
            if node.users and all(u in self.qplan or u in found for u in node.users):
                found.add(node)
        return found

    @staticmethod
    def _input_quant(node: Node) -> QuantSpec:
        """An int8 input's quantization: that of the dequantize nodes reading it (all must agree)."""
        specs = {spec_of(u) if is_dq(u) else None for u in node.users}
        if len(specs) != 1 or None in specs:
            raise DelegationError(f"XnnpackBackend: int8 input {node.name!r} is read by nodes other than "
                                  "dequantize nodes of one quantization; XNNPACK cannot type it")
        return specs.pop()

    @staticmethod
    def _lazy(node: Node) -> bool:
        """Nodes written only when read: a dequantize becomes a Convert to float only for float
        readers; the dynamic pattern's parameter nodes are XNNPACK's own business at run time."""
        key = op_key(node)
        if is_dq(node) or key in (DQ_DYNAMIC, CHOOSE_QPARAMS) or dynamic_source(node) is not None:
            return True
        return key == "getitem" and op_key(node.args[0]) == CHOOSE_QPARAMS

    def _fold_constants(self, calls: list[Node]) -> None:
        """Evaluates every op whose inputs are all constants (weight permutes, dequantized weights), and
        full_like, whose value its input's (static) shape alone decides."""
        for node in calls:
            if op_key(node) == "aten.full_like.default":  # one number in a static shape (the rules checked)
                t = self.tensor(node)
                self.constants[node] = torch.full(tuple(int(d) for d in t.shape), float(node.args[1]), dtype=t.dtype)
                handle = node.meta.get("debug_handle")
                self.absorbed[node] = {handle} if isinstance(handle, int) else set()
                continue
            inputs = node.all_input_nodes
            # a partition output computed from constants (a class token expanded once, read by other
            # partitions too) is folded as well: `_finish_output` copies the constant to the output
            if not inputs or not all(n in self.constants for n in inputs) or "choose_qparams" in op_key(node):
                continue
            args = torch.fx.node.map_arg(node.args, lambda n: self.constants[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.constants[n])
            with torch.no_grad():
                self.constants[node] = node.target(*args, **kwargs)
            handles = set().union(*(self.absorbed.get(n, set()) for n in inputs))
            handle = node.meta.get("debug_handle")
            self.absorbed[node] = handles | ({handle} if isinstance(handle, int) else set())

    # --- values ---------------------------------------------------------------------------------

    @staticmethod
    def tensor(node: Node) -> torch.Tensor:
        """The node's tensor meta; the first output's for batch norm / pooling with indices."""
        val = node.meta.get("val")
        return val[0] if isinstance(val, (tuple, list)) else val

    def resolve(self, node):
        """The node whose value `node` is (following aliases: a fused activation, a folded view)."""
        while isinstance(node, Node) and node in self.plan.alias:
            node = self.plan.alias[node]
        return node

    def has(self, node: Node, layout: str) -> bool:
        """Whether the node's value already exists in `layout` (NCHW or NHWC) in the graph being built."""
        node = self.resolve(node)
        if is_dq(node) and node not in self.values:
            node = node.args[0]
        return layout in self.values.get(node, {})

    def preferred_layout(self, node: Node) -> str:
        """The layout to read the node in: NCHW for constants and for values that exist in NCHW, else NHWC."""
        node = self.resolve(node)
        if is_dq(node) and node not in self.values:
            node = node.args[0]
        return NCHW if node in self.constants or NCHW in self.values.get(node, {NCHW: 0}) else NHWC

    def operand(self, node, layout: str, quantized: bool) -> int:
        """A quantized op reads its dequantize's source (the int8 value); a float op the float value."""
        node = self.resolve(node)
        if quantized:
            return self.qvalue(node, layout)
        return self.value(node, layout)

    def qvalue(self, node: Node, layout: str) -> int:
        """The int8 value behind a dequantize, or behind views / permutes of one (written on the
        int8 value, once, keeping its quantization)."""
        if is_dq(node):
            return self.value(node.args[0], layout)
        if node in self.int8_results:
            if layout != NCHW:
                raise DelegationError.at(node, "XnnpackBackend: an int8 intermediate read in NHWC (not supported)")
            return self.int8_results[node]
        cache = (node, layout)
        if cache not in self.int8_views:
            self.int8_views[cache] = self.shape_op(self, node, layout)
        return self.int8_views[cache]

    def result(self, node: Node, shape, layout: str) -> int:
        """The value `node` writes: its quantize node's int8 value when it runs quantized."""
        q = self.qplan.get(node)
        if q is None:
            return self.define(node, shape, layout)
        if q in self.plan_consumers(node):
            return self.define(q, shape, layout, quant=spec_of(q))
        if layout != NCHW:
            raise DelegationError.at(node, "XnnpackBackend: an int8 intermediate written in NHWC (not supported)")
        self.int8_results[node] = vid = self.temp(shape, spec_of(q))  # views follow before the quantize
        return vid

    def plan_consumers(self, node: Node) -> set[Node]:
        """The nodes that consume `node`'s value after fusion."""
        return _fusion.consumers(self.plan, node)

    def constant_of(self, user: Node, arg: Node, what: str) -> torch.Tensor:
        """The constant value of `user`'s operand `arg`; a CompileError if it is computed at run time
        (a weight shared with nodes outside this partition arrives as a delegate input)."""
        source = self.resolve(arg)
        if source not in self.constants:
            raise DelegationError.at(user, f"XnnpackBackend cannot lower node {user.name!r}: its {what} "
                                           f"{getattr(arg, 'name', arg)!r} is not a constant of the partition "
                                           "(a weight read outside the partition too, or computed at run time)")
        return self.constants[source]

    def constant(self, node: Node, data: torch.Tensor, key: str, quant: QuantSpec | None = None,
                 datatype=None) -> int:
        """A constant value holding `data` (already transformed), stored once per (node, key)."""
        cache = (node, key, self.b.float_datatype)
        if cache not in self.constant_ids:
            kwargs = {"datatype": datatype} if datatype is not None else {}
            stored = data
            if datatype is None and quant is None and data.is_floating_point():  # the float type of its reader
                stored = data.half() if self.b.float_datatype == FLOAT16 else data.float()
            self.constant_ids[cache] = self.b.value(tuple(data.shape), data=stored, quant=quant,
                                                    external_tag=self.external_tag(node), **kwargs)
        return self.constant_ids[cache]

    def external_tag(self, node: Node) -> str | None:
        """The .ptd a constant read or computed by `node` goes to: the external tag
        (`meta["custom"]["delegate_constant_tag"]`, upstream's) of the first tagged weight it comes from."""
        seen, stack = set(), [node]
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current.op == "placeholder":
                tag = (current.meta.get("custom") or {}).get(DELEGATE_CONSTANT_TAG)
                if tag:
                    return str(tag)
            stack.extend(n for n in reversed(current.all_input_nodes) if n in self.constants)
        return None

    def value(self, node, layout: str = NCHW) -> int:
        """The id of `node`'s value in `layout`, transposing (once) or storing a constant as needed."""
        node = self.resolve(node)
        if node in self.constants:
            data = self.constants[node].float()
            if data.dim() == 0:
                data = data.reshape(1)
            if layout == NHWC:
                data = data.permute(channels_last(data.dim()))
            return self.constant(node, data, layout)
        if is_dq(node) and node not in self.values:
            self._dequantize(node, layout)
        have = self.values.get(node)
        if have is None:
            raise DelegationError.at(node, f"XnnpackBackend: value {node.name!r} is read before it is computed")
        if layout in have:
            return have[layout]
        source_layout = NHWC if layout == NCHW else NCHW
        shape = self.out_shape(node, NCHW)
        rank = len(shape)
        if rank not in (3, 4):
            raise DelegationError.at(node, f"XnnpackBackend: {node.name!r} (shape {shape}) asked for in NHWC")
        perm = channels_first(rank) if layout == NCHW else channels_last(rank)
        out_shape = shape if layout == NCHW else _permuted(shape, channels_last(rank))
        out = self.define(node, out_shape, layout, quant=self.quant.get(have[source_layout]))
        self.b.node("XNNStaticTranspose", None, num_dims=rank, perm=list(perm), input_id=have[source_layout],
                    output_id=out)
        return out

    def _dequantize(self, dq: Node, layout: str) -> None:
        """A float reader of a dequantize node: one Convert from its quantize node's int8 value."""
        q = dq.args[0]
        source = layout if self.has(q, layout) or q not in self.values else next(iter(self.values[q]))
        qid = self.value(q, source)
        out = self.define(dq, self.out_shape(dq, source), source)
        self.b.node("XNNConvert", self.handle(dq), input_id=qid, output_id=out)

    def define(self, node: Node, shape, layout: str, quant: QuantSpec | None = None, datatype=None) -> int:
        """A new value standing for `node` in `layout`: the partition's output if `node` is one (NCHW)."""
        node = self.resolve(node)
        external = self.plan.output_of(node, self.out_ext) if layout == NCHW else None
        kwargs = {"quant": quant} if quant is not None else {}
        if datatype is not None:
            kwargs["datatype"] = datatype
        if external is not None:
            vid = self.b.value(shape, external_id=self.out_ext[external], flags=FLAG_EXTERNAL_OUTPUT, **kwargs)
        else:
            vid = self.b.value(shape, **kwargs)
        if quant is not None:
            self.quant[vid] = quant
        self.values.setdefault(node, {})[layout] = vid
        return vid

    def temp(self, shape, quant: QuantSpec | None = None) -> int:
        """An internal value that stands for no Edge node (the first half of a two-node lowering)."""
        vid = self.b.value(shape, quant=quant) if quant is not None else self.b.value(shape)
        if quant is not None:
            self.quant[vid] = quant
        return vid

    def out_shape(self, node: Node, layout: str) -> list[int]:
        """The node's dims in `layout`, dynamic ones at their upper bound (XNNPACK's value sizes)."""
        shape = [dim_upper(d) for d in self.tensor(node).shape]
        if None in shape:
            raise DelegationError.at(node, f"XnnpackBackend: {node.name!r} has an unbounded dynamic dim")
        return _permuted(shape, channels_last(len(shape))) if layout == NHWC and len(shape) >= 3 else shape

    def reshape_target(self, node: Node) -> list[int]:
        """A reshape's new shape: static dims, 0 for the (single) dynamic one XNNPACK infers."""
        shape = [d if isinstance(d, int) else 0 for d in self.tensor(node).shape] or [1]
        if shape.count(0) > 1 and not all(isinstance(d, int) for d in self.tensor(node).shape):
            raise DelegationError.at(node, f"XnnpackBackend: reshape of {node.name!r} has several dynamic dims")
        return shape

    def handle(self, node: Node) -> int | None:
        """The node's debug handle for its XNNPACK node(s), recording what was folded into it."""
        handle = node.meta.get("debug_handle")
        if not isinstance(handle, int):
            return None
        handles = self.debug_map.setdefault(handle, {handle})
        handles |= self.plan.absorbed_handles(node)
        for source in node.all_input_nodes:
            handles |= self.absorbed.get(source, set()) if source in self.constants else set()
        return handle

    def float_datatype(self, node: Node):
        """XNNPACK's float type for the values a node defines: fp16 for a float16 node (upstream lowers
        float16 models in fp16), fp32 otherwise."""
        t = self.tensor(node)
        return FLOAT16 if isinstance(t, torch.Tensor) and t.dtype == torch.float16 else FLOAT32

    def _finish_output(self, node: Node) -> None:
        target = self.resolve(node)
        self.b.float_datatype = self.float_datatype(node)
        if target in self.constants:  # a partition output computed from constants alone
            out = self.define(node, self.out_shape(node, NCHW) or [1], NCHW)
            self.b.node("XNNCopy", self.handle(node), input_id=self.value(target), output_id=out)
            return
        if NCHW not in self.values.get(target, {}):
            self.value(target, NCHW)

    # --- ops ------------------------------------------------------------------------------------

    def _lower(self, node: Node) -> None:
        handler = self.handlers.get(op_key(node))
        if handler is None:
            raise DelegationError.at(node, f"XnnpackBackend has no lowering for {op_key(node)} ({node.name!r})")
        self.b.float_datatype = self.float_datatype(node)
        try:
            if node in self.plan.hardswish:
                self._hardswish(node, self.plan.hardswish[node])
            else:
                handler(self, node)
        except ValueError as err:  # the builder's datatype check: a graph XNNPACK would refuse
            raise DelegationError.at(node, f"XnnpackBackend cannot lower node {node.name!r}: {err}") from err

    def _hardswish(self, div: Node, x: Node) -> None:
        """x * clamp(x + 3, 0, 6) / 6, planned by `_fusion`: one XNNHardswish of x written as the div's value."""
        layout = self.preferred_layout(x)
        xid = self.operand(x, layout, False)
        out = self.result(div, self.out_shape(div, layout), layout)
        self.b.node("XNNHardswish", self.handle(div), self.clamp_of(div), input_id=xid, output_id=out)

    def clamp_of(self, node: Node) -> tuple[float, float] | None:
        """The (min, max) clamp fused into the node's output, or None."""
        return self.plan.clamp.get(node)

    def unused_id(self) -> int:
        """The id XNNPACK reads as 'no value' (an absent optional operand)."""
        return INVALID_VALUE_ID
