"""Reading ETDumps fast: columnar events and intermediate tensors from the debug buffer.

- `read_etdump(path_or_bytes)` -> `ETDumpColumns`: every event field as a numpy array, verified
  as it is read (bad offsets raise `etlab.FormatError` naming the file). `.to_model()` gives the
  same content as `etlab.schema.deserialize_etdump`.
- `load_debug_buffer(path_or_bytes, etdump=columns)` and `debug_value(columns, debug_row, buffer)`:
  recorded tensors as zero-copy torch views, bounds-checked against the buffer; with the ETDump, the
  buffer is checked to be the one written with it (`check_pair`: etlab records its SHA-256).
"""

from etlab.etdump._debug_buffer import (
    DebugBuffer,
    check_pair,
    debug_rows_of,
    debug_value,
    load_debug_buffer,
    tensor_from_debug_buffer,
)
from etlab.etdump._reader import (
    ETDumpColumns,
    EventKind,
    RunInfo,
    TensorColumns,
    ValueColumns,
    read_etdump,
)

__all__ = [
    "DebugBuffer", "ETDumpColumns", "EventKind", "RunInfo", "TensorColumns", "ValueColumns", "check_pair",
    "debug_rows_of", "debug_value", "load_debug_buffer", "read_etdump", "tensor_from_debug_buffer",
]
