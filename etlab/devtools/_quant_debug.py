"""Numeric debugging of a quantized program against its float model, one row per layer.

A quantized program (torchao's PT2E `convert_pt2e` output) keeps, on every node, the provenance
torch.fx records (`node.meta["from_node"]`): the chain of passes back to the node of the exported
float graph it came from. That provenance survives prepare/convert (it is what torchao's own
numeric debugger joins on), so each compute node of the quantized graph is joined here to the float
graph's node of the same origin. Per joined layer:

- total error: the float model's value against the quantized program's value (after the layer's
  quantize/dequantize pair, i.e. what the next layer reads): SQNR, MSE, cosine, max-abs;
- local error: the float op re-run on the quantized program's own (dequantized) inputs, with float
  weights, against the quantized value. What the layer *introduced*, not what it inherited;
- statistics of the quantized value (min/max/mean/std, NaN/Inf counts).

Float ops that quantization folds away (batch norm into the conv before it) have no node of their
own in the quantized graph: the quantized node then stands for the float chain conv -> batch norm,
and both the reference and the local re-run take the chain's end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch.fx import GraphModule, Interpreter, Node
from torch.utils._pytree import tree_flatten, tree_map

from etlab.facts.fx import node_op_name
from etlab.facts.quant import QUANT_NAMESPACES
from etlab.facts.source import module_path, source_line

# the debug-handle origin of a node inserted by ExportedProgram.module(): not in the float graph
_UNLIFT_PASS = "ExportedProgram.module().unlift()"


# --- running a graph, keeping every node's value -------------------------------------------------


class _Capture(Interpreter):
    """Runs a GraphModule and keeps every node's output by node name."""

    def __init__(self, gm: GraphModule):
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[str, Any] = {}

    def run_node(self, n: Node) -> Any:
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def capture_values(gm: GraphModule, inputs: Sequence) -> dict[str, Any]:
    """Every node's output of one run of `gm` on `inputs` (node name -> value), without autograd."""
    with torch.no_grad():
        cap = _Capture(gm)
        cap.run(*inputs)
    return cap.values


# --- provenance ------------------------------------------------------------------------------------


def origin_name(node: Node) -> str | None:
    """The name of the float graph's node this node came from: the oldest `from_node` ancestor
    (torch.fx's provenance, kept through prepare_pt2e/convert_pt2e), or None for nodes created by
    unlifting or with no provenance. Placeholders are their own origin (joined by name)."""
    if node.op == "placeholder":
        return node.name
    sources = node.meta.get("from_node")
    if not sources:
        return None
    src = sources[-1]
    if getattr(src, "pass_name", "") == _UNLIFT_PASS:
        return None
    while getattr(src, "from_node", None):
        src = src.from_node[-1]
    return getattr(src, "name", None)


def is_quant_op(node: Node) -> bool:
    """A quantize / dequantize / choose_qparams node (quantized_decomposed or torchao namespace)."""
    if node.op != "call_function":
        return False
    name = node_op_name(node)
    return name.split(".", 1)[0] in QUANT_NAMESPACES


def _is_quantize(node: Node) -> bool:
    return is_quant_op(node) and "quantize" in node_op_name(node) and "dequantize" not in node_op_name(node)


def _is_dequantize(node: Node) -> bool:
    return is_quant_op(node) and "dequantize" in node_op_name(node)


def dequantized_output(node: Node) -> tuple[Node, bool]:
    """The node whose value the next layer reads for `node`'s output: the dequantize of a
    quantize of it when there is one (a quantized output), else the node itself."""
    for q in node.users:
        if _is_quantize(q):
            for d in q.users:
                if _is_dequantize(d):
                    return d, True
    return node, False


def _input_dependent(graph: GraphModule) -> set[str]:
    """Names of the nodes whose value depends on a user input (not only on weights/constants)."""
    dep: set[str] = set()
    for n in graph.graph.nodes:
        if n.op == "placeholder" or any(a.name in dep for a in n.all_input_nodes):
            dep.add(n.name)
    return dep


def _writes_first_argument(target) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def _is_view(target) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None
                and not schema.returns[0].alias_info.is_write)


