"""What every XNNPACK support rule asks of a node: its operator's name, its tensors' dtypes and
shapes, which inputs are constants, and how a refusal is phrased."""

from __future__ import annotations

import operator
from collections.abc import Collection

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node

from etlab.compiler._shapes import upper_bound
from etlab.facts.fx import op_name
from etlab.facts.lowered import DelegationRefusal

BACKEND_ID = "XnnpackBackend"
_CONSTANT_PREFIXES = ("p_", "b_", "c_", "_param_constant", "_tensor_constant", "_lifted_tensor_constant")
_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def refusal(category: str, reason: str, hint: str = "") -> DelegationRefusal:
    """A DelegationRefusal attributed to XNNPACK: why a node was left out (category, reason) and what would change
    that (hint)."""
    return DelegationRefusal(BACKEND_ID, category, reason, hint)


def op_key(node: Node) -> str:
    """'aten.convolution.default', 'getitem', ... for etlab's and upstream's Edge targets alike."""
    target = node.target
    wrapped = getattr(target, "_op", None)  # upstream's EdgeOpOverload wraps the ATen OpOverload
    if not isinstance(target, torch._ops.OpOverload) and isinstance(wrapped, torch._ops.OpOverload):
        target = wrapped
    if target is operator.getitem:
        return "getitem"
    return op_name(target)


class Context:
    """What the rules may ask about the graph: which nodes are constants (weights, folded ops)."""

    def __init__(self, program: ExportedProgram | None = None):
        self.constant_names: Collection[str] | None = None
        if program is not None:
            sig = program.graph_signature
            mutated = set(sig.buffers_to_mutate.values()) if hasattr(sig, "buffers_to_mutate") else set()
            self.constant_names = {spec.arg.name for spec in sig.input_specs
                                   if spec.kind in _CONSTANT_KINDS and spec.target not in mutated}
        self._memo: dict[Node, bool] = {}

    def is_constant(self, node) -> bool:
        """A parameter/buffer/constant placeholder, or an op computed from constants only."""
        if not isinstance(node, Node):
            return False
        if node in self._memo:
            return self._memo[node]
        if node.op == "placeholder":
            result = (node.name in self.constant_names if self.constant_names is not None
                      else node.name.startswith(_CONSTANT_PREFIXES))
        elif node.op == "get_attr":
            result = True
        elif node.op == "call_function":
            inputs = node.all_input_nodes
            result = bool(inputs) and all(self.is_constant(n) for n in inputs) and "choose_qparams" not in op_key(node)
        else:
            result = False
        self._memo[node] = result
        return result


# --- value checks -------------------------------------------------------------------------------


def tensor_of(node) -> torch.Tensor | None:
    """The traced tensor value of a node (meta['val']), or None for anything else."""
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def is_static(t: torch.Tensor) -> bool:
    """Whether every dimension of the tensor is a plain int (no symbolic size)."""
    return all(isinstance(d, int) for d in t.shape)


def dim_upper(d) -> int | None:
    """A dim's largest value: itself, or a symbolic dim's bound under export's ranges (None: unbounded)."""
    if isinstance(d, int):
        return d
    env = getattr(d.node, "shape_env", None)
    return upper_bound(d, env.var_to_range) if env is not None else None


def is_bounded(t: torch.Tensor) -> bool:
    """Whether every dimension has an upper bound (XNNPACK needs one for each dynamic size)."""
    return all(dim_upper(d) is not None for d in t.shape)


def value_refusal(node: Node, what: str, dtypes=(torch.float32, torch.float16)) -> DelegationRefusal | None:
    """Why XNNPACK cannot take this operand (not a single tensor, a dtype it lacks, an unbounded size), or None when
    it can."""
    t = tensor_of(node)
    if t is None:
        return refusal("other", f"{what} {node.name!r} is not a single tensor (no tensor meta['val'])",
                       "XNNPACK takes tensor operands only")
    if t.dtype not in dtypes:
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        return refusal("dtype", f"{what} {node.name!r} is {str(t.dtype).removeprefix('torch.')}; XNNPACK's "
                       f"float path takes {names}",
                       "cast to float32 (or float16) before this op, or quantize the model (q/dq int8) for XNNPACK's "
                       "int8 path")
    if not is_bounded(t):
        dims = [str(d) for d in t.shape]
        return refusal("dynamic_shape", f"{what} {node.name!r} has the shape [{', '.join(dims)}] with an unbounded "
                       "dynamic dim; XNNPACK plans its memory for each dim's upper bound",
                       "give the dynamic dim a max (torch.export.Dim(..., max=N)) or export with static shapes")
    if t.numel() == 0:
        return refusal("argument", f"{what} {node.name!r} is empty (shape {list(t.shape)})",
                       "XNNPACK does not run empty tensors")
    return None


def static_only(node: Node, tensors: list, why: str) -> DelegationRefusal | None:
    """Refuses a node whose listed tensors (or its result) have dynamic dims: ops XNNPACK sizes at
    build time (slices, resizes, reshapes to computed shapes)."""
    for t in [tensor_of(node), *(tensor_of(a) for a in tensors)]:
        if t is not None and not is_static(t):
            return refusal("dynamic_shape", f"{why} with the dynamic shape {[str(d) for d in t.shape]}; XNNPACK "
                           "fixes this op's sizes when the delegate is built",
                           "export this part with static shapes, or move the op out of the dynamic region")
    return None


FLOAT_DTYPES = (torch.float32, torch.float16)  # XNNPACK's float path: fp32, and fp16 as upstream lowers fp16 models


def check_values(node: Node, tensor_args: list, dtypes=FLOAT_DTYPES) -> DelegationRefusal | None:
    """The node's output and its tensor operands: float32 or float16 (one of them for all), static, non-empty."""
    found = value_refusal(node, "the result of", dtypes)
    if found is not None:
        return found
    for arg in tensor_args:
        if isinstance(arg, Node):
            found = value_refusal(arg, "operand", dtypes)
            if found is not None:
                return found
    floats = {t.dtype for t in (tensor_of(a) for a in [node, *tensor_args] if isinstance(a, Node))
              if t is not None and t.dtype in FLOAT_DTYPES}
    if len(floats) > 1:
        return refusal("dtype", f"{node.name!r} mixes {'/'.join(sorted(str(d).removeprefix('torch.') for d in floats))}"
                       " values; an XNNPACK node computes in one float type", "cast its operands to one dtype first")
    return None


def arg_of(node: Node, index: int, name: str, default=None):
    """A node's argument by position, else by keyword, else `default` (edge nodes may carry either)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def is_flattening_view(node) -> bool:
    """A view_copy that only merges leading dims into one (the last dim, a linear's input features,
    stays): how a linear on a 3-D input is decomposed."""
    if not isinstance(node, Node) or node.op != "call_function" or op_key(node) != "aten.view_copy.default":
        return False
    before, after = tensor_of(node.args[0]), tensor_of(node)
    return (before is not None and after is not None and before.dim() >= 2 and after.dim() == 2
            and before.shape[-1] == after.shape[-1])
