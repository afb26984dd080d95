"""Core-ATen decomposition, in place and per node.

`ExportedProgram.run_decompositions()` re-traces the whole program; here only the nodes whose op is
not already an edge op are decomposed. Each such node's op runs once on its fake input values under
a recording dispatch mode (composite ops decompose on the way down; ops with an entry in torch's
core decomposition table are expanded there); the recorded calls are spliced into the graph in
place of the node. Static-shape recordings are cached per (op, argument metadata), so a model with
16 identical conv blocks records once.

When a decomposition cannot be expressed this way (it bakes a symbolic size we cannot name, or
creates a tensor out of nowhere) `NeedsRetrace` is raised and the caller falls back to
`run_decompositions` for the whole program.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from dataclasses import dataclass

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._ops import HigherOrderOperator, OpOverload
from torch.fx import GraphModule, Node
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from etlab.compiler._config import EdgeCompileConfig
from etlab.compiler._graph import call, fake_empty, getitem, inherit_meta, is_static

aten = torch.ops.aten


class NeedsRetrace(Exception):
    """A node cannot be decomposed in place; the whole program must go through run_decompositions."""


@functools.cache
def core_decompositions() -> dict:
    """The decomposition table to_edge applies: torch's core ATen table plus the few ops the runtime's kernels cover
    once decomposed."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    # Not in torch's core table yet, but the runtime has kernels for what it decomposes into.
    table.update(get_decompositions([aten.linalg_vector_norm.default]))
    return table


def onednn_off():
    """oneDNN disabled (portable decompositions, see `_record`), no other flag touched: torch's
    `mkldnn.flags()` also sets TF32 by default, which warns on every CPU-only torch ("... for Intel GPUs")."""
    return torch.backends.mkldnn.flags(enabled=False, allow_tf32=None, fp32_precision=None)


def is_view_copy(op) -> bool:
    """Whether an op is a view_copy variant (e.g. aten::view_copy), the copy-semantics op the edge dialect uses in
    place of a view."""
    return isinstance(op, OpOverload) and torch.Tag.view_copy in op.tags


# Tagged core, yet torch's core table decomposes them (as upstream's to_edge does) and portable
# runtimes have no kernel for them: upstream's runtime refused the Swin model's adaptive_avg_pool1d.
_DECOMPOSED_CORE_OPS = frozenset({aten.adaptive_avg_pool1d.default, aten.avg_pool1d.default, aten.col2im.default})


def is_edge_op(op, config: EdgeCompileConfig) -> bool:
    """Whether `op` may appear in an edge graph as-is."""
    if not isinstance(op, OpOverload):
        return True  # getitem, higher-order ops and the like are handled by their own passes
    if op.namespace != "aten":
        return True  # custom ops (torch.library) are registered by their authors
    if op in config._core_aten_ops_exception_list:
        return True
    return (torch.Tag.core in op.tags and op not in _DECOMPOSED_CORE_OPS) or is_view_copy(op)


def _keep(op, config: EdgeCompileConfig) -> bool:
    return is_edge_op(op, config) or op in config._preserve_ops


def _declined(node: Node, config: EdgeCompileConfig) -> bool:
    """A node of a preserved op that the config's node filter does not keep whole."""
    return (config._preserve_node is not None and node.target in config._preserve_ops
            and not config._preserve_node(node))


def _without_preserved(config: EdgeCompileConfig) -> EdgeCompileConfig:
    """The config a declined node decomposes under: its op is no edge op there."""
    kept = set(config._preserve_ops)
    return dataclasses.replace(config, _preserve_ops=[], _preserve_node=None, _core_aten_ops_exception_list=[
        op for op in config._core_aten_ops_exception_list if op not in kept])


def _config_key(config: EdgeCompileConfig) -> tuple:
    """What of the config a recording depends on (which ops it leaves whole)."""
    return frozenset(config._core_aten_ops_exception_list), frozenset(config._preserve_ops)


# -- hand-written rules: faster than recording, and they pick the ops the runtime kernels expect -----------


