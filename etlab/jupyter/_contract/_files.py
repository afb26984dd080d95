"""The contract's pieces about the files themselves: the version a view was read from (the reload check), the
stat and error replies, and the artifacts browser's listing."""

from __future__ import annotations

from typing import Literal, TypedDict


class Versioned(TypedDict):
    """The file a view was read from, relative to the server root, and its version (the reload check)."""

    path: str
    size: int
    mtime_ns: str  # nanoseconds as text: beyond a JavaScript number's exact range


class Stat(Versioned):
    """GET /etlab/api/stat."""


class ErrorReply(TypedDict):
    """What every endpoint answers instead when the file, path or request is bad (with a 4xx/5xx status)."""

    error: str


class ArtifactFile(TypedDict):
    """A file the artifacts browser lists: its kind, size, time, the program it belongs to, and an error when it does
    not read."""

    path: str
    kind: Literal["pte", "etdp", "etrecord", "bpte", "ptd"]
    size: int
    mtime: float
    program: str | None
    error: str | None


class ArtifactGroup(TypedDict):
    """The artifacts of one program (a .pte with its runs, records and bundles), or of none."""

    program: str | None
    files: list[ArtifactFile]


class Artifacts(TypedDict):
    """GET /etlab/api/artifacts: the files under a folder grouped by program hash (runs join theirs)."""

    folder: str
    groups: list[ArtifactGroup]
    truncated: bool
