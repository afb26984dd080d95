"""From recorded graphs and debug maps to the Inspector's `MethodInfo`; the AOT intermediate outputs.

Ops: every call_function node with a debug handle (getitem excepted: it only unpacks results), in
the method's graph, its control-flow branches and the original graphs of its lowered modules.

AOT intermediate outputs: the edge graph run by a torch.fx Interpreter on the recorded inputs,
each node's result kept under `(debug handle,)`. torch.cond branches and lowered modules' original
graphs are run by the same interpreter, so the nodes inside them are captured too; a delegate
call's results are also kept under the (deduplicated) handles of all its nodes, which is how the
runtime reports a DELEGATE_CALL's outputs.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule, Interpreter, Node
from torch.utils import _pytree as pytree

from etlab.errors import FormatError
from etlab.etrecord._graph_check import check_replay_value, check_replayable
from etlab.etrecord._maps import handle_list as _handle_list
from etlab.etrecord._maps import (  # noqa: F401 (the maps' half lives in _maps, torch-free; _etrecord uses them here)
    method_info,
    ops_from_json,
    ops_to_json,
    unique_handles,
)
from etlab.facts.fx import graph_modules, op_name
from etlab.facts.lowered import (
    DELEGATE_PARTITION_META,
    LoweredBackendModule,
    executorch_call_delegate,
    lowered_modules,
)
from etlab.facts.program_info import DebugHandle, OpInfo
from etlab.facts.source import module_hierarchy


def collect_ops(ep: ExportedProgram) -> dict[int, list[OpInfo]]:
    """Debug handle -> the nodes carrying it, across branches and lowered modules."""
    ops: dict[int, list[OpInfo]] = {}
    for program in _programs_under(ep):
        for gm in graph_modules(program.graph_module).values():
            for node in gm.graph.nodes:
                handle = node.meta.get("debug_handle")
                if node.op != "call_function" or handle is None or node.target is operator.getitem:
                    continue
                info = OpInfo(node.name, op_name(node.target), node.meta.get("stack_trace"),
                              module_hierarchy(node.meta.get("nn_module_stack")))
                for h in _handle_list(handle):
                    ops.setdefault(h, []).append(info)
    return ops


def _programs_under(ep: ExportedProgram) -> Iterable[ExportedProgram]:
    yield ep
    for _, _, lowered in lowered_modules(ep.graph_module):
        yield from _programs_under(lowered.original_module)


PARTITION_META = DELEGATE_PARTITION_META  # node.meta key: (backend name, delegate-call instruction id)


def mark_partitions(ep: ExportedProgram, debug_handle_map: dict | None, delegate_map: dict | None) -> None:
    """Marks, on an edge graph recorded before lowering (upstream's XNNPACK ETRecords hold that one,
    without delegate calls), each node a delegate call took: `node.meta[PARTITION_META] = (backend,
    instruction)`, from the delegate map (which instructions call which backend) and the debug-handle
    map (the handles of the nodes each instruction runs). A graph that has lowered modules shows its
    partitions itself and is left alone."""
    if not delegate_map or lowered_modules(ep.graph_module):
        return
    owner: dict[int, tuple[str, int]] = {}
    for instruction, entry in sorted(delegate_map.items()):
        for h in _handle_list((debug_handle_map or {}).get(instruction, [])):
            owner.setdefault(h, (str(entry.get("name")), int(instruction)))
    for node in ep.graph.nodes:  # in order: a getitem follows the node it unpacks, and goes where it went
        handle = node.meta.get("debug_handle")
        if node.op != "call_function":
            continue
        if handle is None and node.target is operator.getitem and isinstance(node.args[0], Node):
            if PARTITION_META in node.args[0].meta:
                node.meta[PARTITION_META] = node.args[0].meta[PARTITION_META]
            continue
        for h in _handle_list(handle) if handle is not None else ():
            if h in owner:
                node.meta[PARTITION_META] = owner[h]
                break


# -- AOT intermediate outputs ---------------------------------------------------------------------------


def _snapshot(value):
    # Edge graphs are functional (no node writes another's output), so results need no copy.
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return [_snapshot(v) for v in value]
    return value


class _Capture(Interpreter):
    def __init__(self, gm: GraphModule, captured: dict):
        super().__init__(gm, garbage_collect_values=True)
        self.captured = captured

    def run_node(self, n: Node):
        if n.op == "call_function" and n.target is torch.ops.higher_order.cond:
            args, _ = self.fetch_args_kwargs_from_env(n)
            pred, true_gm, false_gm, operands = args
            branch = true_gm if bool(pred) else false_gm
            result = _Capture(branch, self.captured).run(*operands)
        elif n.op == "call_function" and n.target is executorch_call_delegate:
            args, _ = self.fetch_args_kwargs_from_env(n)
            lowered: LoweredBackendModule = args[0]
            result = tuple(run_program(lowered.original_module, list(args[1:]), {}, self.captured))
            inner = [m.meta["debug_handle"] for m in lowered.original_module.graph.nodes
                     if m.op == "call_function" and m.meta.get("debug_handle") is not None]
            if inner:
                key = unique_handles([h for handle in inner for h in _handle_list(handle)])
                self.captured[key] = _snapshot(result[0] if len(result) == 1 else list(result))
            return result
        else:
            result = super().run_node(n)
        handle = n.meta.get("debug_handle")
        if n.op == "call_function" and handle is not None and n.target is not operator.getitem:
            self.captured[unique_handles(handle)] = _snapshot(result)
        return result


def check_program_replayable(ep: ExportedProgram, where: str = "recorded graph") -> None:
    """FormatError unless every graph replay of `ep` would run (its own, its cond branches', its
    lowered modules' original graphs) calls only pure allowlisted operators on dense tensors of
    supported dtypes, weights included. Runs before any node does."""
    for index, program in enumerate(_programs_under(ep)):
        at = where if index == 0 else f"{where} (lowered module {index})"
        check_replayable(program.graph_module, at, extra_targets=(executorch_call_delegate,))
        for name, t in [*program.state_dict.items(), *program.constants.items()]:
            check_replay_value(t, f"{at}: weight {name!r}")


def run_program(ep: ExportedProgram, args, kwargs, captured: dict) -> list:
    """Runs a program's graph on user inputs; returns its user outputs, filling `captured`.

    Callers check the program first (`check_program_replayable`): the graph may come from a file."""
    flat = iter(pytree.tree_flatten((tuple(args), dict(kwargs or {})))[0])
    inputs = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            try:
                inputs.append(next(flat))
            except StopIteration:
                raise ValueError("fewer inputs than the recorded program takes") from None
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in ep.state_dict:
            inputs.append(ep.state_dict[spec.target])
        else:
            inputs.append(ep.constants[spec.target])
    with torch.no_grad():
        outs = _Capture(ep.graph_module, captured).run(*inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    return [o for o, s in zip(outs, ep.graph_signature.output_specs) if s.kind == OutputKind.USER_OUTPUT]


def intermediate_outputs(ep: ExportedProgram, inputs) -> dict[DebugHandle, object]:
    """{(debug handle, ...): output} of every recorded node when `ep` runs on `inputs`.

    `inputs`: a list/tuple of positional inputs, or an (args, kwargs) pair as in `ep.example_inputs`."""
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], tuple) and isinstance(inputs[1], dict):
        args, kwargs = inputs
    else:
        args, kwargs = tuple(inputs), {}
    check_program_replayable(ep)
    for k, value in enumerate(pytree.tree_flatten((tuple(args), dict(kwargs or {})))[0]):
        check_replay_value(value, f"recorded graph: input {k}")
    captured: dict[DebugHandle, object] = {}
    try:
        run_program(ep, args, kwargs, captured)
    except (RuntimeError, IndexError, ValueError, TypeError) as e:  # a graph from a file that torch refuses
        raise FormatError(f"recorded graph: replaying it on the recorded inputs failed: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    return captured
