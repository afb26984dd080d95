"""Which ops of two builds are the same op of the source model: the keys `compare` joins rows by.

Debug handles are numbered per Edge graph. Two builds of one export (portable vs delegated, two runs)
share them; a float build and its quantized build do not (the quantized graph has quantize and
dequantize nodes around each op, and batch norms folded into their convs), so handle 5 of one is
some other op of the other. The join therefore has tiers, decided per method:

1. debug handle: every handle both ETRecords know names the same operators (one graph): rows join
   by handle, as they always did;
2. module + op: otherwise each op is keyed by what it is in the source model: its innermost module
   path (nn_module_stack, `etlab.facts.source.module_path`), its operator without overload
   ("aten.convolution") and its order among the ops of that module and operator (graph order);
3. unmatched: an op with no counterpart stays listed on its own side.

Quantize/dequantize ops are attached to the op they wrap, never paired on their own: a dequantize to
the op that consumes it (role "in": the op's input), a quantize to the op that produces its input
(role "out": the op's output), following the recorded Edge graph (`Inspector.get_exported_program`);
where the graph does not say (no graph recorded, or the node sits inside a delegate), by handle order:
a dequantize goes to the next op, a quantize to the previous one. A quantized layer's time is then its
op's plus its q/dq ops', and its output is the quantize's (dequantized with that op's scale and zero
point) when it has one. A batch norm that one side has and the other folded away (PT2E quantization
folds it into the conv before it) joins the row of the op producing its input, so that row's outputs
compare after the norm on both sides.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from dataclasses import dataclass, field

from etlab.errors import FormatError
from etlab.facts.quant import op_kind, qdq_kind
from etlab.facts.source import module_path

log = logging.getLogger(__name__)

# ops a build may fold into the op producing their input (and another build keep)
FOLDABLE = frozenset({"aten._native_batch_norm_legit_no_training", "aten._native_batch_norm_legit",
                      "aten.native_batch_norm", "aten.batch_norm", "aten._batch_norm_with_update"})
EDGE_GRAPH = "edge_dialect_exported_program"


def handles_line_up(ops_a: dict, ops_b: dict) -> bool:
    """Whether two methods' debug handles name the same ops: every handle both know has the same
    operator types on both sides (the same Edge graph, partitioned or not)."""
    common = set(ops_a) & set(ops_b)
    sig = lambda ops: tuple(o.op_type for o in ops)
    return bool(common) and all(sig(ops_a[h]) == sig(ops_b[h]) for h in common)


# -- the recorded graph at the level of debug handles ------------------------------------------------


@dataclass
class HandleGraph:
    """Data flow between the debug handles of one Edge graph (nodes without a handle, such as
    getitem, are looked through), and the constant scale/zero point of each per-tensor quantize."""

    producers: dict[int, set[int]] = field(default_factory=dict)
    users: dict[int, set[int]] = field(default_factory=dict)
    qparams: dict[int, tuple[float, int]] = field(default_factory=dict)


def _handle_of(node) -> int | None:
    h = node.meta.get("debug_handle")
    if isinstance(h, (tuple, list)) and h:
        h = h[0]
    return h if isinstance(h, int) and not isinstance(h, bool) else None


def _constant_qparams(node) -> tuple[float, int] | None:
    args = node.args
    if len(args) >= 3 and isinstance(args[1], (int, float)) and isinstance(args[2], int) \
            and not isinstance(args[1], bool):
        return float(args[1]), int(args[2])
    return None


def handle_graph(graph_module) -> HandleGraph:
    """The handle-level data flow of a graph module's top-level graph (delegates' insides are not in it)."""
    out = HandleGraph()
    behind: dict = {}  # node -> the handles it stands for (itself, or what a handle-less node passes on)
    for node in graph_module.graph.nodes:
        ins = set().union(*(behind.get(a, set()) for a in node.all_input_nodes)) if node.all_input_nodes else set()
        h = _handle_of(node) if node.op == "call_function" else None
        if h is None:
            behind[node] = ins
            continue
        behind[node] = {h}
        for p in ins - {h}:
            out.producers.setdefault(h, set()).add(p)
            out.users.setdefault(p, set()).add(h)
        target = str(getattr(node, "target", ""))
        if qdq_kind(target) == "quantize" and "per_tensor" in target:
            params = _constant_qparams(node)
            if params is not None:
                out.qparams[h] = params
    return out


def recorded_graph(inspector, block: str):
    """The Edge graph module behind one event block of an Inspector's ETRecord, or None (no ETRecord,
    or a graph that cannot be rebuilt: the join then works from handle order)."""
    for key in (f"{EDGE_GRAPH}/{block}", EDGE_GRAPH):
        try:
            ep = inspector.get_exported_program(key)
        except KeyError:
            continue
        except (FormatError, ValueError, TypeError, RuntimeError, AttributeError) as e:
            log.warning("compare: the ETRecord's graph %s could not be rebuilt (%s); q/dq ops are attached "
                        "by handle order", key, str(e).splitlines()[0] if str(e) else type(e).__name__)
            return None
        if ep is not None:
            return getattr(ep, "graph_module", None)
    return None


# -- one side's keys ------------------------------------------------------------------------------------


@dataclass
class SideKeys:
    """One method of one build, keyed for the join."""

    anchor: dict[int, int]                  # handle -> the op handle it belongs to (q/dq -> the op they wrap)
    role: dict[int, str]                    # handle -> "op", "in" (dequantizes an input), "out" (quantizes the output)
    key: dict[int, tuple[str, str, int]]    # op handle -> (module path, operator, order among those)
    inputs: dict[int, set[int]]             # op handle -> op handles producing its inputs
    qparams: dict[int, tuple[float, int]]   # quantize handle -> (scale, zero point)
    has_graph: bool
    folded: dict[int, int] = field(default_factory=dict)  # op handle -> op handle it joins (folded away)
    producers_seen: set[int] = field(default_factory=set)  # handles the graph shows data flow into
    # op handle -> (A's operator, B's operator) of a pair made by order within a module (pair_leftovers)
    by_order: dict[int, tuple[str, str]] = field(default_factory=dict)

    def target(self, handle: int) -> int | None:
        """The op handle a handle's events count for (after attaching q/dq and folding)."""
        a = self.anchor.get(handle)
        return None if a is None else self.folded.get(a, a)


