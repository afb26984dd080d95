"""The fleet store on disk: Parquet, Hive-partitioned, readable by DuckDB, Spark or pyarrow alike.

    S/fleet.json                                        marks the directory as a fleet store
    S/events/program=<hash>/build=<name>/part-*.parquet one row per profile event (EVENT_SCHEMA)
    S/files/files-*.parquet                             the manifest: one row per source file seen

An ingest writes its event parts first and the manifest part naming them last, each atomically
(temp file + rename). A manifest row is the commit: event parts whose chunk has no manifest part
are leftovers of an interrupted ingest and are removed by the next one, so a resumed ingest
neither loses nor duplicates rows.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from etlab.errors import FormatError
from etlab.schema import write_atomic

STORE_FORMAT = {"format": "etlab-fleet", "version": 1}
MARKER = "fleet.json"
EVENTS_DIR = "events"
FILES_DIR = "files"
# Event parts carry their chunk id (Spark's are renamed to part-<chunk>-<n> when published).
_POOL_PART = re.compile(r"part-(?P<chunk>[0-9a-f]{32})(?:-[0-9]+)?\.parquet")


@dataclass
class FileRecord:
    """One manifest row: a source file, how it was tagged and what came of it."""

    file_id: int
    path: str
    size: int
    mtime_ns: int
    status: str            # "ok" or "bad"
    error: str | None
    events: int            # rows stored
    runs: int
    dropped: int           # profile events without a valid duration (not stored)
    not_profile: int       # debug/allocation events (no duration; not stored)
    program: str | None
    build: str | None
    method: str | None
    device: str | None
    device_class: str | None
    labels: str | None
    chunk: str


MANIFEST_SCHEMA = pa.schema([
    (f.name, pa.int64() if f.type in ("int", int) else pa.string()) for f in fields(FileRecord)
])


def init_store(store) -> Path:
    """Creates (or checks) a store directory; a non-empty directory that is not a store is refused."""
    root = Path(store)
    marker = root / MARKER
    if marker.exists():
        return check_store(root)
    if root.exists() and any(root.iterdir()):
        raise FormatError(f"{root}: not empty and not a fleet store (no {MARKER}); refusing to write into it")
    root.mkdir(parents=True, exist_ok=True)
    write_atomic(marker, json.dumps(STORE_FORMAT).encode())
    return root


def check_store(store) -> Path:
    """The store's root if `store` is a fleet store of a version we read; FormatError otherwise."""
    root = Path(store)
    marker = root / MARKER
    if not marker.is_file():
        raise FileNotFoundError(f"{root}: not a fleet store (no {MARKER}); create one with `etlab fleet ingest`")
    try:
        meta = json.loads(marker.read_bytes()[:4096].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{marker}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT["format"]:
        raise FormatError(f"{marker}: not an etlab fleet store marker")
    if meta.get("version") != STORE_FORMAT["version"]:
        raise FormatError(f"{marker}: store version {meta.get('version')!r}, "
                          f"this etlab reads {STORE_FORMAT['version']}")
    return root


def partition_dir(store: Path, program: str, build: str) -> Path:
    """The directory of one (program, build) partition; both values are checked safe by the tagger."""
    return store / EVENTS_DIR / f"program={program}" / f"build={build}"


def _table_bytes(table: pa.Table) -> bytes:
    """Parquet bytes; dictionary pages only for string columns (numbers compress better plain)."""
    sink = pa.BufferOutputStream()
    strings = [f.name for f in table.schema if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type)]
    pq.write_table(table, sink, compression="snappy", use_dictionary=strings)
    return sink.getvalue().to_pybytes()


def write_events_part(store: Path, program: str, build: str, chunk: str, table: pa.Table) -> Path:
    """One chunk's rows of one partition as `part-<chunk>.parquet`, atomically."""
    return write_atomic(partition_dir(store, program, build) / f"part-{chunk}.parquet", _table_bytes(table))


def write_manifest_part(store: Path, chunk: str, records: list[FileRecord]) -> Path:
    """Commits a chunk: its manifest rows as `files-<chunk>.parquet`, atomically."""
    table = pa.Table.from_pylist([asdict(r) for r in records], schema=MANIFEST_SCHEMA)
    return write_atomic(store / FILES_DIR / f"files-{chunk}.parquet", _table_bytes(table))


def drop_manifest_rows(store: Path, drop) -> int:
    """Rewrites (atomically, part by part) the manifest parts holding rows for which `drop(row)` is
    true, without those rows; a part left empty is removed. Returns how many rows went. Used to keep
    one row per bad file: the rows a newer attempt superseded."""
    dropped = 0
    for part in manifest_parts(store):
        try:
            rows = pq.read_table(part, schema=MANIFEST_SCHEMA).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise FormatError(f"{part}: manifest part unreadable ({e})") from None
        keep = [r for r in rows if not drop(r)]
        if len(keep) == len(rows):
            continue
        dropped += len(rows) - len(keep)
        if keep:
            write_atomic(part, _table_bytes(pa.Table.from_pylist(keep, schema=MANIFEST_SCHEMA)))
        else:
            part.unlink()
    return dropped


def manifest_parts(store: Path) -> list[Path]:
    """The store's file-manifest Parquet parts, in order."""
    return sorted((store / FILES_DIR).glob("files-*.parquet"))


def event_parts(store: Path) -> list[Path]:
    """The store's event Parquet parts (partitioned by program and build), in order."""
    return sorted((store / EVENTS_DIR).glob("program=*/build=*/*.parquet"))


def read_manifest(store) -> pa.Table:
    """Every manifest row of the store (empty table if nothing was ingested yet)."""
    root = check_store(store)
    parts = manifest_parts(root)
    if not parts:
        return MANIFEST_SCHEMA.empty_table()
    try:
        return pa.concat_tables([pq.read_table(p, schema=MANIFEST_SCHEMA) for p in parts])
    except (pa.ArrowException, OSError) as e:
        raise FormatError(f"{root}: manifest part unreadable ({e})") from None


def remove_orphans(store: Path, committed_chunks: set[str]) -> int:
    """Deletes event parts of uncommitted chunks and stray temp files; returns how many went."""
    removed = 0
    for part in (store / EVENTS_DIR).glob("program=*/build=*/*"):
        m = _POOL_PART.fullmatch(part.name)
        stray_tmp = part.name.startswith(".") and part.name.endswith(".tmp")
        if stray_tmp or (m and m.group("chunk") not in committed_chunks):
            part.unlink()
            removed += 1
    for tmp in (store / FILES_DIR).glob(".*.tmp"):
        tmp.unlink()
        removed += 1
    return removed