def mutated_later(graph: GraphModule) -> set[str]:
    """Names of the nodes whose value an in-place op changes after the node ran (the tensor it writes and
    the views it was taken from or that are taken of it). torch.export's graphs keep in-place ops
    (Swin's attention mask: `new_zeros`, then slices filled in place), so the value a capture holds for
    such a node is the mutated one and a re-run of the node cannot reproduce it."""
    base_of: dict[str, str] = {}
    for n in graph.graph.nodes:
        if n.op == "call_function" and _is_view(n.target) and n.args and isinstance(n.args[0], Node):
            base_of[n.name] = base_of.get(n.args[0].name, n.args[0].name)
    written = {base_of.get(n.args[0].name, n.args[0].name) for n in graph.graph.nodes
               if n.op == "call_function" and _writes_first_argument(n.target) and n.args
               and isinstance(n.args[0], Node)}
    if not written:
        return set()
    return {n.name for n in graph.graph.nodes if base_of.get(n.name, n.name) in written}


def degenerate_reason(reference: torch.Tensor, value: torch.Tensor, floor: float = 1e-6) -> str:
    """Why an SQNR between `reference` (float) and `value` (quantized) means nothing, or "": the float
    value is all zero (SQNR is +inf or -inf whatever the error), below `floor` in magnitude (far under any
    int8 grid step: a randomly initialised model's ~1e-9 outputs), or the quantized value is all zero
    while the float is not (everything rounded to zero: 0 dB)."""
    ref = reference.detach()
    if ref.numel() == 0:
        return ""
    finite = ref[torch.isfinite(ref)] if not bool(torch.isfinite(ref).all()) else ref
    peak = float(finite.abs().max()) if finite.numel() else 0.0
    if peak == 0.0:
        return "float value is all zero"
    if peak < floor:
        return f"float value is tiny (max |x| {peak:.1e})"
    if not bool(value.detach().any()):
        return f"quantized value is all zero (float max |x| {peak:.2g} below the quantization step)"
    return ""


@dataclass
class LayerJoin:
    """One float layer joined to the quantized node that computes it."""

    chain: list[Node]  # float nodes, first the op, then ops folded into it (batch norm)
    qnode: Node  # the quantized graph's compute node
    qvalue_node: Node  # where the quantized value is read (dequantize after it, or qnode)
    quantized: bool  # the output goes through quantize/dequantize


def join_layers(float_gm: GraphModule, quant_gm: GraphModule) -> list[LayerJoin]:
    """Joins each compute node of the quantized graph to its float node through provenance, in
    the quantized graph's execution order. Raises ValueError when nothing joins (the two graphs
    do not come from one export of one model)."""
    by_origin: dict[str, Node] = {}
    for n in float_gm.graph.nodes:
        if n.op in ("call_function", "placeholder"):
            by_origin.setdefault(origin_name(n) or n.name, n)
            by_origin.setdefault(n.name, n)
    counterpart: dict[str, Node] = {}  # float node name -> quantized node (the last one of that origin)
    order: list[str] = []
    for q in quant_gm.graph.nodes:
        if q.op != "call_function" or is_quant_op(q):
            continue
        f = by_origin.get(origin_name(q) or "")
        if f is None or f.op != "call_function":
            continue
        if f.name not in counterpart:
            order.append(f.name)
        counterpart[f.name] = q
    if not counterpart:
        raise ValueError("quantization_report: no node of the quantized program traces back to the float model's "
                         "graph; quantize the same model (torch.export of it, then prepare_pt2e/convert_pt2e)")
    float_nodes = {n.name: n for n in float_gm.graph.nodes}
    joins = []
    for name in order:
        chain = [float_nodes[name]]
        while True:  # float ops folded into this one: single-user successors with no quantized node
            users = list(chain[-1].users)
            if len(users) != 1 or users[0].op != "call_function" or users[0].name in counterpart:
                break
            chain.append(users[0])
        qnode = counterpart[name]
        qvalue_node, quantized = dequantized_output(qnode)
        joins.append(LayerJoin(chain, qnode, qvalue_node, quantized))
    return joins


# --- metrics -----------------------------------------------------------------------------------


@dataclass
class ErrorMetrics:
    """How far `value` is from `reference`: SQNR (dB; inf when equal), MSE, cosine, max-abs."""

    sqnr: float
    mse: float
    cosine: float
    max_abs: float