def _batch_norm(node: Node, fake_mode) -> bool:
    x, weight, bias, mean, var, training, momentum, eps = node.args[:8]
    if training or mean is None or var is None:
        return False
    graph = node.graph
    args = (x, weight, bias, mean, var, momentum, eps)
    target = aten._native_batch_norm_legit_no_training.default
    out_val = node.meta["val"]
    with fake_mode:  # the saved mean/rstd outputs are empty when not training
        val = (out_val, torch.empty(0, dtype=out_val.dtype), torch.empty(0, dtype=out_val.dtype))
    with graph.inserting_before(node):
        bn = call(graph, target, args, like=node, val=val)
        out = getitem(graph, bn, 0, val=bn.meta["val"][0])
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return True


def _dropout(node: Node, fake_mode) -> bool:
    x, _p, train = [*node.args, None, None][:3]
    train = node.kwargs.get("train", train)
    if train:
        return False
    node.replace_all_uses_with(x)
    node.graph.erase_node(node)
    return True


def _item(node: Node, fake_mode) -> bool:
    node.target = aten._local_scalar_dense.default  # same value; keeps the unbacked symbol export bound
    return True


def _adaptive_avg_pool1d(node: Node, fake_mode) -> bool:
    """(N, C, L) -> unsqueeze -> _adaptive_avg_pool2d to (1, out) -> squeeze: the kernels portable
    runtimes have (torch's own decomposition records an in-place as_strided_)."""
    x, (size,) = node.args[0], node.args[1]
    graph = node.graph
    with graph.inserting_before(node):
        wide = call(graph, aten.unsqueeze.default, (x, -2), like=node,
                    val=fake_call(aten.unsqueeze.default, (x, -2), {}, fake_mode))
        pooled = call(graph, aten._adaptive_avg_pool2d.default, (wide, [1, size]), like=node,
                      val=fake_call(aten._adaptive_avg_pool2d.default, (wide, [1, size]), {}, fake_mode))
        out = call(graph, aten.squeeze.dims, (pooled, [-2]), like=node,
                   val=fake_call(aten.squeeze.dims, (pooled, [-2]), {}, fake_mode))
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    return True


RULES = {
    aten.adaptive_avg_pool1d.default: _adaptive_avg_pool1d,
    aten.item.default: _item,
    aten.batch_norm.default: _batch_norm,
    aten.dropout.default: _dropout,
    aten.feature_dropout.default: _dropout,
    aten.alpha_dropout.default: _dropout,
}


def fake_call(target, args, kwargs, fake_mode):
    """Runs `target` on the fake values of node arguments: the new node's meta['val']."""
    def val(a):
        return a.meta["val"] if isinstance(a, Node) else a

    with fake_mode:
        return target(*tree_map(val, tuple(args)), **tree_map(val, dict(kwargs)))


# -- recording ---------------------------------------------------------------------------------------------


