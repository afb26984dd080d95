"""File access shared by every loader and writer: zero-copy reads, atomic writes."""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path

from etlab.errors import FormatError


def read_bytes(source, *, what: str | None = None) -> tuple[memoryview, str]:
    """bytes-like or path -> (read-only view, name for error messages). Paths are memory-mapped."""
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        return memoryview(source).cast("B"), what or f"<{len(source)} bytes>"
    path = Path(source)
    name = what or str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return memoryview(b""), name
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)), name
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{name}: is a directory, not a file") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path, data) -> Path:
    """Writes all of `data` to `path` or nothing: a temp file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would have.
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
