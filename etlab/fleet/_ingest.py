"""Ingest: a tree (or list) of .etdp files -> the Parquet fleet store, in parallel and resumable.

The driver walks the sources, tags each file (defaults < path pattern < sidecar JSON; a program
none of them names is inferred, etlab.fleet._identity; build defaults to "unknown"), leaves out
files the manifest already holds (same path, size and mtime), and hands chunks of files to a
process pool. A worker reads its files with the columnar `read_etdump`, writes one Parquet part
per (program, build) partition and returns the manifest rows; the driver commits each chunk by
writing its manifest part. A file that cannot be read or tagged is a "bad" manifest row with the
reason: it is counted and reported, never stops the ingest, and is tried again next time. Ingest
is idempotent: a file still bad for the same reason adds no row, and a new attempt's row replaces
the file's earlier bad rows, so the manifest keeps one row per file version.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import stat
import time
import uuid
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

from etlab.errors import FormatError
from etlab.fleet import _store
from etlab.fleet._events import FileEvents, events_table, file_events
from etlab.fleet._identity import FROM_STRUCTURE, PROGRAM_FROM, program_beside, structure_fingerprint
from etlab.fleet._store import FileRecord
from etlab.fleet._tags import UNKNOWN_BUILD, FileTags, PathPattern, read_sidecar, sidecar_path

ETDUMP_SUFFIX = ".etdp"


@dataclass
class IngestItem:
    """One source file as planned by the driver: where it is, its identity and its tags (or why not)."""

    path: str
    size: int
    mtime_ns: int
    file_id: int
    tags: FileTags | None
    error: str | None = None


@dataclass
class IngestSummary:
    """What an ingest did; `bad` lists (path, reason) for every file skipped as unreadable or untagged."""

    store: str
    files_found: int = 0
    files_already_stored: int = 0
    files_ingested: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)
    events: int = 0
    runs: int = 0
    dropped_events: int = 0
    not_profile_events: int = 0
    leftovers_removed: int = 0
    seconds: float = 0.0
    program_from: dict[str, int] = field(default_factory=dict)  # where inferred programs came from: files
    unknown_build: int = 0  # files stored as build=unknown (no tag named a build)

    def add(self, records: list[FileRecord]) -> None:
        """Counts one committed chunk's manifest rows."""
        for r in records:
            if r.status == "ok":
                source = json.loads(r.labels or "{}").get(PROGRAM_FROM)
                if source is not None:
                    self.program_from[source] = self.program_from.get(source, 0) + 1
                self.unknown_build += r.build == UNKNOWN_BUILD
                self.files_ingested += 1
                self.events += r.events
                self.runs += r.runs
                self.dropped_events += r.dropped
                self.not_profile_events += r.not_profile
            else:
                self.bad.append((r.path, r.error or ""))

    @property
    def files_bad(self) -> int:
        """How many files were skipped (see `bad` for each one's reason)."""
        return len(self.bad)

    def format(self, max_bad: int = 20) -> str:
        """The human summary printed by `etlab fleet ingest`."""
        lines = [
            f"store {self.store}:",
            f"  {self.files_found} file(s) found, {self.files_ingested} ingested, "
            f"{self.files_already_stored} already stored (not read again), {self.files_bad} bad (skipped)",
            f"  {self.events} events from {self.runs} run block(s) in {self.seconds:.1f} s",
            f"  {self.dropped_events} profile event(s) dropped (end before start), "
            f"{self.not_profile_events} debug/allocation event(s) not stored",
        ]
        if self.program_from:
            lines.append(f"  no 'program' tag: program inferred for {sum(self.program_from.values())} file(s) "
                         f"(label {PROGRAM_FROM}; tag the runs to name it):")
            lines += [f"    {n} from {src}" for src, n in sorted(self.program_from.items(), key=lambda kv: -kv[1])]
        if self.unknown_build:
            lines.append(f"  no 'build' tag: {self.unknown_build} file(s) stored as build={UNKNOWN_BUILD}")
        if self.leftovers_removed:
            lines.append(f"  {self.leftovers_removed} leftover part(s) of an interrupted ingest removed")
        for path, reason in self.bad[:max_bad]:
            lines.append(f"  bad: {path}: {reason}")
        if self.files_bad > max_bad:
            lines.append(f"  ... and {self.files_bad - max_bad} more bad file(s) (see the store's manifest)")
        return "\n".join(lines)


