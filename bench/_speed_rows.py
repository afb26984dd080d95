"""The compile-speed rows of bench/corpus_speed.py kept across runs, in bench/corpus_speed.jsonl.

One JSON line per model, a bench/_corpus_rows.Row (the same row type bench/corpus.py keeps: the
commit, whether etlab/ had uncommitted edits, the UTC minute, the load average, the hashes of etlab's
code and of the entry's source) whose `result` holds this bench's samples:
`etlab_s`, `upstream_s`, `etlab_cpu`, `upstream_cpu` (seconds per sample), `error`, `rounds`,
`load` ([at the model's start, at its end]) and, when a run timed them, the ETRecord save samples
`etrecord` / `upstream_etrecord` ([wall s, CPU s, bytes] each) and `etrecord_error`.

A run merges each model's row as soon as it is measured (the newest row of a model replaces its
older one), so a stopped run keeps what it timed and runs over subsets add up; the
`## corpus compile speed` section is rendered from the whole store. Unlike bench/corpus.py's per-model
files in the cache, this store is committed: it is the record the section's numbers come from.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, fields
from pathlib import Path

from _corpus_rows import ROW_VERSION, Row, RunContext, etlab_key

from etlab.schema import write_atomic

HERE = Path(__file__).resolve().parent
STORE = HERE / "corpus_speed.jsonl"
NOTES_BEGIN = "<!-- notes: hand-written, kept by bench/corpus_speed.py -->"
NOTES_END = "<!-- end of notes -->"
_ROW_FIELDS = {f.name for f in fields(Row)}


def run_context(upstream: str) -> RunContext:
    """This run's commit and code hash. A run from an exported tree (`git archive HEAD`, no .git) names
    its commit in ETLAB_BENCH_COMMIT (the tree is that commit exactly, so no uncommitted edits)."""
    commit = os.environ.get("ETLAB_BENCH_COMMIT", "").strip()
    if commit:
        return RunContext(etlab_key(), commit, False, upstream)
    return RunContext.now(upstream)


def load_store(path: Path = STORE) -> dict[str, Row]:
    """The store's rows by model name (a later line of the same model wins). A line that is not a row
    is an error naming the file and line: the store is committed, a bad merge must not go unnoticed."""
    rows: dict[str, Row] = {}
    if not path.is_file():
        return rows
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"corpus_speed: {path}:{i}: not JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(
                data.get("result"), dict):
            raise SystemExit(f"corpus_speed: {path}:{i}: not a row (needs a model name and a result object)")
        unknown = sorted(set(data) - _ROW_FIELDS)
        missing = sorted(_ROW_FIELDS - set(data) - {"version"})
        if unknown or missing or data.get("version", ROW_VERSION) != ROW_VERSION:
            raise SystemExit(f"corpus_speed: {path}:{i}: row of {data['name']!r}: unknown fields {unknown}, "
                             f"missing {missing}, version {data.get('version')!r} (this bench reads {ROW_VERSION})")
        rows[data["name"]] = Row(**data)
    return rows


def merge(new: list[Row], path: Path = STORE) -> dict[str, Row]:
    """The store with `new` replacing the rows of the same models (in place) or added at the end,
    written back atomically; returns every row."""
    rows = load_store(path)
    rows.update({r.name: r for r in new})
    write_atomic(path, "".join(json.dumps(asdict(r)) + "\n" for r in rows.values()).encode())
    return rows


def kept_notes(text: str, section: str) -> str:
    """The hand-written notes of `## section` in RESULTS.md text (between NOTES_BEGIN / NOTES_END), or ''."""
    m = re.search(rf"^## {re.escape(section)}\n.*?(?=^## |\Z)", text, re.S | re.M)
    sec = m.group(0) if m else ""
    if NOTES_BEGIN in sec and NOTES_END in sec:
        return sec[sec.index(NOTES_BEGIN) + len(NOTES_BEGIN):sec.index(NOTES_END)].strip("\n")
    return ""

