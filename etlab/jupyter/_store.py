"""The server's view of the files: paths confined to the root directory, each artifact read once
per version on disk (path, size, mtime), and the listing of a folder's artifacts grouped by program.

Every request path is relative to the server's root; anything that resolves outside it (`..`,
absolute paths, symlinks leading out) is refused before a byte is read.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from etlab.errors import Error, FormatError
from etlab.facts.display import json_ready

ARTIFACT_KINDS = {".pte": "pte", ".etdp": "etdp", ".etrecord": "etrecord", ".bpte": "bpte"}
MAX_LISTED = 500  # artifacts listed per folder (a huge tree must not stall the server)
MAX_DEPTH = 3


class PathError(Error, ValueError):
    """A request path that is missing, outside the root or of the wrong kind (HTTP 400/404)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


T = TypeVar("T")

clean_json = json_ready  # the JSON the viewers receive: non-finite floats as None, tuples as lists


MAX_PATH_CHARS = 4096  # PATH_MAX: longer request paths are refused before the file system sees them


def confine(root: str | os.PathLike, rel: str, *, kinds: tuple[str, ...] | None = None,
            directory: bool = False) -> Path:
    """The real path of `rel` under `root`, or PathError: outside the root, missing, or not of `kinds`."""
    if not isinstance(rel, str) or "\x00" in rel:
        raise PathError("path: must be a string without NUL bytes")
    if rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise PathError(f"{rel}: absolute paths are refused; give a path relative to the server's root")
    if len(rel) > MAX_PATH_CHARS:
        raise PathError(f"{rel[:80]}...: a path of {len(rel)} characters (at most {MAX_PATH_CHARS})")
    base = Path(os.path.realpath(root))
    try:
        target = Path(os.path.realpath(base / rel))
        if target != base and base not in target.parents:
            raise PathError(f"{rel}: outside the server's root directory", 403)
        if directory:
            if not target.is_dir():
                raise PathError(f"{rel or '.'}: no such folder", 404)
            return target
        if not target.is_file():
            raise PathError(f"{rel}: no such file", 404)
    except OSError as e:  # a name too long for the file system, a loop of links: said without the root's path
        raise PathError(f"{rel}: not a usable path ({e.strerror or type(e).__name__})") from None
    if kinds is not None and artifact_kind(target) not in kinds:
        raise PathError(f"{rel}: expected a {' or '.join('.' + k for k in kinds)} file")
    return target


def debug_buffer_beside(root: str | os.PathLike, run: Path) -> Path | None:
    """The debug buffer a run was written with, by the runtime's convention `<run>.bin` beside it
    (run.etdp + run.bin), when it exists inside the root; None otherwise. Whether it really is this
    run's buffer is the Inspector's check (the ETDump records the buffer's size and digest)."""
    candidate = Path(os.path.realpath(run.with_suffix(".bin")))
    base = Path(os.path.realpath(root))
    return candidate if base in candidate.parents and candidate.is_file() else None


def artifact_kind(path: Path | str) -> str | None:
    """'pte' / 'etdp' / 'etrecord' / 'bpte' by file name, None for anything else."""
    return ARTIFACT_KINDS.get(Path(path).suffix.lower())


def file_version(path: Path) -> tuple[int, int]:
    """(size, mtime in ns): a change on disk changes it (what the viewer polls to offer a reload)."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns


class Cache:
    """A small LRU of values computed from files, keyed by the files' versions; thread-safe."""

    def __init__(self, size: int = 32):
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, compute: Callable[[], T]) -> T:
        """The cached value for `key`, else `compute()`'s (computed outside the lock, so a slow file does not block
        other requests; the oldest entry goes when full)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


@dataclass
class Artifact:
    """One listed file: its path relative to the root, kind, size, program hash (None when unreadable or a run)."""

    path: str
    kind: str
    size: int
    mtime: float
    program: str | None = None
    error: str | None = None


def find_artifacts(root: Path, folder: Path) -> list[tuple[Path, str]]:
    """ExecuTorch artifacts under `folder` (hidden folders skipped, at most MAX_DEPTH deep, MAX_LISTED files)."""
    found = []
    start_depth = len(folder.parts)
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        depth = len(Path(dirpath).parts) - start_depth
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "node_modules"
                             and depth < MAX_DEPTH)
        for name in sorted(filenames):
            kind = artifact_kind(name)
            if kind is None:
                continue
            path = Path(dirpath) / name
            real = Path(os.path.realpath(path))
            if root != real and root not in real.parents:
                continue  # a symlink out of the root
            found.append((real, kind))
            if len(found) >= MAX_LISTED:
                return found
    return found


def describe_error(e: BaseException) -> str:
    """The message a viewer shows for a file that cannot be read."""
    if isinstance(e, FormatError):
        return str(e)
    return f"{type(e).__name__}: {e}"
