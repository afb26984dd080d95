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
"""

from etlab.errors import FormatError
from etlab.etrecord._etrecord import ETRecord, generate_etrecord
from etlab.etrecord._info import PARTITION_META as DELEGATE_PARTITION_META
from etlab.etrecord._parse import parse_etrecord
from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo

__all__ = [
    "DELEGATE_PARTITION_META", "DebugHandle", "DelegateInfo", "ETRecord", "FormatError", "MethodInfo", "OpInfo",
    "ProgramInfo", "generate_etrecord", "parse_etrecord",
]
