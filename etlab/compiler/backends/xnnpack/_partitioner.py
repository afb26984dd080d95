"""`XnnpackPartitioner` and `XnnpackBackend`: etlab's ahead-of-time half of upstream's XNNPACK delegate.

    edge = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                       partitioner=[XnnpackPartitioner()])
    et = edge.to_executorch()

The partitioner tags maximal convex groups of nodes the rules in `_support` accept; every node it
considers and leaves out gets `node.meta[DELEGATION_REFUSAL_META]`, a `DelegationRefusal` saying
why (the delegation explainer reads it). `XnnpackBackend.preprocess` writes each partition as
upstream's payload (XH00 header, XNNGraph FlatBuffer) whose constants are named data (in the .pte,
or in the .ptd of the external tag its weights carry: `delegate_external_constants_pass_unlifted`),
which upstream's runtime and etlab's host emulation both run.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etlab.compiler._delegation import (
    BackendDetails,
    DelegationError,
    DelegationSpec,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    tag_groups,
)
from etlab.compiler.backends.xnnpack._checks import BACKEND_ID, Context, op_key, refusal
from etlab.compiler.backends.xnnpack._lower import Lowering
from etlab.compiler.backends.xnnpack._ops import HANDLERS
from etlab.compiler.backends.xnnpack._quant import PRECISIONS, precision_of
from etlab.compiler.backends.xnnpack._support import why_unsupported
from etlab.facts.lowered import DELEGATION_REFUSAL_META, CompileSpec, DelegationRefusal
from etlab.facts.source import module_hierarchy

TAG_PREFIX = "xnnpack_"
# Upstream's XNNPACK configs that name an original ATen op (get_original_aten) and that etlab lowers:
# linear, max_pool2d, upsample_bilinear2d.vec, hardswish (its ELU config is disabled in 1.5.1, and
# elu is a core op anyway; etlab has no PReLU lowering, so prelu decomposes).
KEPT_WHOLE = (torch.ops.aten.linear.default, torch.ops.aten.max_pool2d.default,
              torch.ops.aten.upsample_bilinear2d.vec, torch.ops.aten.hardswish.default)


class _Support(OperatorSupportBase):
    def __init__(self, accepted: set[Node]):
        self.accepted = accepted

    def is_node_supported(self, submodules, node: Node) -> bool:
        return node in self.accepted


class XnnpackPartitioner(Partitioner):
    """Tags the nodes XNNPACK runs, one tag (`xnnpack_<i>`) per partition.

    - `exclude_ops`: operators to keep out (`torch.ops.aten.add.Tensor`, an overload packet, or
      the name `"aten.add.Tensor"`); `exclude_modules`: module paths (`"features.3"`, covering its
      submodules) or module classes whose nodes stay out. Both are refused as `excluded_by_user`.
    - `per_op_mode=True`: one partition per operator (as upstream's option: each op a delegate
      call of its own, e.g. to profile them one by one), instead of maximal partitions.
    - `config_precisions`: which precisions to delegate, as upstream's option names them
      ("fp32", "static_quant", "dynamic_quant", or upstream's ConfigPrecisionType members); by
      default all three. E.g. `["static_quant"]` keeps float ops of a quantized model portable.
    """

    def __init__(self, *, exclude_ops: Iterable = (), exclude_modules: Iterable = (), per_op_mode: bool = False,
                 config_precisions: Iterable | None = None, compile_specs: list[CompileSpec] | None = None):
        self.exclude_ops = {_op_label(op) for op in exclude_ops}
        self.exclude_modules = list(exclude_modules)
        for entry in self.exclude_modules:
            if not isinstance(entry, (str, type)):
                raise TypeError(f"XnnpackPartitioner: exclude_modules takes module paths (str) or module classes, "
                                f"got {entry!r}")
        self.per_op_mode = bool(per_op_mode)
        self.precisions = _precisions(config_precisions)
        self.delegation_spec = DelegationSpec(BACKEND_ID, list(compile_specs or []))

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tags the nodes XNNPACK takes (one tag per partition) and records on every node it leaves out why, for the
        delegation explainer."""
        gm = exported_program.graph_module
        ctx = Context(exported_program)
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        accepted: set[Node] = set()
        for node in calls:
            found = self._excluded(node) or why_unsupported(node, ctx=ctx) or self._precision_refusal(node)
            if found is None:
                accepted.add(node)
                node.meta.pop(DELEGATION_REFUSAL_META, None)
            else:
                node.meta[DELEGATION_REFUSAL_META] = found
        self._accept_folded_constants(calls, accepted, ctx)
        order = {node: i for i, node in enumerate(gm.graph.nodes)}
        groups = self._per_op_groups(calls, accepted, ctx) if self.per_op_mode else self._groups(gm, accepted)
        constants_only = refusal("partition_size", "computed from constants only and read by no XNNPACK node",
                                 "nothing to do: it runs once per call on the portable kernels")
        tags = tag_groups(groups, order, self.delegation_spec, TAG_PREFIX,  # constants alone fold into their users
                          lambda nodes: constants_only if all(ctx.is_constant(n) for n in nodes) else None)
        return PartitionResult(exported_program, tags)

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[torch._ops.OpOverload], object]:
        """The ops XNNPACK runs as one node that Edge would decompose, kept whole (as upstream 1.5.1's
        partitioner keeps them) where this partitioner would delegate the node: a linear stays one
        fully connected node instead of permute + addmm, a hardswish one XNNHardswish, a max_pool2d
        needs no getitem of its indices. Nodes it would refuse decompose as usual."""
        ctx = Context(ep)

        def keep(node: Node) -> bool:
            return (node.op == "call_function" and node.target in KEPT_WHOLE and self._excluded(node) is None
                    and why_unsupported(node, ctx=ctx) is None and self._precision_refusal(node) is None)

        return list(KEPT_WHOLE), keep

    def _accept_folded_constants(self, calls: list[Node], accepted: set[Node], ctx: Context) -> None:
        """An op XNNPACK cannot run, computed from constants only and read only by delegated nodes (a
        weight-normed convolution's weight), is evaluated when the delegate is built: it joins them,
        with the whole chain of such ops down to the weights. A chain whose root stays portable (an
        int64 position index other portable nodes read too) stays out entirely: in the partition its
        ops would read a run-time input and could not be folded (qwen2's rotary positions)."""
        found: set[Node] = set()
        for node in reversed(calls):
            if (node not in accepted and ctx.is_constant(node) and node.users and self._excluded(node) is None
                    and all(u in accepted or u in found for u in node.users)):
                found.add(node)
        changed = True
        while changed:  # keep only chains the partition can evaluate: every op in them in it, down to weights
            changed = False
            foldable: set[Node] = set()
            for node in calls:
                if ((node in accepted or node in found) and ctx.is_constant(node)
                        and all(i.op != "call_function" or i in foldable for i in node.all_input_nodes)):
                    foldable.add(node)
            for node in [n for n in calls if n in found]:
                if node not in foldable or not all(u in accepted or u in found for u in node.users):
                    found.discard(node)
                    changed = True
        for node in found:
            accepted.add(node)
            node.meta.pop(DELEGATION_REFUSAL_META, None)

    def _groups(self, gm, accepted: set[Node]) -> list[list[Node]]:
        order = {node: i for i, node in enumerate(gm.graph.nodes)}
        proposed = CapabilityBasedPartitioner(gm, _Support(accepted), allows_single_node_partition=True)
        return [sorted(p.nodes, key=order.__getitem__) for p in proposed.propose_partitions()]

    def _per_op_groups(self, calls: list[Node], accepted: set[Node], ctx: Context) -> list[list[Node]]:
        """One group per computing node, with the getitems of its value and the constant-only nodes
        only it reads (a linear's weight permute)."""
        groups: dict[Node, list[Node]] = {}
        owner: dict[Node, Node] = {}
        for node in calls:
            if node not in accepted or ctx.is_constant(node):
                continue
            source = node.args[0] if op_key(node) == "getitem" else None
            if source in owner:
                owner[node] = owner[source]
                groups[owner[source]].append(node)
            else:
                owner[node] = node
                groups[node] = [node]
        for node in calls:
            if node in accepted and ctx.is_constant(node):
                users = {owner.get(u) for u in node.users}
                if len(users) == 1 and None not in users:
                    groups[users.pop()].insert(0, node)
        return list(groups.values())

    def _precision_refusal(self, node: Node) -> DelegationRefusal | None:
        if self.precisions == set(PRECISIONS):
            return None
        precision = precision_of(node)
        if precision in self.precisions:
            return None
        return refusal("excluded_by_user", f"a {precision} node; the partitioner delegates only "
                       f"{sorted(self.precisions)} (config_precisions)",
                       f"add {precision!r} to XnnpackPartitioner(config_precisions=...) to delegate it")

    def _excluded(self, node: Node) -> DelegationRefusal | None:
        key = op_key(node)
        if key in self.exclude_ops or key.rsplit(".", 1)[0] in self.exclude_ops:
            return refusal("excluded_by_user", f"{key} is in the partitioner's exclude_ops",
                           "remove it from XnnpackPartitioner(exclude_ops=...) to delegate it")
        hierarchy = (module_hierarchy(node.meta.get("nn_module_stack")) or {}) if self.exclude_modules else {}
        for entry in self.exclude_modules:
            if isinstance(entry, str):
                hit = any(_within(_clean_path(path), entry) for path, _ in hierarchy.values())
            else:
                hit = any(ty == f"{entry.__module__}.{entry.__qualname__}" for _, ty in hierarchy.values())
            if hit:
                label = entry if isinstance(entry, str) else entry.__qualname__
                return refusal("excluded_by_user", f"it belongs to module {label!r}, which is in the partitioner's "
                               "exclude_modules", "remove it from XnnpackPartitioner(exclude_modules=...) to "
                               "delegate it")
        return None