def error_metrics(reference: torch.Tensor, value: torch.Tensor) -> ErrorMetrics:
    """Four dot products and a max over the difference, in float32 (float64 inputs stay float64):
    a per-layer report over a CNN is dominated by these passes, and float32 sums are exact enough
    for dB and cosine. Non-finite elements are looked for only when a sum is not finite: -inf
    masks (attention) that match count as equal, any other non-finite mismatch is total error."""
    dtype = torch.float64 if torch.float64 in (reference.dtype, value.dtype) else torch.float32
    a = reference.detach().reshape(-1).to(dtype)
    b = value.detach().reshape(-1).to(dtype)
    if a.numel() == 0:
        return ErrorMetrics(math.inf, 0.0, 1.0, 0.0)
    d = a - b
    sums = torch.stack([torch.dot(d, d), torch.dot(a, a), torch.dot(a, b), torch.dot(b, b)])
    if not bool(torch.isfinite(sums).all()):
        finite = torch.isfinite(a) & torch.isfinite(b)
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if not bool((same | finite).all()):
            return ErrorMetrics(-math.inf, math.inf, math.nan, math.inf)
        a, b = a[finite], b[finite]
        if a.numel() == 0:
            return ErrorMetrics(math.inf, 0.0, 1.0, 0.0)
        d = a - b
        sums = torch.stack([torch.dot(d, d), torch.dot(a, a), torch.dot(a, b), torch.dot(b, b)])
    n = a.numel()
    noise_sum, signal_sum, cross, b_sum = (float(x) for x in sums.to(torch.float64))
    if noise_sum == 0.0:
        sqnr = math.inf
    elif signal_sum == 0.0:
        sqnr = -math.inf
    elif math.isfinite(noise_sum) and math.isfinite(signal_sum):
        sqnr = 10.0 * math.log10(signal_sum / noise_sum)
    else:  # float32 overflow of a sum
        sqnr = math.nan
    na, nb = math.sqrt(signal_sum), math.sqrt(b_sum)
    cosine = cross / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    lo, hi = torch.aminmax(d)
    return ErrorMetrics(sqnr, noise_sum / n, cosine, max(-float(lo), float(hi)))


def tensor_stats(value: torch.Tensor) -> dict[str, float]:
    """min/max/mean/std of the finite elements, and the NaN and Inf counts (counted only when the
    range says there are any)."""
    v = value.detach().reshape(-1)
    if v.numel() == 0:
        return {"min": math.nan, "max": math.nan, "mean": math.nan, "std": math.nan, "nan": 0, "inf": 0}
    lo, hi = (float(x) for x in torch.aminmax(v))
    nan = inf = 0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        nan = int(torch.isnan(v).sum())
        inf = int(torch.isinf(v).sum())
        v = v[torch.isfinite(v)]
        if v.numel() == 0:
            return {"min": math.nan, "max": math.nan, "mean": math.nan, "std": math.nan, "nan": nan, "inf": inf}
        lo, hi = (float(x) for x in torch.aminmax(v))
    v = v if v.dtype == torch.float64 else v.float()
    # sum and sum of squares in one pass each (std_mean's two-pass kernel is 5x slower here); the
    # cancellation of E[x^2] - E[x]^2 only matters when |mean| >> std, far from activations' ranges
    total, squares = (float(x) for x in torch.stack([v.sum(), torch.dot(v, v)]).to(torch.float64))
    mean = total / v.numel()
    std = math.sqrt(max(squares / v.numel() - mean * mean, 0.0))
    return {"min": lo, "max": hi, "mean": mean, "std": std, "nan": nan, "inf": inf}


# --- local re-run ------------------------------------------------------------------------------


def _quantized_input(arg: Node, join_of: dict[str, LayerJoin], q_values: dict[str, Any]):
    """The quantized program's value for float node `arg` (the dequantized one the next layer
    reads), or None when no quantized node computes it."""
    j = join_of.get(arg.name)
    if j is not None:
        return q_values[j.qvalue_node.name]
    return None


