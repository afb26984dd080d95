"""The quantized program's intermediates as etlab's runtime computes them, keyed by the node of
torchao's converted graph they belong to, for quantization_report(..., runtime=True).

The converted GraphModule is exported and compiled (to_edge -> to_executorch, with an ETRecord),
run once on the runtime with every intermediate output kept (ETDump debug buffer), and joined by
the Inspector's debug handles to the Edge nodes; each Edge node names, in its `from_node`
provenance, the converted graph's node it was made from. Nodes the runtime has no value for
(constants folded at compile time, placeholders) keep torch's value.
"""

from __future__ import annotations

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


def runtime_values(converted: GraphModule, inputs: tuple, *, workdir: str | Path | None = None
                   ) -> dict[str, Any]:
    """converted-graph node name -> the value etlab's runtime computed for it, on one run of the
    compiled program on `inputs`. workdir: where the .pte, ETDump and debug buffer go (default: a
    temporary directory, removed afterwards)."""
    from etlab.compiler import to_edge
    from etlab.etrecord import ETRecord
    from etlab.inspector import Inspector
    from etlab.runtime import DebugLevel, Runtime

    edge = to_edge(torch.export.export(converted, inputs), generate_etrecord=True)
    by_edge_name = {n.name: converted_name(n, converted) for n in edge.exported_program().graph.nodes}
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
        values: dict[str, Any] = {}
        for ops, value in zip(gaps["aot_ops"], gaps["runtime_intermediate_output"]):
            name = by_edge_name.get(ops[-1]) if ops else None
            if name is not None and isinstance(value, torch.Tensor):
                values[name] = value.clone()  # the debug buffer is a mapped file
    return values


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