def functional_variant(op: OpOverload) -> OpOverload | None:
    """The out-of-place twin of an in-place op that writes only its first argument (`as_strided_` ->
    `as_strided`, `add_.Tensor` -> `add.Tensor`), or None."""
    schema = op._schema
    if not schema.arguments or not op._opname.endswith("_") or op._opname.startswith("_"):
        return None
    first = schema.arguments[0].alias_info
    if first is None or not first.is_write or any(a.alias_info is not None and a.alias_info.is_write
                                                  for a in schema.arguments[1:]):
        return None
    packet = getattr(op.namespace and getattr(torch.ops, op.namespace), op._opname[:-1], None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    return twin if isinstance(twin, OpOverload) and not twin._schema.is_mutable else None


class _Recorder(TorchDispatchMode):
    """Records the edge-op calls a decomposition makes, expanding non-edge ops via the core table.

    A composite that mutates a tensor it made itself (adaptive_avg_pool2d restrides its mean with
    `as_strided_` when the input is channels-last, as after a permute) is recorded with the op's
    out-of-place twin, the later uses reading the twin's result: what functionalization makes of it,
    without re-tracing the whole program. The producer keeps its pre-mutation metadata (`snapshots`).
    Mutating a tensor that another recorded tensor views, or a graph input, is left to the re-trace."""

    def __init__(self, config: EdgeCompileConfig):
        super().__init__()
        self.config = config
        self.calls: list[tuple[OpOverload, tuple, dict, object]] = []
        self.rebinds: dict[int, torch.Tensor] = {}  # call index -> the made tensor its result stands for
        self.snapshots: dict[int, torch.Tensor] = {}  # call index -> its output as made (before a mutation)
        self._made: dict[int, int] = {}  # id(tensor) -> index of the call that made it (or last rebound it)
        self._storages: dict[int, int] = {}  # storage identity -> how many made tensors share it

    def _functionalize(self, func, args, kwargs):
        """Records an in-place op on a made tensor as its twin; None when that is not sound here."""
        twin = functional_variant(func)
        target = args[0] if args else None
        if twin is None or not isinstance(target, torch.Tensor) or id(target) not in self._made:
            return None
        if self._storages.get(_storage_key(target), 0) > 1:
            raise NeedsRetrace(f"{func} mutates a tensor its decomposition also views")
        producer = self._made[id(target)]
        if producer not in self.rebinds and self.calls[producer][3] is not target:
            raise NeedsRetrace(f"{func} mutates one of several results of {self.calls[producer][0]}")
        if producer not in self.snapshots and producer not in self.rebinds:
            self.snapshots[producer] = torch.empty_strided(target.shape, target.stride(), dtype=target.dtype,
                                                           device=target.device, requires_grad=target.requires_grad)
        out = twin(*args, **kwargs)
        self.calls.append((twin, args, kwargs, out))
        self.rebinds[len(self.calls) - 1] = target
        self._made[id(target)] = len(self.calls) - 1
        func(*args, **kwargs)  # the composite goes on with the tensor it holds, now as the twin's result
        return target

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable:
            done = self._functionalize(func, args, kwargs)
            if done is not None:
                return done
        if not _keep(func, self.config):
            decomp = core_decompositions().get(func)
            if decomp is not None:
                with self:
                    out = decomp(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            if func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
                with self:
                    return func.decompose(*args, **kwargs)
        out = func(*args, **kwargs)
        made = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if made:
            self.calls.append((func, args, kwargs, out))  # prim.device, sym_size, ...: plain values
            for o in made:
                self._made.setdefault(id(o), len(self.calls) - 1)
                self._storages[_storage_key(o)] = self._storages.get(_storage_key(o), 0) + 1
        return out


def _storage_key(t: torch.Tensor):
    """Identity of a (fake) tensor's storage: views of one tensor share it."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


@dataclass
class _Ref:
    """A tensor in a recording: input `index` (kind 'in') or element `index` of call `call`'s output."""

    kind: str
    call: int
    index: int


@dataclass(frozen=True)
class _SizeRef:
    """A symbolic size in a recording: the product of `coeff` and dims (input index, dim) of its inputs.

    Lets a decomposition that reshapes by a dynamic size (linear on a (batch, seq, d) input views it
    as (batch*seq, d)) be spliced in place: the sizes become sym_size/mul nodes on the inputs."""

    coeff: int
    dims: tuple[tuple[int, int], ...]


def _size_ref(x, input_nodes: list[Node], node: Node) -> _SizeRef | int:
    """`x` (a SymInt) as a product of input dims, or NeedsRetrace when it is not one."""
    import sympy

    expr = x.node.expr
    if isinstance(expr, sympy.Integer):
        return int(expr)
    dims: dict = {}
    for i, n in enumerate(input_nodes):
        for d, size in enumerate(n.meta["val"].shape):
            if isinstance(size, torch.SymInt):
                dims.setdefault(size.node.expr, (i, d))
    if expr in dims:
        return _SizeRef(1, (dims[expr],))
    coeff, found = 1, []
    for factor in sympy.Mul.make_args(expr):
        base, exp = factor.as_base_exp()
        if isinstance(factor, sympy.Integer):
            coeff *= int(factor)
        elif base in dims and isinstance(exp, sympy.Integer) and exp > 0:
            found += [dims[base]] * int(exp)
        else:
            raise NeedsRetrace(f"decomposition of {node.target} computes a symbolic size ({expr}) that is not a "
                               "product of its inputs' sizes")
    return _SizeRef(coeff, tuple(found))


@dataclass
class _Recording:
    calls: list  # (func, args with _Ref, kwargs with _Ref, out metadata)
    result: object  # _Ref or tuple of _Ref


def _signature(node: Node):
    """Hashable metadata of a node's op and arguments, or None when shapes are symbolic."""
    inputs: dict[int, int] = {}

    def key(a):
        if isinstance(a, Node):
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor) or not is_static(v):
                raise _Uncacheable
            slot = inputs.setdefault(id(a), len(inputs))
            return ("T", slot, tuple(v.shape), tuple(v.stride()), v.dtype, v.storage_offset(), v.requires_grad)
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, *map(key, a))
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise _Uncacheable
        hash(a)
        return (type(a).__name__, a)

    try:
        return (node.target, key(tuple(node.args)), key(tuple(sorted(node.kwargs.items()))))
    except (_Uncacheable, TypeError):
        return None