def local_inputs(join: LayerJoin, join_of: dict[str, LayerJoin], f_values: dict[str, Any],
                 q_values: dict[str, Any], input_dep: set[str]) -> dict[str, Any]:
    """Float node name -> the value the local re-run feeds for it: the quantized program's own
    input (the exact value the quantized node consumed when the two nodes' arguments line up,
    else the dequantized output of the layer that computes it), and the float value for weights
    and constants."""
    first = join.chain[0]
    feeds: dict[str, Any] = {}
    f_leaves, _ = tree_flatten((first.args, first.kwargs))
    q_leaves, _ = tree_flatten((join.qnode.args, join.qnode.kwargs))
    aligned = first.target == join.qnode.target and len(f_leaves) == len(q_leaves)
    for i, a in enumerate(f_leaves):
        if not isinstance(a, Node) or a.name not in input_dep:
            continue
        value = None
        if aligned and isinstance(q_leaves[i], Node):
            value = q_values.get(q_leaves[i].name)
        if value is None:
            value = _quantized_input(a, join_of, q_values)
        feeds[a.name] = value if value is not None else f_values[a.name]
    return feeds


def rerun_float(chain: list[Node], feeds: dict[str, Any], f_values: dict[str, Any]):
    """Runs the float nodes of `chain` with `feeds` in place of their inputs (float values for
    the rest): the float layer on the quantized program's inputs."""
    env = dict(feeds)

    def value(a):
        if isinstance(a, Node):
            return env[a.name] if a.name in env else f_values[a.name]
        return a

    with torch.no_grad():
        for n in chain:
            args = tree_map(value, n.args)
            kwargs = tree_map(value, n.kwargs)
            env[n.name] = n.target(*args, **kwargs)
    return env[chain[-1].name]


# --- the report --------------------------------------------------------------------------------

COLUMNS = ["order", "layer", "op", "module", "source", "quantized", "ranked", "degenerate", "sqnr", "mse", "cosine",
           "max_abs",
           "local_sqnr", "local_mse", "local_cosine", "local_max_abs", "input_sqnr", "min", "max", "mean", "std",
           "nan", "inf", "float_min", "float_max", "numel", "folded", "quantized_node", "from_runtime",
           "runtime_vs_torch"]
# what `ranked` and `degenerate` mean: see layer_rows


def _tensor(x) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x
    return None


def _finite_range(t: torch.Tensor) -> tuple[float, float]:
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return math.nan, math.nan
    lo, hi = (float(x) for x in torch.aminmax(flat))
    if math.isfinite(lo) and math.isfinite(hi):
        return lo, hi
    finite = flat[torch.isfinite(flat)]
    return (float(finite.min()), float(finite.max())) if finite.numel() else (math.nan, math.nan)


def _runtime_columns(name: str, q_values: dict[str, Any], torch_q_values: dict[str, Any] | None) -> dict:
    if torch_q_values is None:
        return {"from_runtime": False, "runtime_vs_torch": math.nan}
    ours, theirs = q_values.get(name), torch_q_values.get(name)
    if ours is theirs or _tensor(ours) is None or _tensor(theirs) is None or ours.shape != theirs.shape:
        return {"from_runtime": False, "runtime_vs_torch": math.nan}
    a, b = ours.double(), theirs.double()
    diff = torch.where(a == b, 0.0, (a - b).abs())  # equal infinities (masks) are no difference
    return {"from_runtime": True, "runtime_vs_torch": float(diff.max()) if diff.numel() else 0.0}