def _walk(start: int, edges: dict[int, set[int]], targets: set[int]) -> list[int]:
    """The handles of `targets` (ops) reached first from `start` along `edges`, stepping through the
    others (q/dq, and nodes such as getitem that carry a handle the ETRecord names no op for)."""
    found, seen, todo = [], {start}, deque([start])
    while todo:
        for n in sorted(edges.get(todo.popleft(), ())):
            if n in seen:
                continue
            seen.add(n)
            if n in targets:
                found.append(n)
            else:
                todo.append(n)
    return sorted(found)


def _attaches_forward(op_types: list[str]) -> bool:
    """Whether q/dq ops belong to the op they feed: a dequantize, and the dynamic quantization of an
    input (choose_qparams, then a quantize taking its scale as a tensor); a static quantize belongs
    to the op whose output it quantizes."""
    last = op_types[-1]
    return (qdq_kind(last) == "dequantize"
            or any(".choose_qparams" in t or t.endswith((".tensor", ".Tensor", ".tensor2")) for t in op_types))


def side_keys(ops: dict, graph: HandleGraph | None) -> SideKeys:
    """Keys of one method's ops (`MethodInfo.ops`: handle -> OpInfo list), q/dq attached via `graph`."""
    handles = sorted(h for h, o in ops.items() if o)
    # a handle of q/dq ops only (upstream gives an input's quantize and dequantize one handle): attached
    # as its last op is; a handle mixing an op with its q/dq (upstream's, again) keys as that op
    qdq = {h: "dequantize" if _attaches_forward([o.op_type for o in ops[h]]) else "quantize"
           for h in handles if all(qdq_kind(o.op_type) for o in ops[h])}
    op_handles = [h for h in handles if h not in qdq]
    targets = set(op_handles)
    g = graph or HandleGraph()
    has_graph = bool(g.producers or g.users)
    anchor = {h: h for h in op_handles}
    role = dict.fromkeys(op_handles, "op")
    for h, kind in qdq.items():
        after = _walk(h, g.users, targets)
        before = _walk(h, g.producers, targets)
        i = bisect.bisect_left(op_handles, h)
        next_op, prev_op = op_handles[i:i + 1], op_handles[i - 1:i] if i else []
        # the graph first (the nearest op each way), then handle order
        forward, backward = [(after[:1], "in"), (next_op, "in")], [(before[-1:], "out"), (prev_op, "out")]
        tries = ([forward[0], backward[0], *forward[1:], *backward[1:]] if kind == "dequantize"
                 else [backward[0], forward[0], *backward[1:], *forward[1:]])
        for found, r in tries:
            if found:
                anchor[h], role[h] = found[0], r
                break
    key, count = {}, {}
    for h in op_handles:
        last = [o for o in ops[h] if not qdq_kind(o.op_type)][-1]
        base = (module_path(last.module_hierarchy), op_kind(last.op_type))
        key[h] = (*base, count.get(base, 0))
        count[base] = count.get(base, 0) + 1
    inputs = {}
    for i, h in enumerate(op_handles):
        if has_graph:
            inputs[h] = set(_walk(h, g.producers, targets)) - {h}
        else:  # no graph: a chain, each op fed by the one before it
            inputs[h] = {op_handles[i - 1]} if i else set()
    return SideKeys(anchor, role, key, inputs, dict(g.qparams), has_graph, producers_seen=set(g.producers))