class _Uncacheable(Exception):
    pass


_CACHE: dict = {}
_CACHE_LIMIT = 4096


def _record(node: Node, fake_mode, config: EdgeCompileConfig) -> tuple[_Recording, list[Node]]:
    """Runs node's op under the recorder; returns the recording and the input nodes it refers to."""
    input_nodes: list[Node] = []
    refs: dict[int, _Ref] = {}

    def to_val(a):
        if isinstance(a, Node):
            v = a.meta["val"]
            if isinstance(v, torch.Tensor) and id(v) not in refs:
                refs[id(v)] = _Ref("in", -1, len(input_nodes))
                input_nodes.append(a)
            return v
        return a

    args = tree_map(to_val, tuple(node.args))
    kwargs = tree_map(to_val, dict(node.kwargs))
    recorder = _Recorder(config)
    # The Python dispatcher makes composite ops take their Python decompositions (as torch's own
    # re-trace does), and with oneDNN off those pick portable ops: otherwise nn.LSTM becomes the
    # CPU-only aten.mkldnn_rnn_layer, which upstream lets through but no runtime has a kernel for.
    with onednn_off(), enable_python_dispatcher(), fake_mode, recorder:
        result = node.target(*args, **kwargs)

    def to_ref(x):
        if isinstance(x, torch.Tensor):
            ref = refs.get(id(x))
            if ref is None:
                raise NeedsRetrace(f"decomposition of {node.target} uses a tensor it did not receive")
            return ref
        if isinstance(x, torch.SymInt):
            return _size_ref(x, input_nodes, node)
        if isinstance(x, (torch.SymFloat, torch.SymBool)):
            raise NeedsRetrace(f"decomposition of {node.target} computes a symbolic value")
        return x

    calls = []
    for i, (func, cargs, ckwargs, out) in enumerate(recorder.calls):
        calls.append((func, tree_map(to_ref, cargs), tree_map(to_ref, ckwargs), recorder.snapshots.get(i, out)))
        if i in recorder.rebinds:
            refs[id(recorder.rebinds[i])] = _Ref("out", i, -1)
        if isinstance(out, torch.Tensor):
            refs[id(out)] = _Ref("out", i, -1)
        elif isinstance(out, (tuple, list)):
            for j, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    refs.setdefault(id(o), _Ref("out", i, j))
    return _Recording(calls, tree_map(to_ref, result)), input_nodes


def _meta_of(out):
    """A picklable-free description of a fake output, to rebuild it in another fake mode."""
    if isinstance(out, torch.Tensor):
        return ("T", tuple(out.shape), tuple(out.stride()), out.dtype, out.storage_offset(), out.device,
                out.requires_grad)
    if isinstance(out, (tuple, list)):
        return tuple(_meta_of(o) for o in out)
    return out


def _rebuild(meta, fake_mode):
    """The fake value `_meta_of` described, in `fake_mode` (see `fake_empty`). requires_grad is part of
    the value (the .pte records it): before it was, a cached decomposition of an op on a parameter
    wrote requires_grad=False where the uncached one wrote True, so the bytes depended on what the
    process had compiled before."""
    if isinstance(meta, tuple) and meta and meta[0] == "T":
        _, shape, stride, dtype, offset, device, requires_grad = meta
        return fake_empty(fake_mode, shape, stride, dtype, device, offset, requires_grad)
    if isinstance(meta, tuple):
        return tuple(_rebuild(m, fake_mode) for m in meta)
    return meta


