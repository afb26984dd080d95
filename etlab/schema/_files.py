"""File access shared by every loader and writer: reads that cannot crash the process, atomic writes.

A memory-mapped file that another process truncates makes every later read of the lost pages
raise SIGBUS, which kills Python. Reading each file into memory would make that impossible but
costs a copy of every large weight file; so the design is split by size:
- files up to SMALL_FILE_BYTES (64 MiB) are read into memory: nothing can take their bytes away;
- larger files are memory-mapped (zero-copy: weights stay views of the page cache) by a
  `GuardedMap`, which remembers the size it mapped and keeps its own descriptor. `check_intact`
  compares that size with the file's current size (one fstat) and raises FormatError if the
  file shrank. Readers call it where mapped bytes are handed out: the runtime when a method
  loads and before every execute, the debug-buffer reader before each tensor.
A file truncated while a single call is reading it can still fault; that window is one call long,
and files under the threshold have none.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path

from etlab.errors import FormatError

SMALL_FILE_BYTES = 64 << 20


class GuardedMap(mmap.mmap):
    """A read-only (or copy-on-write) map of a whole file that can tell whether the file shrank."""

    def __new__(cls, fileno: int, name: str, size: int, *, copy_on_write: bool = False):
        self = super().__new__(cls, fileno, size, access=mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ)
        self.name = name
        self.mapped_size = size
        self.fd = os.dup(fileno)  # the file as mapped, even if its path is replaced
        return self

    def check_intact(self) -> None:
        """Raises FormatError if the mapped file is now shorter than when it was mapped."""
        try:
            now = os.fstat(self.fd).st_size
        except OSError as e:
            raise FormatError(f"{self.name}: cannot check the memory-mapped file ({e})") from None
        if now < self.mapped_size:
            raise FormatError(f"{self.name}: the file shrank from {self.mapped_size} to {now} bytes while it was "
                              "in use (it is memory-mapped); load it again")

    def __del__(self):
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)


def is_mapped(view) -> bool:
    """Is `view` a map of a file (so worth `check_intact` at each use)?"""
    return isinstance(view.obj if isinstance(view, memoryview) else view, GuardedMap)


def check_intact(view) -> None:
    """FormatError if `view` (from read_bytes / map_file) is a map of a file that has since shrunk;
    a no-op for in-memory bytes. Cheap (one fstat): call it where mapped bytes are handed out."""
    obj = view.obj if isinstance(view, memoryview) else view
    if isinstance(obj, GuardedMap):
        obj.check_intact()


def map_file(path, *, what: str | None = None, copy_on_write: bool = False,
             small_file_bytes: int | None = None) -> tuple[memoryview, str]:
    """A file's bytes: in memory up to SMALL_FILE_BYTES (or the smaller `small_file_bytes`), else a
    GuardedMap (see the module notes).

    `copy_on_write`: the view is writable and writes never reach the file. A caller that touches
    only parts of a big file (a debug buffer: the ETDump's tensors are a few ranges of it) maps it
    from a smaller size on, and checks `check_intact` where it hands bytes out."""
    path = Path(path)
    name = what or str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            limit = SMALL_FILE_BYTES if small_file_bytes is None else min(small_file_bytes, SMALL_FILE_BYTES)
            if size <= limit:
                if not copy_on_write:
                    return memoryview(f.read()), name
                data = bytearray(size)  # read straight into the writable copy (one copy, not two)
                got = f.readinto(data)
                return memoryview(data)[:got], name
            return memoryview(GuardedMap(f.fileno(), name, size, copy_on_write=copy_on_write)), name
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{name}: is a directory, not a file") from None


def read_bytes(source, *, what: str | None = None) -> tuple[memoryview, str]:
    """bytes-like or path -> (read-only view, name for error messages); paths go through map_file."""
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        return memoryview(source).cast("B"), what or f"<{len(source)} bytes>"
    return map_file(source, what=what)


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