def _precisions(given) -> set[str]:
    if given is None:
        return set(PRECISIONS)
    items = [given] if isinstance(given, str) or hasattr(given, "name") else list(given)
    names = {str(getattr(p, "name", p)).lower() for p in items}
    unknown = names - set(PRECISIONS)
    if unknown or not names:
        raise ValueError(f"XnnpackPartitioner: config_precisions {sorted(unknown) or '[]'} not among {PRECISIONS}")
    return names


def _op_label(op) -> str:
    if isinstance(op, str):
        return op
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(op)
    raise TypeError(f"XnnpackPartitioner: exclude_ops takes torch operators or their names, got {op!r}")


def _clean_path(path: str) -> str:
    """nn_module_stack paths look like "L['self'].features[3]" (strict) or "features.3"."""
    path = path.replace("L['self'].", "").replace("L['self']", "")
    return path.replace("[", ".").replace("]", "").replace("'", "").strip(".")


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


DEBUG_MAP_KEY = "debug_handle_map"


class XnnpackBackend(BackendDetails):
    """Upstream's backend id; `preprocess` writes one partition as an XNNPACK payload.

    Every XNNPACK node carries its Edge node's debug handle, and the debug-handle map is empty,
    as upstream writes both: upstream's runtime names its per-operator events after XNNPACK's
    operators, and a non-empty map would make upstream's Inspector match those names against the
    map's keys as substrings. `CompileSpec("debug_handle_map", b"fused")` records instead, per
    node handle, the handles of the Edge nodes folded into it (batch norm, activation, weight
    permutes), for etlab-only workflows whose events carry the handles.
    """

    copies_shared_constants = True  # XNNPACK packs weights when the delegate is built

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        """One partition as an XNNPACK payload plus its debug-handle map (compile spec: fused or none); a
        DelegationError names an unknown spec."""
        fused_map = False
        for spec in compile_specs:
            if spec.key != DEBUG_MAP_KEY or spec.value not in (b"fused", b"none"):
                raise DelegationError(f"XnnpackBackend: unknown compile spec {spec.key}={spec.value!r} (it takes "
                                      f"{DEBUG_MAP_KEY!r} = b'fused' or b'none')")
            fused_map = spec.value == b"fused"
        payload, debug_map, named = Lowering(edge_program, HANDLERS).run()
        return PreprocessResult(payload, debug_map if fused_map else {}, named)
