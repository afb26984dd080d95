"""ETRecord: the compile-time record the devtools join with a run's ETDump.

    from etlab.compiler import to_edge
    from etlab.etrecord import parse_etrecord

    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.get_etrecord().save("model.etrecord")
    record = parse_etrecord("model.etrecord")
    info = record.program_info()       # what the Inspector needs

API names mirror upstream ExecuTorch's `executorch.devtools.etrecord`. `parse_etrecord` reads both
etlab's files (zips of JSON plus one raw tensor blob) and upstream's (zips of torch.export JSON and
`torch.save` members); `record.save(path, format="upstream")` writes upstream's layout. Loading
never unpickles or evaluates anything from the file: upstream's torch.save members go through
etlab's own reader, which accepts only tensors, storages, plain containers and scalars; every
graph is checked as JSON (names, expressions, operators) before torch rebuilds it, and again
(operator allowlist) before the numeric gap replays it. A corrupt or malicious file raises
`etlab.FormatError` naming the file and the member.

An upstream edge program recorded before lowering (XNNPACK's) has no delegate calls; the nodes a
delegate took are marked `node.meta[DELEGATE_PARTITION_META] = (backend, instruction)`.

`record_graphs(path)` reads the recorded programs' graphs from their JSON, as torch.fx would hold them
after deserialization (`JsonProgram`: names, targets, tensor shapes, module stacks, debug handles),
without torch and without rebuilding a program: what drawing a graph needs.

`read_program_info(path)` gives what the Inspector needs (`parse_etrecord(path).program_info()`)
without importing torch for an etlab ETRecord; the names that need torch (`ETRecord`,
`parse_etrecord`, ...) are imported on first use, so `import etlab.etrecord` stays light.
"""

import importlib

from etlab.errors import FormatError
from etlab.etrecord._program_json import Delegate, JsonNode, JsonProgram, TensorMeta
from etlab.etrecord._program_json import Unsupported as UnsupportedGraph
from etlab.etrecord._program_json import op_name as target_op_name
from etlab.etrecord._quick import read_program_info
from etlab.etrecord._record_json import RecordGraphs, record_graphs
from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo

_LAZY = {  # name -> (module, attribute): modules that import torch
    "ETRecord": ("etlab.etrecord._etrecord", "ETRecord"),
    "generate_etrecord": ("etlab.etrecord._etrecord", "generate_etrecord"),
    "parse_etrecord": ("etlab.etrecord._parse", "parse_etrecord"),
    "DELEGATE_PARTITION_META": ("etlab.etrecord._info", "PARTITION_META"),
}

__all__ = [
    "DELEGATE_PARTITION_META", "DebugHandle", "Delegate", "DelegateInfo", "ETRecord", "FormatError", "JsonNode",
    "JsonProgram", "MethodInfo", "OpInfo", "ProgramInfo", "RecordGraphs", "TensorMeta", "UnsupportedGraph",
    "generate_etrecord", "parse_etrecord", "read_program_info", "record_graphs", "target_op_name",
]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
