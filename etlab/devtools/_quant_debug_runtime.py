"""The quantized program's intermediates as etlab's runtime computes them, keyed by the node of
torchao's converted graph they belong to, for quantization_report(..., runtime=True).

The converted GraphModule is exported and compiled (to_edge -> to_executorch, with an ETRecord),
run once on the runtime with every intermediate output kept (ETDump debug buffer), and joined by
the Inspector's debug handles to the Edge nodes; each Edge node names, in its `from_node`
provenance, the converted graph's node it was made from. Nodes the runtime has no value for
(constants folded at compile time, placeholders) keep torch's value.
"""

from __future__ import annotations

import operator
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule, Node


def converted_name(edge_node: Node, converted: GraphModule) -> str | None:
    """The name of the node of `converted` this Edge node was made from (its provenance entry
    in that graph), or None."""
    sources = edge_node.meta.get("from_node") or []
    src = sources[-1] if sources else None
    gid = id(converted.graph)
    while src is not None:
        if src.graph_id == gid:
            return src.name
        src = src.from_node[-1] if src.from_node else None
    return None


def runtime_values(converted: GraphModule, inputs: tuple, *, workdir: str | Path | None = None,
                   like: dict[str, Any] | None = None) -> dict[str, Any]:
    """converted-graph node name -> the value etlab's runtime computed for it, on one run of the
    compiled program on `inputs`. workdir: where the .pte, ETDump and debug buffer go (default: a
    temporary directory, removed afterwards). A runtime value is kept only where it can stand for the
    node's value: a tensor of the shape and dtype of the node's value in `like` (torch's run of
    `converted`), else of its traced value (meta 'val') when it has one."""
    from etlab.compiler import to_edge
    from etlab.etrecord import ETRecord
    from etlab.inspector import Inspector
    from etlab.runtime import DebugLevel, Runtime

    edge = to_edge(torch.export.export(converted, inputs), generate_etrecord=True)
    producers = value_producers(edge.exported_program().graph, converted)
    et = edge.to_executorch()
    record = ETRecord.from_sources(et.get_etrecord(), representative_inputs=list(inputs))
    with tempfile.TemporaryDirectory(prefix="etlab-qdebug-") as tmp:
        out = Path(workdir) if workdir is not None else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        # every intermediate kept; the runtime sizes the debug buffer from the method's plan
        program = Runtime.get().load_program(et.buffer, enable_etdump=True,
                                             etdump_debug_level=DebugLevel.INTERMEDIATE_OUTPUTS)
        program.load_method("forward").execute(list(inputs))
        program.write_etdump_result_to_file(out / "run.etdp", out / "run.bin")
        gaps = Inspector(etdump_path=out / "run.etdp", etrecord=record,
                         debug_buffer_path=out / "run.bin").calculate_numeric_gap("MSE")
        logged = {ops[-1]: value for ops, value in zip(gaps["aot_ops"], gaps["runtime_intermediate_output"])
                  if ops and isinstance(value, torch.Tensor)}
        values: dict[str, Any] = {}
        for name, edge_name in producers.items():
            value = logged.get(edge_name)
            reference = like.get(name) if like is not None else converted_value(converted, name)
            if value is not None and _fits(reference, value, known=like is not None):
                values[name] = value.clone()  # the debug buffer is a mapped file
    return values


def converted_value(converted: GraphModule, name: str):
    """The traced value (meta 'val') of the converted graph's node `name`, or None."""
    node = next((n for n in converted.graph.nodes if n.name == name), None)
    return node.meta.get("val") if node is not None else None


def _fits(reference, value: torch.Tensor, *, known: bool) -> bool:
    """Whether a runtime value can stand for a node whose value is `reference`: one tensor of its shape and dtype.
    An unknown reference (`known` False: a node convert_pt2e inserted has no traced value) does not refuse it."""
    if reference is None and not known:
        return True
    return isinstance(reference, torch.Tensor) and tuple(reference.shape) == tuple(value.shape) \
        and reference.dtype == value.dtype


def value_producers(edge_graph: torch.fx.Graph, converted: GraphModule) -> dict[str, str]:
    """converted-graph node name -> the Edge node whose output is that node's value.

    Edge decomposes one converted op into several (unbind -> slice + squeeze per output), all with
    the same provenance: the node's value is the one whose output leaves that group (used by another
    op's nodes or by the program's output). A single such node is the value of a one-output op; a
    multi-output op (unbind, split) has one per output, each given to the `getitem` of the converted
    graph whose users consume it. What cannot be told apart keeps torch's value (no entry)."""
    origin = {n.name: converted_name(n, converted) for n in edge_graph.nodes}
    leaving: dict[str, list[Node]] = {}
    for n in edge_graph.nodes:
        name = origin[n.name]
        if name is not None and any(u.op == "output" or origin[u.name] != name for u in n.users):
            leaving.setdefault(name, []).append(n)
    conv_nodes = {n.name: n for n in converted.graph.nodes}
    producers: dict[str, str] = {}
    for name, nodes in leaving.items():
        node = conv_nodes.get(name)
        if node is None:
            continue
        getitems = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem]
        if not getitems:
            if len(nodes) == 1:
                producers[name] = nodes[0].name
            continue
        # a multi-output op: each leaving Edge node belongs to the getitem whose consumers use it
        for n in nodes:
            consumers = {origin[u.name] for u in n.users if u.op != "output"}
            owners = [g for g in getitems if consumers and consumers <= {u.name for u in g.users}]
            if len(owners) == 1 and owners[0].name not in producers:
                producers[owners[0].name] = n.name
    return producers


def shipped_method(converted: GraphModule, inputs: tuple, backend: str | None, program=None, *,
                   threads: int | None = 1):
    """(the loaded `forward` of the program that ships, what it is): `program` when given (a .pte path,
    its bytes, or an ExecutorchProgramManager), else `converted` compiled for `backend`. Kernels run on
    `threads` intra-op threads (1: upstream's portable default)."""
    from etlab.runtime import Runtime

    if program is None:
        from etlab.devtools._amp_runtime import compile_program

        if backend not in ("xnnpack", "portable"):
            raise ValueError(f"backend must be 'xnnpack' or 'portable', got {backend!r}")
        program, what = compile_program(converted, tuple(inputs), backend).buffer, f"the {backend} program"
    elif hasattr(program, "buffer"):
        program, what = program.buffer, "the given program"
    elif isinstance(program, (str, Path)):
        what = str(program)
        if not Path(program).is_file():
            raise FileNotFoundError(f"program {program}: no such file")
    elif isinstance(program, (bytes, bytearray, memoryview)):
        what = "the given program"
    else:
        raise TypeError(f"program must be a .pte path, its bytes or an ExecutorchProgramManager, "
                        f"got {type(program).__name__}")
    loaded = Runtime.get().load_program(program, threads=threads)
    if "forward" not in loaded.method_names:
        raise ValueError(f"{what}: no method 'forward'; methods are {sorted(loaded.method_names)}")
    return loaded.load_method("forward"), what
