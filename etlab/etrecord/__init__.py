"""ETRecord: the compile-time record the devtools join with a run's ETDump.

    from etlab.compiler import to_edge
    from etlab.etrecord import parse_etrecord

    et = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.get_etrecord().save("model.etrecord")
    record = parse_etrecord("model.etrecord")
    info = record.program_info()       # what the Inspector needs

API names mirror upstream ExecuTorch's `executorch.devtools.etrecord`. Files are zips of JSON plus
one raw tensor blob: loading one never unpickles or evaluates anything from it, and a corrupt or
malicious file raises `etlab.FormatError`.
"""

from etlab.errors import FormatError
from etlab.etrecord._etrecord import ETRecord, generate_etrecord
from etlab.etrecord._parse import parse_etrecord
from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo

__all__ = [
    "DebugHandle", "DelegateInfo", "ETRecord", "FormatError", "MethodInfo", "OpInfo", "ProgramInfo",
    "generate_etrecord", "parse_etrecord",
]