def layer_rows(float_gm: GraphModule, quant_gm: GraphModule, f_values: dict[str, Any],
               q_values: dict[str, Any], torch_q_values: dict[str, Any] | None = None) -> list[dict]:
    """One row per joined layer with a floating-point tensor output (see COLUMNS). With
    `torch_q_values` (the converted graph run in torch), `q_values` came from the runtime:
    `from_runtime` says whether the runtime logged the layer's value, `runtime_vs_torch` is its
    max-abs distance to torch's (within one quantization step when the kernels agree)."""
    joins = join_layers(float_gm, quant_gm)
    join_of = {j.chain[-1].name: j for j in joins}
    input_dep = _input_dependent(float_gm)
    mutated = mutated_later(float_gm)
    sqnr_of: dict[tuple[str, int], float] = {}  # (float node, id of the quantized value) -> SQNR: inputs reuse it
    rows = []
    for j in joins:
        end = j.chain[-1]
        ref, val = _tensor(f_values.get(end.name)), _tensor(q_values.get(j.qvalue_node.name))
        if ref is None or val is None or ref.shape != val.shape:
            continue
        feeds = local_inputs(j, join_of, f_values, q_values, input_dep)
        total = error_metrics(ref, val)
        sqnr_of[(end.name, id(val))] = total.sqnr
        local = None
        if not any(n.name in mutated for n in j.chain):  # a mutated value: the re-run cannot reproduce it
            local_ref = _tensor(rerun_float(j.chain, feeds, f_values))
            local = error_metrics(local_ref, val) if local_ref is not None and local_ref.shape == val.shape else None
        degenerate = degenerate_reason(ref, val) if j.quantized else ""
        exact = (local if local is not None else total).sqnr == math.inf  # quantization changed nothing
        inputs = [sqnr_of[(name, id(v))] if (name, id(v)) in sqnr_of else error_metrics(f_values[name], v).sqnr
                  for name, v in feeds.items() if _tensor(v) is not None and _tensor(f_values.get(name)) is not None
                  and f_values[name].shape == v.shape]
        first = j.chain[0]
        stats = tensor_stats(val)
        ref_lo, ref_hi = _finite_range(ref)
        rows.append({
            "order": len(rows), "layer": first.name, "op": node_op_name(first),
            "module": module_path(first.meta.get("nn_module_stack")),
            "source": source_line(first.meta.get("stack_trace")), "quantized": j.quantized,
            # ranked: quantization changed this layer's output (it goes through quantize/dequantize and is
            # not bit-exact) and its SQNR means something; float ops (a mask built with slices) are not ranked
            "ranked": j.quantized and not exact and not degenerate, "degenerate": degenerate,
            "sqnr": total.sqnr, "mse": total.mse, "cosine": total.cosine, "max_abs": total.max_abs,
            "local_sqnr": local.sqnr if local else math.nan, "local_mse": local.mse if local else math.nan,
            "local_cosine": local.cosine if local else math.nan,
            "local_max_abs": local.max_abs if local else math.nan,
            "input_sqnr": min(inputs) if inputs else math.inf,
            **stats,
            "float_min": ref_lo, "float_max": ref_hi,
            "numel": val.numel(), "folded": [n.name for n in j.chain[1:]], "quantized_node": j.qnode.name,
            **_runtime_columns(j.qvalue_node.name, q_values, torch_q_values),
        })
    return rows


@dataclass
class QuantReport:
    """Per-layer error of a quantized program against its float model.

    `layers`: one row per layer in execution order (COLUMNS): total error (`sqnr`, `mse`,
    `cosine`, `max_abs`), local error (`local_*`: the float op on the quantized inputs),
    `input_sqnr` (the worst input's SQNR: the error it inherited), statistics of the quantized
    value. `output`: the same metrics for each program output. `worst(k)`: the k layers that
    introduced the most error.
    """

    layers: pd.DataFrame
    output: list[dict[str, float]]
    float_graph: GraphModule | None = None
    quantized_graph: GraphModule | None = None
    label: str = ""
    extra: dict = field(default_factory=dict)

    def worst(self, k: int = 5, by: str = "local_sqnr") -> pd.DataFrame:
        """The k layers with the lowest `by` (default: local SQNR, the error a layer introduced;
        `"sqnr"` ranks where the error accumulated instead), among the `ranked` layers only: those
        whose output quantization changed (ops kept in float and bit-exact ones are never ranked) and
        whose SQNR is not degenerate; -inf (a non-finite mismatch) comes first."""
        if by not in ("local_sqnr", "sqnr"):
            raise ValueError(f"worst: rank by 'local_sqnr' or 'sqnr', got {by!r}")
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"worst: k must be a non-negative int, got {k!r}")
        layers = self.layers[self.layers["ranked"].astype(bool)] if "ranked" in self.layers else self.layers
        df = layers.sort_values([by, "local_mse"], ascending=[True, False], na_position="last", kind="stable")
        return df.head(k)

    @property
    def output_sqnr(self) -> float:
        """The lowest SQNR over the program's outputs whose SQNR means something (dB; NaN when none does:
        see `output_degenerate`)."""
        return min((o["sqnr"] for o in self.output if not o.get("degenerate")), default=math.nan)

    @property
    def output_degenerate(self) -> list[str]:
        """Why an output's SQNR means nothing ('output 0: float value is all zero'), one entry per such output."""
        return [f"output {o['output']}: {o['degenerate']}" for o in self.output if o.get("degenerate")]

    def __repr__(self) -> str:
        return f"QuantReport({self.label + ': ' if self.label else ''}{self.summary()})"

    def to_dataframe(self) -> pd.DataFrame:
        """The per-layer table (a copy: editing it leaves the report as it is)."""
        return self.layers.copy()

    def summary(self) -> str:
        """One line: layers, output SQNR, the layer that introduced the most error."""
        meaningful = [o for o in self.output if not o.get("degenerate")]
        text = f"{len(self.layers)} layers; output SQNR {self.output_sqnr:.2f} dB" if meaningful or not self.output \
            else f"{len(self.layers)} layers; output SQNR not meaningful ({'; '.join(self.output_degenerate)})"
        if meaningful and self.output_degenerate:
            text += f" (not meaningful for {'; '.join(self.output_degenerate)})"
        worst = self.worst(1)
        if len(worst):
            r = worst.iloc[0]
            text += (f"; most error introduced by {r['layer']} ({r['op']}{', ' + r['module'] if r['module'] else ''}):"
                     f" local SQNR {r['local_sqnr']:.2f} dB")
        return text

    def _repr_html_(self):
        from etlab.facts import display

        return display.html(self) or f"<pre>{self.summary()}</pre>"

    def show(self, **kwargs):
        """The QuantizationView of this report (etlab.visualizer)."""
        from etlab.facts import display

        return display.show(self, **kwargs)


