"""Edge-dialect checks: allowed ops, dtypes the runtime kernels support, bounded shapes, tensor outputs.

Every failure is a CompileError naming the op and the user's source line. The dtype table is
etlab.ops's: the same allowlist the runtime and ETRecord replay read.
"""

from __future__ import annotations

import operator

import torch
from torch._ops import HigherOrderOperator, OpOverload
from torch.fx import GraphModule, Node

from etlab import ops
from etlab.compiler._config import EdgeCompileConfig
from etlab.compiler._decompose import is_edge_op
from etlab.compiler._errors import CompileError
from etlab.compiler._graph import tensor_vals
from etlab.compiler._shapes import upper_bound
from etlab.facts.fx import op_name

_CONTROL_FLOW_OK = {"cond", "executorch_call_delegate"}
_SYM_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
            operator.neg, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge}


def _check_op(node: Node, config: EdgeCompileConfig) -> None:
    target = node.target
    if target is operator.getitem or target in _SYM_OPS:
        return
    if isinstance(target, HigherOrderOperator):
        if target.name() not in _CONTROL_FLOW_OK:
            raise CompileError.at(node, "this control-flow operator is not supported (only torch.cond)")
        return
    if not isinstance(target, OpOverload):
        raise CompileError.at(node, f"call to {op_name(target)} cannot run on the runtime (not an operator)")
    if not is_edge_op(target, config):
        raise CompileError.at(node, "is not a core ATen operator and has no core decomposition; pass it in "
                                    "EdgeCompileConfig(_core_aten_ops_exception_list=[...]) if the runtime has a "
                                    "kernel for it, or register a custom op")


def _check_dtypes(node: Node) -> None:
    target = node.target
    if not isinstance(target, OpOverload) or target.namespace not in ("aten", "dim_order_ops"):
        return
    name = target._schema.name.split("::")[-1]
    vals = tensor_vals(node.meta.get("val"))
    for i, a in enumerate(node.args):
        if isinstance(a, Node):
            for v in tensor_vals(a.meta.get("val")):
                if (name, i) in ops.INDEX_ARGS:
                    if v.dtype not in ops.INDEX_DTYPES:
                        raise CompileError.at(node, f"index argument {i} has dtype {v.dtype}; the runtime kernel "
                                                    "takes int32 or int64 indices")
                else:
                    vals.append(v)
    for v in vals:
        problem = ops.dtype_problem(name, v.dtype)
        if problem is not None:
            raise CompileError.at(node, problem)


def _check_bounded(node: Node, range_constraints: dict) -> None:
    for v in tensor_vals(node.meta.get("val")):
        for d, s in enumerate(v.shape):
            if not isinstance(s, int) and upper_bound(s, range_constraints) is None:
                raise CompileError.at(node, f"output dimension {d} ({s}) depends on data and has no upper bound; "
                                            "bound it with torch._check(size <= N) so memory can be planned")


def verify_graph(gm: GraphModule, config: EdgeCompileConfig, range_constraints: dict) -> None:
    """Checks an edge graph before it goes on: ops in the edge dialect with consistent dtypes (when IR validity is
    checked) and every dynamic size bounded; a CompileError names the node."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if config._check_ir_validity:
            _check_op(node, config)
            _check_dtypes(node)
        _check_bounded(node, range_constraints)


def verify_outputs(gm: GraphModule, first_user_output: int) -> None:
    """Checks that every user output of a method is a tensor, as the runtime requires; a CompileError names the
    output."""
    out_node = gm.graph.output_node()
    outs = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else [out_node.args[0]]
    for i, o in enumerate(list(outs)[first_user_output:]):
        val = o.meta.get("val") if isinstance(o, Node) else o
        if not isinstance(val, torch.Tensor):
            what = type(val).__name__ if not isinstance(o, Node) else f"{type(val).__name__} value"
            raise CompileError.at(o, f"method output {i} is a {what}; only tensors can be returned") \
                if isinstance(o, Node) else CompileError(f"method output {i} is a {what} ({o!r}); only tensors can "
                                                         "be returned", op="output")