def _splice(node: Node, rec: _Recording, input_nodes: list[Node], outs: list) -> None:
    """Replaces `node` by the recorded calls. `outs[i]` is the fake output value of call i."""
    graph = node.graph
    made: list[Node] = []
    elems: dict[tuple[int, int], Node] = {}
    sizes: dict = {}

    def size_node(ref: _SizeRef):
        if ref in sizes:
            return sizes[ref]
        result = None
        for i, d in ref.dims:
            src = input_nodes[i]
            dim = call(graph, aten.sym_size.int, (src, d), like=node, val=src.meta["val"].shape[d])
            result = dim if result is None else call(graph, operator.mul, (result, dim), like=node,
                                                     val=result.meta["val"] * dim.meta["val"])
        if ref.coeff != 1:
            result = call(graph, operator.mul, (result, ref.coeff), like=node, val=result.meta["val"] * ref.coeff)
        sizes[ref] = result
        return result

    def resolve(x):
        if isinstance(x, _SizeRef):
            return size_node(x)
        if isinstance(x, _Ref):
            if x.kind == "in":
                return input_nodes[x.index]
            if x.index < 0:
                return made[x.call]
            key = (x.call, x.index)
            if key not in elems:
                elems[key] = getitem(graph, made[x.call], x.index, val=outs[x.call][x.index])
            return elems[key]
        return x

    with graph.inserting_before(node):
        for i, (func, args, kwargs, _) in enumerate(rec.calls):
            made.append(call(graph, func, tree_map(resolve, args), tree_map(resolve, kwargs), like=node, val=outs[i]))
        result = tree_map(resolve, rec.result)
    if isinstance(result, Node):
        node.replace_all_uses_with(result)
    else:
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise NeedsRetrace(f"{node.target} returns several values but {user} does not index them")
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    graph.erase_node(node)


def decompose_node(node: Node, fake_mode, config: EdgeCompileConfig) -> None:
    """Replaces one node by its decomposition in place (a local rule first, else the recorded trace of the op's
    decomposition, cached per signature); NeedsRetrace when the op mints data-dependent sizes."""
    rule = RULES.get(node.target)
    if rule is not None and rule(node, fake_mode):
        return
    if node.meta.get("unbacked_bindings"):
        # Re-running the op would mint new data-dependent symbols; let torch re-trace instead.
        raise NeedsRetrace(f"{node.target} produces a data-dependent size")
    sig = _signature(node)
    sig = (sig, _config_key(config)) if sig is not None else None
    cached = _CACHE.get(sig) if sig is not None else None
    if cached is not None:
        rec = cached
        input_nodes = _input_nodes(node)
        outs = [_rebuild(meta, fake_mode) for (_, _, _, meta) in rec.calls]
    else:
        rec, input_nodes = _record(node, fake_mode, config)
        outs = [out for (_, _, _, out) in rec.calls]
        if sig is not None and len(_CACHE) < _CACHE_LIMIT:
            _CACHE[sig] = _Recording([(f, a, k, _meta_of(o)) for (f, a, k, o) in rec.calls], rec.result)
    _splice(node, rec, input_nodes, outs)


def _input_nodes(node: Node) -> list[Node]:
    """Tensor-valued argument nodes in first-use order (the order _record numbers them)."""
    seen: dict[int, Node] = {}
    for a in tree_flatten((tuple(node.args), dict(node.kwargs)))[0]:
        if isinstance(a, Node) and isinstance(a.meta.get("val"), torch.Tensor):
            seen.setdefault(id(a.meta["val"]), a)
    return list(seen.values())


def decompose(gm: GraphModule, fake_mode, config: EdgeCompileConfig) -> None:
    """Decomposes, in place, every node of gm (not its submodules) whose op is not an edge op."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or isinstance(node.target, HigherOrderOperator):
            continue
        if not isinstance(node.target, OpOverload):
            continue
        if _declined(node, config):
            decompose_node(node, fake_mode, _without_preserved(config))
        elif not _keep(node.target, config):
            decompose_node(node, fake_mode, config)


__all__ = ["NeedsRetrace", "decompose", "decompose_node", "fake_call", "inherit_meta", "is_edge_op"]