def _as_inputs(inputs) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise TypeError(f"inputs must be a tuple or list of the model's inputs, got {type(inputs).__name__}")
    return tuple(inputs)


def float_graph_of(float_model, inputs: tuple) -> GraphModule:
    """The float model as the GraphModule PT2E quantization starts from (torch.export, then .module())."""
    if isinstance(float_model, GraphModule):
        return float_model
    if isinstance(float_model, torch.export.ExportedProgram):
        return float_model.module()
    if isinstance(float_model, torch.nn.Module):
        return torch.export.export(float_model, inputs).module()
    raise TypeError(f"float_model must be a torch.nn.Module, ExportedProgram or GraphModule, "
                    f"got {type(float_model).__name__}")


def _outputs(values: dict[str, Any], gm: GraphModule) -> list:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves, _ = tree_flatten(out.args[0])
    return [values[a.name] if isinstance(a, Node) else a for a in leaves]


def converted_graph(quantized) -> GraphModule:
    """The converted GraphModule (convert_pt2e's output) from it or an ExportedProgram of it; a TypeError else."""
    if isinstance(quantized, torch.export.ExportedProgram):
        quantized = quantized.module()
    if not isinstance(quantized, GraphModule):
        raise TypeError("quantized must be the GraphModule convert_pt2e returned (or an ExportedProgram of it), "
                        f"got {type(quantized).__name__}")
    return quantized


def quantization_report(float_model, quantized, inputs, *, runtime: bool = False, label: str = "") -> QuantReport:
    """Per-layer error of `quantized` (torchao's `convert_pt2e` output, a GraphModule, or an
    ExportedProgram of it) against `float_model` (the nn.Module, its ExportedProgram or the
    GraphModule it was quantized from) on `inputs`: total and local error per layer, joined
    through the provenance prepare/convert keeps. See QuantReport.

    runtime=True: the quantized values are etlab's runtime's (the program compiled to .pte and
    run with its intermediates logged), not torch's run of the converted graph; the local re-run
    then feeds each float op the runtime's own inputs."""
    args = _as_inputs(inputs)
    quantized = converted_graph(quantized)
    float_gm = float_graph_of(float_model, args)
    f_values = capture_values(float_gm, args)
    q_values = capture_values(quantized, args)
    torch_q_values = None
    if runtime:
        from etlab.devtools._quant_debug_runtime import runtime_values

        torch_q_values, q_values = q_values, {**q_values, **runtime_values(quantized, args, like=q_values)}
    rows = layer_rows(float_gm, quantized, f_values, q_values, torch_q_values)
    outputs = []
    for i, (ref, val) in enumerate(zip(_outputs(f_values, float_gm), _outputs(q_values, quantized))):
        if _tensor(ref) is not None and _tensor(val) is not None and ref.shape == val.shape:
            outputs.append({"output": i, **vars(error_metrics(ref, val)), "degenerate": degenerate_reason(ref, val)})
    return QuantReport(pd.DataFrame(rows, columns=COLUMNS), outputs, float_gm, quantized, label)