def _is_regular(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def discover(sources) -> list[tuple[Path, Path]]:
    """(file, root) for every .etdp under the sources (directories walked without following
    links; files taken as given), sorted; the root is what path patterns are matched against."""
    found: dict[str, tuple[Path, Path]] = {}
    for src in [sources] if isinstance(sources, (str, os.PathLike)) else sources:
        src = Path(src)
        if src.is_dir():
            for dirpath, dirnames, filenames in os.walk(src):
                dirnames.sort()
                for name in filenames:
                    if name.endswith(ETDUMP_SUFFIX):
                        p = Path(dirpath) / name
                        found.setdefault(os.path.abspath(p), (p, src))
        elif src.exists():
            found.setdefault(os.path.abspath(src), (src, src.parent))
        else:
            raise FileNotFoundError(f"{src}: no such file or directory")
    return [found[k] for k in sorted(found)]


def file_identity(path: str, size: int, mtime_ns: int) -> int:
    """A stable 63-bit id of one version of one file (path, size, mtime): the store's file_id."""
    digest = hashlib.blake2b(f"{path}\0{size}\0{mtime_ns}".encode("utf-8", "surrogateescape"), digest_size=8)
    return int.from_bytes(digest.digest(), "little") & ((1 << 63) - 1)


def _tag(path: Path, root: Path, defaults: FileTags, pattern: PathPattern | None, hashes: dict) -> FileTags:
    """defaults < path pattern < sidecar; a program none of them names is inferred (etlab.fleet._identity):
    from the .pte/.etrecord beside the run now, else from the run's structure by the worker that reads it."""
    tags = defaults
    if pattern is not None:
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
        captured = pattern.match(rel)
        if captured is None:
            raise FormatError(f"path does not match the pattern {pattern.text!r}")
        tags = tags.merged(captured)
    sidecar = sidecar_path(path)
    if sidecar is not None:
        tags = tags.merged(read_sidecar(sidecar))
    if tags.program is None:
        beside = program_beside(path, hashes)
        program, source = beside if beside is not None else (None, FROM_STRUCTURE)
        tags = tags.merged({"program": program, "labels": {PROGRAM_FROM: source}})
    return tags.finished(str(path), program_later=True)


def _version(row) -> tuple:
    """A manifest row's file version (a dict from the manifest or a FileRecord)."""
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return get("path"), get("size"), get("mtime_ns")


def _bad_key(row) -> tuple:
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return (*_version(row), get("error"))


def prepare_store(store) -> tuple[Path, set[tuple], int]:
    """The store (created if needed), the (path, size, mtime, reason) of its bad rows, and how many
    leftovers it had: event parts of an interrupted ingest's uncommitted chunks, and bad rows of a
    file version stored since (a crash between a commit and the removal of the rows it replaced)."""
    root = _store.init_store(store)
    rows = _store.read_manifest(root).select(["path", "size", "mtime_ns", "status", "error", "chunk"]).to_pylist()
    removed = _store.remove_orphans(root, {str(r["chunk"]) for r in rows})
    stored = {_version(r) for r in rows if r["status"] == "ok"}
    if any(r["status"] == "bad" and _version(r) in stored for r in rows):
        removed += _store.drop_manifest_rows(root, lambda r: r["status"] == "bad" and _version(r) in stored)
    return root, {_bad_key(r) for r in rows if r["status"] == "bad" and _version(r) not in stored}, removed


def commit_chunk(root: Path, chunk: str, records: list[FileRecord], known_bad: set[tuple]) -> None:
    """Commits a chunk's manifest rows, leaving out a file still bad for a reason the manifest holds;
    the rows written replace their files' earlier bad rows (one row per bad file, however often
    it is tried)."""
    rows = [r for r in records if not (r.status == "bad" and _bad_key(r) in known_bad)]
    if not rows:
        return  # only files bad as before: no events were written, nothing changes
    _store.write_manifest_part(root, chunk, rows)
    retried = {r.path for r in rows} & {k[0] for k in known_bad}
    if retried:
        _store.drop_manifest_rows(root, lambda r: r["status"] == "bad" and r["path"] in retried and r["chunk"] != chunk)


def plan_ingest(sources, store: Path, *, pattern: str | None = None, tags: dict | None = None
                ) -> tuple[list[IngestItem], int]:
    """The files still to ingest (tagged, or with the reason they cannot be) and how many are
    already stored (same path, size and mtime)."""
    defaults = FileTags().merged(tags or {})
    pat = PathPattern.compile(pattern) if pattern else None
    # Only stored files count as done: a bad file is tried again (its sidecar may have been fixed);
    # commit_chunk keeps its row count at one.
    seen = _store.read_manifest(store).select(["path", "size", "mtime_ns", "status"]).to_pylist()
    done = {_version(r) for r in seen if r["status"] == "ok"}
    items, already, hashes = [], 0, {}
    for path, root in discover(sources):
        key = os.path.abspath(path)  # links are not resolved: the name given is the name reported
        st = _is_regular(key)
        if st is None:
            items.append(IngestItem(key, -1, -1, file_identity(key, -1, -1), None, "not a regular file"))
            continue
        if (key, st.st_size, st.st_mtime_ns) in done:
            already += 1
            continue
        item = IngestItem(key, st.st_size, st.st_mtime_ns, file_identity(key, st.st_size, st.st_mtime_ns), None)
        try:
            item.tags = _tag(path, root, defaults, pat, hashes)
        except (FormatError, OSError) as e:
            item.error = _reason(e, key)
        items.append(item)
    return items, already


def _reason(e: BaseException, path: str) -> str:
    """An error message without the file's own path repeated in front."""
    msg = str(e) or type(e).__name__
    for prefix in (f"{path}: ", f"{Path(path).name}: "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg if isinstance(e, (FormatError, OSError)) else f"{type(e).__name__}: {msg}"


def read_file_events(item: IngestItem) -> FileEvents:
    """Reads and converts one planned file; raises with the reason when it is bad."""
    from etlab.etdump import read_etdump

    if item.tags is None:
        raise FormatError(item.error or "untagged")
    columns = read_etdump(item.path)
    if item.tags.program is None:  # no tag and no program file beside it: the run's structure names it
        item.tags = replace(item.tags, program=structure_fingerprint(columns))
    return file_events(columns, item.file_id, item.tags)


def _record(item: IngestItem, chunk: str, ev: FileEvents | None, error: str | None) -> FileRecord:
    t = item.tags
    return FileRecord(
        file_id=item.file_id, path=item.path, size=item.size, mtime_ns=item.mtime_ns,
        status="bad" if error else "ok", error=error, events=len(ev) if ev else 0, runs=ev.runs if ev else 0,
        dropped=ev.dropped if ev else 0, not_profile=ev.not_profile if ev else 0,
        program=t and t.program, build=t and t.build, method=t and t.method, device=t and t.device,
        device_class=t and t.device_class, labels=t.labels_json() if t else None, chunk=chunk,
    )


def ingest_chunk(store: str, chunk: str, items: list[IngestItem]) -> list[FileRecord]:
    """Worker: reads a chunk of files, writes its event parts, returns its manifest rows (not yet committed)."""
    records, by_partition = [], defaultdict(list)
    for item in items:
        try:
            ev = read_file_events(item)
        except Exception as e:  # any defect of one untrusted file skips that file, never the ingest
            records.append(_record(item, chunk, None, _reason(e, item.path)))
            continue
        records.append(_record(item, chunk, ev, None))
        by_partition[(item.tags.program, item.tags.build)].append(ev)
    for (program, build), evs in sorted(by_partition.items()):
        _store.write_events_part(Path(store), program, build, chunk, events_table(evs))
    return records


def _chunks(items: list[IngestItem], workers: int, chunk_files: int | None) -> list[list[IngestItem]]:
    """Chunks big enough to amortize a Parquet part, small enough to keep every worker busy."""
    size = chunk_files or max(8, min(256, math.ceil(len(items) / (workers * 4))))
    return [items[i : i + size] for i in range(0, len(items), size)]


def ingest(sources, store, *, pattern: str | None = None, tags: dict | None = None, workers: int | None = None,
           chunk_files: int | None = None, progress: bool = False) -> IngestSummary:
    """Ingests every .etdp under `sources` into `store` (created if needed); see the module docstring.

    workers: processes (default: all cores; 1 runs in this process). Files already stored (same
    path, size, mtime) are not read again; files that were bad are tried again (a file still bad for
    the same reason adds no manifest row).

    A synthetic fleet (3 devices, builds A and B, a regression planted in B), ingested and compared:

    >>> import os, tempfile
    >>> from etlab.fleet import PATH_PATTERN, FleetDB, FleetSpec, diff, generate_fleet
    >>> with tempfile.TemporaryDirectory() as d:
    ...     files, store = os.path.join(d, "etdp"), os.path.join(d, "store")
    ...     _ = generate_fleet(files, FleetSpec(devices_per_class=1, sessions=1, runs=4))
    ...     summary = ingest(files, store, pattern=PATH_PATTERN, workers=1)
    ...     with FleetDB(store) as db:
    ...         devices = db.sql("SELECT count(DISTINCT device) AS n FROM events")["n"].item()
    ...     flagged = diff(store, base={"build": "A"}, head={"build": "B"}, n_boot=200).regressions["op"].tolist()
    >>> summary.files_ingested, summary.bad, devices
    (6, [], 3)
    >>> flagged  # the planted regression, found
    ['convolution.out']
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    root, known_bad, removed = prepare_store(store)
    summary = IngestSummary(store=str(root), leftovers_removed=removed)
    items, summary.files_already_stored = plan_ingest(sources, root, pattern=pattern, tags=tags)
    summary.files_found = len(items) + summary.files_already_stored
    workers = max(1, workers or os.cpu_count() or 1)
    chunks = _chunks(items, workers, chunk_files)
    bar = tqdm(total=len(items), unit="file", desc="ingest", disable=not progress, leave=False)

    def commit(chunk: str, records: list[FileRecord]) -> None:
        commit_chunk(root, chunk, records, known_bad)
        summary.add(records)
        bar.update(len(records))

    ids = [uuid.uuid4().hex for _ in chunks]
    try:
        if workers == 1 or len(chunks) <= 1:
            for chunk, part in zip(ids, chunks):
                commit(chunk, ingest_chunk(str(root), chunk, part))
        else:
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            with ProcessPoolExecutor(max_workers=min(workers, len(chunks)), mp_context=ctx) as pool:
                futures = {pool.submit(ingest_chunk, str(root), c, p): c for c, p in zip(ids, chunks)}
                for fut in as_completed(futures):
                    commit(futures[fut], fut.result())
    finally:
        bar.close()
    summary.bad.sort()
    summary.seconds = time.perf_counter() - t0
    return summary