def fold_unmatched(a: SideKeys, b: SideKeys) -> None:
    """Folds each batch norm one side has and the other lacks into the op producing its input, when
    that op has a counterpart (the other build folded the norm into it)."""
    for side, other in ((a, b), (b, a)):
        theirs = set(other.key.values())
        for h, k in side.key.items():
            if k in theirs or k[1] not in FOLDABLE or not side.inputs.get(h):
                continue
            producer = max(side.inputs[h])
            if side.key.get(producer) in theirs:
                side.folded[h] = producer


def pair_leftovers(a: SideKeys, b: SideKeys) -> None:
    """Pairs the ops of a module that the operator alone keeps apart (one build lowers a linear to
    addmm, another keeps aten.linear): where both sides have the same number of ops without a
    counterpart in a (non-root) module, they pair in order, B's ops taking A's keys."""
    keys_a, keys_b = set(a.key.values()), set(b.key.values())
    left: tuple[dict[str, list[int]], dict[str, list[int]]] = ({}, {})
    for side, theirs, out in ((a, keys_b, left[0]), (b, keys_a, left[1])):
        for h, k in sorted(side.key.items()):
            if k not in theirs and h not in side.folded and k[0]:
                out.setdefault(k[0], []).append(h)
    for module, ha in left[0].items():
        hb = left[1].get(module, [])
        if len(ha) == len(hb):
            for x, y in zip(ha, hb):
                a.by_order[x] = b.by_order[y] = (a.key[x][1], b.key[y][1])
                b.key[y] = a.key[x]


# -- both sides of a method -----------------------------------------------------------------------------


@dataclass
class MethodJoin:
    """How the ops of one method pair up: by handle (`by_handle`) or by module + op."""

    a: SideKeys | None
    b: SideKeys | None
    by_handle: bool

    def side(self, which: str) -> SideKeys | None:
        """The keys of run `which` ('a' or 'b'), or None when that run lacks the method."""
        return self.a if which == "a" else self.b

    def link(self, which: str, block: str, handle: int) -> tuple:
        """The join key of one handle of side `which`."""
        keys = self.side(which)
        target = keys.target(handle) if keys is not None else None
        if target is None:
            return ("h", block, handle)
        if self.by_handle or target not in keys.key:
            return ("h", block, target)
        return ("m", block, *keys.key[target])

    def linking(self, which: str, handles) -> list[int]:
        """The handles a unit joins rows by: by module + op its ops' (q/dq ride along with their op),
        and a unit of q/dq alone joins the one op they wrap, or nothing when they wrap several (the
        time a delegate spent on the weights of many layers is no layer's)."""
        keys = self.side(which)
        if keys is None or self.by_handle:
            return list(handles)
        ops = [h for h in handles if keys.role.get(h, "op") == "op"]
        if not ops and len({keys.target(h) for h in handles}) > 1:
            return []
        return ops or list(handles)

    def links(self, which: str, block: str, handles) -> list[tuple]:
        """The join keys of a unit (see `linking`)."""
        return list(dict.fromkeys(self.link(which, block, h) for h in self.linking(which, handles)))

    def role(self, which: str, handles) -> str:
        """A unit's role from its handles': "in" or "out" when it runs only q/dq of that role, else "op"."""
        keys = self.side(which)
        roles = {keys.role.get(h, "op") for h in handles} if keys is not None else {"op"}
        return roles.pop() if len(roles) == 1 else "op"

    def qparams(self, which: str, handles) -> tuple[float, int] | None:
        """(scale, zero point) of the last constant per-tensor quantize among a unit's handles."""
        keys = self.side(which)
        if keys is None:
            return None
        return next((keys.qparams[h] for h in reversed(sorted(handles)) if h in keys.qparams), None)

    def inputs(self, which: str, block: str, handle: int) -> list[tuple]:
        """The join keys of the ops producing the inputs of the op a handle counts for."""
        keys = self.side(which)
        target = keys.target(handle) if keys is not None else None
        if target is None:
            return []
        return [self.link(which, block, p) for p in sorted(keys.inputs.get(target, ())) if p != target]

    def notes(self, which: str, handles) -> list[str]:
        """What the reader of a row should know about how this side's ops joined it."""
        keys = self.side(which)
        if keys is None or self.by_handle:
            return []
        out = []
        for h in sorted(set(handles)):
            if keys.anchor.get(h) in keys.folded:
                mod, kind, _ = keys.key[keys.anchor[h]]
                out.append(f"{which.upper()}'s {_short_kind(kind)} ({mod or 'root'}) folded in")
            if keys.anchor.get(h) in keys.by_order:
                kind_a, kind_b = keys.by_order[keys.anchor[h]]
                out.append(f"{_short_kind(kind_a)} (A) and {_short_kind(kind_b)} (B) paired by order in "
                           f"{keys.key[keys.anchor[h]][0]}")
        if not keys.has_graph and any(keys.role.get(h) in ("in", "out") for h in handles):
            out.append(f"{which.upper()}: q/dq attached by handle order (no graph in the ETRecord)")
        return list(dict.fromkeys(out))


