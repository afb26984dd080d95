"""XNNPACK delegate calls of a `.pte` opened as layers holding the nodes they run.

A method's instruction graph shows a delegate call as one node. Its XNNPACK payload lists the
operators XNNPACK runs (in order, each with the debug handle of the Edge node it was lowered from)
and the values between them, so the call can open as a layer of those nodes from the `.pte` alone:
upstream's files as well as etlab's, with or without an ETRecord. The call node stays (it is what the
run's events time, and the overlays' values are keyed to it) as the layer's entry: it receives the
call's inputs and feeds the payload's first nodes; the nodes writing the payload's outputs feed what
reads the call's results. Payloads of other backends, or ones that do not decode, stay one node.
"""

from __future__ import annotations

from etlab.errors import FormatError
from etlab.schema.program import DelegateCall, PteFile
from etlab.schema.xnnpack import deserialize_xnnpack, node_kind
from etlab.visualizer import GraphGroup, GraphModel, GraphNode

XNNPACK = "XnnpackBackend"
NO_HANDLE = (0, 0xFFFF, 0xFFFFFFFF)  # what lowering writes on nodes it added (layout transposes)


def _value_ids(union) -> tuple[list[int], list[int]]:
    """(input value ids, output value ids) of an XNNPACK node's union table: its `*_id` fields."""
    ins, outs = [], []
    for name, v in vars(union).items():
        if name.endswith("_id") and isinstance(v, int):
            (outs if name.startswith("output") else ins).append(v)
    return ins, outs


def _tensor_dims(graph) -> dict[int, tuple[list[int], str]]:
    """Value id -> (dims, datatype name) of the payload's tensor values (quantized ones included)."""
    out = {}
    for xv in graph.xvalues or ():
        tv = getattr(xv.xvalue_union, "tensor_value", xv.xvalue_union)
        if hasattr(tv, "id_out") and hasattr(tv, "dims"):
            out[int(tv.id_out)] = ([int(d) for d in tv.dims or ()], str(getattr(tv, "datatype", "")))
    return out


def expand_xnnpack_calls(model: GraphModel, pte: PteFile, plan) -> GraphModel:
    """`model` (the instruction graph of `plan`, `etlab.jupyter.instruction_graph`) with every XNNPACK
    call a layer of its payload's nodes (see the module doc). Changes and returns `model`."""
    instructions = list(plan.chains[0].instructions or ()) if plan.chains else []
    delegates = list(plan.delegates or ())
    edges = set(model.edges)
    for call in [n for n in model.nodes if n.kind == "delegate" and n.handles]:
        step = call.handles[0]
        args = instructions[step].instr_args if 0 <= step < len(instructions) else None
        if not isinstance(args, DelegateCall) or not 0 <= args.delegate_index < len(delegates):
            continue
        delegate = delegates[args.delegate_index]
        if str(delegate.id) != XNNPACK:
            continue
        try:
            graph = deserialize_xnnpack(pte.delegate_bytes(delegate), what=f"{plan.name}: instruction {step}").graph
        except FormatError:
            continue  # drawn as one node, as before; the runtime and the Inspector say what is wrong
        xnodes = list(graph.xnodes or ())
        if not xnodes:
            continue
        gid = f"delegate:instruction_{step}"
        model.groups.append(GraphGroup(id=gid, label=f"{XNNPACK} \u00b7 instruction {step}", kind="delegate",
                                       parent=call.group, backend=XNNPACK))
        call.group = gid
        dims = _tensor_dims(graph)
        inputs, outputs = {int(i) for i in graph.input_ids or ()}, {int(i) for i in graph.output_ids or ()}
        producer: dict[int, int] = {}
        writers_of_outputs: list[int] = []
        for j, xn in enumerate(xnodes):
            ins, outs = _value_ids(xn.xnode_union)
            handle = int(xn.debug_handle or 0)
            node = GraphNode(id=len(model.nodes), name=f"{step}.{j}: {node_kind(xn)}", kind="op", op=node_kind(xn),
                             group=gid, handles=[] if handle in NO_HANDLE else [handle], backend=XNNPACK,
                             shapes=[dims[o][0] for o in outs if o in dims])
            model.nodes.append(node)
            for v in ins:
                if v in producer:
                    edges.add((producer[v], node.id))
                elif v in inputs:
                    edges.add((call.id, node.id))
            for v in outs:
                producer[v] = node.id
                if v in outputs:
                    writers_of_outputs.append(node.id)
        readers = [dst for src, dst in edges if src == call.id and model.nodes[dst].group != gid]
        for dst in readers:
            edges.discard((call.id, dst))
            for w in writers_of_outputs or [call.id]:
                edges.add((w, dst))
    model.edges = sorted(edges)
    return model
