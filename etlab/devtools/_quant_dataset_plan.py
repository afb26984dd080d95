"""What a report over a dataset measures, and in which order, worked out once from the two graphs (`make_plan`).

Per joined layer a `LayerTask`: the float model's value at the layer's end (the reference), the converted
graph's value (what the next layer reads), the values its local re-run feeds (the converted graph's own inputs
of the layer) and the float values the re-run reads besides; per calibrated quantize node a `CoverageTask`
(the values that reach it). Tasks run in the converted graph's execution order, each graph advanced only as far
as the task needs (see _quant_dataset_run.Stepper); every value a task reads is held until the last task that
reads it is done (`release_after`): memory follows the layers in flight, not the depth of the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.fx import GraphModule, Node
from torch.utils._pytree import tree_flatten

from etlab.devtools._quant_dataset_run import Constants, fusable_quantizers, static_quantizer
from etlab.devtools._quant_dataset_stats import Coverage
from etlab.devtools._quant_debug import LayerJoin, _input_dependent, join_layers, mutated_later

FLOAT, QUANT = "f", "q"  # which graph a value comes from


def output_nodes(gm: GraphModule) -> list:
    """The values a graph returns, flattened (the output node's leaves)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves, _ = tree_flatten(out.args[0])
    return leaves


@dataclass
class LayerTask:
    """One joined layer's measurement: total error (ref against val), local error (the float chain re-run on
    `feeds`), inherited error (each feed against the float model's value of the same node)."""

    join: LayerJoin
    feeds: dict[str, tuple[str, str]]  # float node -> (graph, node) whose value the local re-run feeds for it
    reads: list[str]  # float nodes the re-run reads besides the feeds (weights, a folded op's other input)
    local: bool  # the re-run can reproduce the value (no in-place op changes it later)
    computed: str | None = None  # the converted graph's node whose value IS the re-run's (see same_computation)

    @property
    def needs(self) -> list[tuple[str, str]]:
        """The (graph, node) values this measurement reads, so the run keeps exactly those alive."""
        end = self.join.chain[-1].name
        rerun = [(QUANT, self.computed)] if self.computed else [*((FLOAT, name) for name in self.reads)]
        return [(FLOAT, end), (QUANT, self.join.qvalue_node.name), *self.feeds.values(),
                *((FLOAT, name) for name in self.feeds), *rerun]


@dataclass
class CoverageTask:
    """A calibrated quantize node's range against the values that reach it."""

    node: str
    source: tuple[str, str]

    @property
    def needs(self) -> list[tuple[str, str]]:
        """The one value this coverage check reads."""
        return [self.source]


@dataclass
class _Plan:
    """What one report needs from each graph, worked out once."""

    joins: list[LayerJoin]
    join_of: dict[str, LayerJoin]
    input_dep: set[str]
    mutated: set[str]
    keep_float: set[str]
    keep_quant: set[str]
    quantizers: dict[str, Coverage]  # quantize node name -> its coverage
    quant_inputs: dict[str, str]  # quantize node name -> the node whose value it quantizes
    observed: dict[str, str]  # quantize node name -> the float model's node its observer watched in calibration
    quantizer_of: dict[str, str]  # layer (first float node) -> its output's quantize node
    float_constants: Constants = None
    quant_constants: Constants = None
    fusable: frozenset[str] = frozenset()
    tasks: list = field(default_factory=list)
    release_after: list[list[tuple[str, str]]] = field(default_factory=list)  # per task: values no later task reads
    static_float: set[str] = field(default_factory=set)  # float values no input reaches: held for every batch
    ranged: set[str] = field(default_factory=set)  # float values whose per-input extremes a coverage task reads


def feed_sources(join: LayerJoin, join_of: dict[str, LayerJoin], input_dep: set[str]) -> dict[str, tuple[str, str]]:
    """Float node -> where the local re-run's value for it comes from (as _quant_debug.local_inputs, by node):
    the converted graph's own input of the layer when the two nodes' arguments line up, else the dequantized
    output of the layer that computes it, else the float value."""
    first = join.chain[0]
    f_leaves, _ = tree_flatten((first.args, first.kwargs))
    q_leaves, _ = tree_flatten((join.qnode.args, join.qnode.kwargs))
    aligned = first.target == join.qnode.target and len(f_leaves) == len(q_leaves)
    feeds: dict[str, tuple[str, str]] = {}
    for i, a in enumerate(f_leaves):
        if not isinstance(a, Node) or a.name not in input_dep:
            continue
        if aligned and isinstance(q_leaves[i], Node):
            feeds[a.name] = (QUANT, q_leaves[i].name)
        elif a.name in join_of:
            feeds[a.name] = (QUANT, join_of[a.name].qvalue_node.name)
        else:
            feeds[a.name] = (FLOAT, a.name)
    return feeds


def same_computation(join: LayerJoin, feeds: dict[str, tuple[str, str]], reads: list[str]) -> bool:
    """Whether the local re-run of a layer computes exactly what its converted node computed: one float op, the
    same op in the converted graph, every input fed from that node's own argument in the same place and every
    other argument equal (a ReLU6, an add, a pool: no weights). The converted node's value (before its output
    quantizer) is then the local reference, bit for bit, and the re-run is not needed."""
    first, q = join.chain[0], join.qnode
    if len(join.chain) != 1 or reads or first.target != q.target:
        return False
    f_leaves, f_spec = tree_flatten((first.args, first.kwargs))
    q_leaves, q_spec = tree_flatten((q.args, q.kwargs))
    if f_spec != q_spec:
        return False
    for a, b in zip(f_leaves, q_leaves):
        if isinstance(a, Node) != isinstance(b, Node):
            return False
        if isinstance(a, Node) and feeds.get(a.name) != (QUANT, b.name):
            return False
        if not isinstance(a, Node) and (type(a) is not type(b) or a != b):
            return False
    return True


def _layer_task(join: LayerJoin, join_of: dict[str, LayerJoin], input_dep: set[str], mutated: set[str]) -> LayerTask:
    feeds = feed_sources(join, join_of, input_dep)
    inside = {n.name for n in join.chain}
    reads = sorted({a.name for n in join.chain for a in n.all_input_nodes} - inside - set(feeds))
    local = not any(n.name in mutated for n in join.chain)
    computed = join.qnode.name if local and same_computation(join, feeds, reads) else None
    return LayerTask(join, feeds, reads, local, computed)


def _order(tasks: list, float_gm: GraphModule, quant_gm: GraphModule, joins: list[LayerJoin]) -> list:
    """Tasks in the converted graph's execution order: a layer at its value's node, a coverage task at the
    layer whose float value it reads (or at the converted graph's node it reads)."""
    qpos = {n.name: i for i, n in enumerate(quant_gm.graph.nodes)}
    at_float = {j.chain[-1].name: qpos[j.qvalue_node.name] for j in joins}

    def key(item):
        i, t = item
        if isinstance(t, LayerTask):
            return (qpos[t.join.qvalue_node.name], 0, i)
        graph, name = t.source
        return (qpos[name] if graph == QUANT else at_float.get(name, -1), 1, i)

    return [t for _, t in sorted(enumerate(tasks), key=key)]


def make_plan(float_gm: GraphModule, quant_gm: GraphModule) -> _Plan:
    """What to measure over the dataset: the layers joined between the float and the quantized graph, the values each
    measurement reads, and the coverage checks of calibrated quantize nodes."""
    joins = join_layers(float_gm, quant_gm)
    join_of = {j.chain[-1].name: j for j in joins}
    input_dep = _input_dependent(float_gm)
    mutated = mutated_later(float_gm)
    static_float = {n.name for n in float_gm.graph.nodes if n.name not in input_dep}  # weights, constants
    layer_tasks = [_layer_task(j, join_of, input_dep, mutated) for j in joins]
    quantizers, quant_inputs, quantizer_of, observed = {}, {}, {}, {}
    by_qnode = {j.qnode.name: j for j in joins}
    float_inputs = {n.name for n in float_gm.graph.nodes if n.op == "placeholder"}
    coverage_tasks = []
    for n in quant_gm.graph.nodes:
        cov = static_quantizer(n)
        if cov is None or not isinstance(n.args[0], Node):
            continue
        quantizers[n.name], quant_inputs[n.name] = cov, n.args[0].name
        j = by_qnode.get(n.args[0].name)
        if j is not None or n.args[0].name in float_inputs:
            observed[n.name] = j.chain[-1].name if j is not None else n.args[0].name
        if j is not None and j.qvalue_node.args and j.qvalue_node.args[0] is n:  # the layer's output quantizer
            quantizer_of.setdefault(j.chain[0].name, n.name)
        source = (FLOAT, observed[n.name]) if n.name in observed else (QUANT, n.args[0].name)
        coverage_tasks.append(CoverageTask(n.name, source))
    tasks = _order([*layer_tasks, *coverage_tasks], float_gm, quant_gm, joins)
    outputs = {(FLOAT, a.name) for a in output_nodes(float_gm) if isinstance(a, Node)}
    outputs |= {(QUANT, a.name) for a in output_nodes(quant_gm) if isinstance(a, Node)}
    last: dict[tuple[str, str], int] = {}
    for i, t in enumerate(tasks):
        for need in t.needs:
            if not (need[0] == FLOAT and need[1] in static_float):
                last[need] = i
    release_after: list[list[tuple[str, str]]] = [[] for _ in tasks]
    for need, i in last.items():
        if need not in outputs:  # the outputs are read after the last task
            release_after[i].append(need)
    keep_float = static_float | {name for g, name in [*last, *outputs] if g == FLOAT}
    keep_quant = {name for g, name in [*last, *outputs] if g == QUANT}
    return _Plan(joins, join_of, input_dep, mutated, keep_float, keep_quant, quantizers, quant_inputs, observed,
                 quantizer_of, Constants.of(float_gm), Constants.of(quant_gm),
                 fusable_quantizers(quant_gm, keep_quant), tasks, release_after, static_float,
                 {t.source[1] for t in coverage_tasks if t.source[0] == FLOAT})