def _short_kind(kind: str) -> str:
    """An op kind as rows and notes name it ("aten._native_batch_norm_legit" -> "native_batch_norm_legit")."""
    return kind.split(".")[-1].lstrip("_")


def key_label(key: tuple) -> str:
    """A row's name from its module + op key: "features.0.0/convolution#0"."""
    _, _, module, kind, n = key
    return f"{module or 'root'}/{_short_kind(kind)}#{n}"


class Rejoin:
    """The join of two Inspectors' methods, built per event block on first use."""

    def __init__(self, a, b, *, force_module: bool = False):
        self.inspectors = {"a": a, "b": b}
        self.force_module = force_module
        self._methods: dict[str, MethodJoin] = {}

    def _method(self, which: str, block: str):
        program = self.inspectors[which].program_info
        return program.method_for_block(block) if program is not None else None

    def method(self, block: str) -> MethodJoin:
        """The join of one event block's methods, built on first use and cached."""
        if block in self._methods:
            return self._methods[block]
        ma, mb = self._method("a", block), self._method("b", block)
        by_handle = not self.force_module and (ma is None or mb is None or handles_line_up(ma.ops, mb.ops))
        sides = {}
        for which, m in (("a", ma), ("b", mb)):
            if m is None:
                sides[which] = None
                continue
            gm = None if by_handle and not any(qdq_kind(o.op_type) for ops in m.ops.values() for o in ops) \
                else recorded_graph(self.inspectors[which], block)
            sides[which] = side_keys(m.ops, handle_graph(gm) if gm is not None else None)
        a, b = sides["a"], sides["b"]
        if by_handle and a is not None and b is not None:
            # one graph: attach q/dq once, from the side whose recorded graph shows more of it (a
            # delegated build's graph hides the nodes its delegates run)
            sides["a"] = sides["b"] = max((a, b), key=lambda k: len(k.producers_seen))
        elif a is not None and b is not None:
            fold_unmatched(a, b)
            pair_leftovers(a, b)
        join = self._methods[block] = MethodJoin(sides["a"], sides["b"], by_handle)
        return join

    @property
    def by_handle(self) -> bool:
        """Whether every method seen so far joined by debug handle."""
        return all(m.by_handle for m in self._methods.values())


def added_errors(rows: list, inputs: list[set[int]]) -> None:
    """Sets each row's `added_error`: its relative error minus the largest relative error among the
    rows feeding it (a row without numbers passes on its inputs'), i.e. the error this op introduced
    rather than inherited. `inputs[i]`: indices of the rows feeding row i; rows in execution order."""
    carried: dict[int, float] = {}
    for i, row in enumerate(rows):
        inherited = max((carried[j] for j in inputs[i] if j in carried), default=0.0)
        if row.relative is not None:
            row.added_error = row.relative - inherited
            carried[i] = row.relative
        elif inputs[i]:
            carried[i] = inherited
