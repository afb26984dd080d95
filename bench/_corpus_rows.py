"""The coverage table's rows kept across runs of bench/corpus.py, so a stopped run keeps what it
measured and the next one fills in the rest.

One JSON file per model under `<cache root>/rows/` (bench/_corpus_upstream.cache_root). A row holds
the model's checks and times, and what they depended on:

- `entry_key`: bench/_corpus_upstream.program_key of the exported programs and inputs (the corpus
  entry as compiled, and the upstream release);
- `source_key`: a hash of the files defining the entry, checked without exporting (a cheap hint
  that the entry may have changed; the run re-exports and compares `entry_key`);
- `etlab_key`: a hash of etlab's sources (.py and the native core) when the row was measured,
  with the git commit and whether etlab/ had uncommitted edits then.

A row is *current* when all three match today's; otherwise it is still shown, labelled with the
commit and date it was measured at, and a run re-measures it after the models that have no row.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from _corpus_upstream import ENTRY_SOURCE, REPO, cache_root

ROW_VERSION = 1
ETLAB_DIR = REPO / "etlab"
CORPUS_DIR = ETLAB_DIR / "models" / "corpus"


def rows_dir() -> Path:
    return cache_root() / "rows"


def etlab_key() -> str:
    """Hash of etlab's code as the harness imports it: every .py and native extension under etlab/
    except the corpus definitions (those are the entry's, see source_key)."""
    h = hashlib.sha256()
    for p in sorted(ETLAB_DIR.rglob("*")):
        if p.suffix not in (".py", ".so") or "__pycache__" in p.parts or CORPUS_DIR in p.parents:
            continue
        data = p.read_bytes()
        h.update(f"\0{p.relative_to(ETLAB_DIR)}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def source_key(entry) -> str:
    """Hash of the files that define corpus `entry` (its factory's module and _entry.py)."""
    h = hashlib.sha256(entry.name.encode())
    for p in [Path(sys.modules[entry.factory.__module__].__file__), ENTRY_SOURCE]:
        data = p.read_bytes()
        h.update(f"\0{p.name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def git_state() -> tuple[str, bool]:
    """(short HEAD commit, whether etlab/ has uncommitted edits), ('unknown', True) outside git. A tree
    exported with `git archive COMMIT` (a long run that other people's uncommitted edits must not reach)
    names its commit in ETLAB_TREE_COMMIT: that commit, clean."""
    exported = os.environ.get("ETLAB_TREE_COMMIT", "").strip()
    if exported and not (REPO / ".git").exists():
        return exported[:12], False
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "etlab"], cwd=REPO, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head, bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True


@dataclass
class Row:
    """One model's measured result and what it was measured against."""

    name: str
    entry_key: str
    source_key: str
    etlab_key: str
    commit: str
    dirty: bool
    measured_at: str  # UTC, ISO 8601 to the minute
    upstream: str
    load: float
    result: dict  # export_s, etlab_compile_s, upstream_compile_s, checks {column: [ok, detail]}
    version: int = ROW_VERSION

    @property
    def provenance(self) -> str:
        return f"{self.commit}{'+edits' if self.dirty else ''} {self.measured_at[5:16].replace('T', ' ')}"


@dataclass
class RunContext:
    """What every row of one run shares, computed once at its start (the code a run imports is the
    code at its start)."""

    etlab_key: str
    commit: str
    dirty: bool
    upstream: str

    @classmethod
    def now(cls, upstream: str) -> RunContext:
        commit, dirty = git_state()
        return cls(etlab_key(), commit, dirty, upstream)


def _path(name: str) -> Path:
    return rows_dir() / f"{name}.json"


def load(name: str) -> Row | None:
    """The stored row of `name`, or None (none stored, or unreadable / from another row version)."""
    try:
        data = json.loads(_path(name).read_text())
        if data.get("version") != ROW_VERSION or data.get("name") != name:
            return None
        return Row(**data)
    except (OSError, ValueError, TypeError):
        return None


def save(row: Row) -> None:
    """Writes `row` atomically (a concurrent reader sees the old row or the new one)."""
    path = _path(row.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(row), indent=1))
    os.replace(tmp, path)


def make_row(name: str, entry_key: str, src_key: str, ctx: RunContext, result: dict) -> Row:
    return Row(name=name, entry_key=entry_key, source_key=src_key, etlab_key=ctx.etlab_key, commit=ctx.commit,
               dirty=ctx.dirty, measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M"),
               upstream=ctx.upstream, load=round(os.getloadavg()[0], 1), result=result)


def is_current(row: Row | None, entry, ctx: RunContext) -> bool:
    """Whether `row` was measured against today's etlab, entry source and upstream (no export needed)."""
    return (row is not None and row.etlab_key == ctx.etlab_key and row.upstream == ctx.upstream
            and row.source_key == source_key(entry))


def run_order(names: list[str], entries: dict, ctx: RunContext, refresh: bool = False) -> list[str]:
    """The models a run measures, in order: those with no row first (corpus order), then those whose
    row is stale, oldest first; current rows are skipped unless `refresh`."""
    rows = {n: load(n) for n in names}
    missing = [n for n in names if rows[n] is None]
    stale = [n for n in names if rows[n] is not None and (refresh or not is_current(rows[n], entries[n], ctx))]
    stale.sort(key=lambda n: rows[n].measured_at)
    return missing + stale
