"""Reading a file of any of the four formats, chosen by its identifier (for `etlab info`)."""

from __future__ import annotations

from etlab.errors import FormatError
from etlab.schema._files import read_bytes
from etlab.schema.bundled_program import deserialize_bundled_program
from etlab.schema.etdump import deserialize_etdump
from etlab.schema.flat_tensor import deserialize_ptd
from etlab.schema.program import deserialize_pte


def load_file(source, *, what: str | None = None):
    """Reads any of the four formats, chosen by its identifier. Returns the parsed model.

    >>> import os, tempfile
    >>> from etlab.schema.program import ExecutionPlan, Program, serialize_pte
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = os.path.join(d, "model.pte")
    ...     with open(path, "wb") as f:
    ...         _ = f.write(serialize_pte(Program(execution_plan=[ExecutionPlan(name="forward")])))
    ...     type(load_file(path)).__name__
    'PteFile'
    """
    view, name = read_bytes(source, what=what)
    ident = bytes(view[4:8]) if len(view) >= 8 else b""
    readers = {b"ET12": deserialize_pte, b"FT01": deserialize_ptd, b"BP08": deserialize_bundled_program}
    if ident in readers:
        return readers[ident](view, what=name)
    if len(view) >= 12 and bytes(view[8:12]) == b"ED00":
        return deserialize_etdump(view, what=name)
    raise FormatError(f"{name}: not an ExecuTorch file (no ET12, FT01, BP08 or ED00 identifier)")
