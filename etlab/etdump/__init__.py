"""Reading ETDumps fast: columnar events and intermediate tensors from the debug buffer.

- `read_etdump(path_or_bytes)` -> `ETDumpColumns`: every event field as a numpy array, verified
  as it is read (bad offsets raise `etlab.FormatError` naming the file). `.to_model()` gives the
  same content as `etlab.schema.deserialize_etdump`.
- `load_debug_buffer(path_or_bytes)` and `debug_value(columns, debug_row, buffer)`: recorded
  tensors as zero-copy torch views, bounds-checked against the buffer.
"""

from etlab.etdump._debug_buffer import (
    DebugBuffer,
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
    "DebugBuffer", "ETDumpColumns", "EventKind", "RunInfo", "TensorColumns", "ValueColumns", "debug_rows_of",
    "debug_value", "load_debug_buffer", "read_etdump", "tensor_from_debug_buffer",
]
