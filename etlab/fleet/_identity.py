"""A program identity for an ETDump nobody tagged with one.

A device writes plain `.etdp` files: no sidecar, no path convention. The store still needs a program
to partition by, and runs of one program must land together. In order of trust:

1. the program's `.pte` beside the run (`run.pte`, else the folder's only `.pte`): the SHA-256 of its
   bytes, the same identity a sidecar or `--tag program=` gives (`program_hash`);
2. its `.etrecord` beside the run (same rule): `etrecord-` and the SHA-256 of the record's bytes
   (a record does not hold the .pte, so this cannot equal the .pte's hash);
3. else the run's structure: `etdp-` and a hash of the distinct run blocks' layouts, each the block's
   name and its profile events' names, chain/instruction ids (debug handles) and delegate ids, in
   order. Timings, how many times a block repeats and the framework events other than Method::execute
   (Method::init, Program::load_method: logged once per load, not per program; etlab::dropped_debug_values:
   logged when a run's debug buffer was full) are left out, so every run of one
   program from one runtime fingerprints alike, and runs of programs that differ in any op do not.

Which rule was used is kept with the file as the label `program_from`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from etlab.fleet._tags import program_hash
from etlab.schema.etdump import FRAMEWORK_EVENT_NAMES, METHOD_EXECUTE

PROGRAM_FROM = "program_from"    # the label naming where an inferred program identity came from
FROM_STRUCTURE = "the run's structure"
_NOT_STRUCTURE = FRAMEWORK_EVENT_NAMES - {METHOD_EXECUTE}  # once per load, or per full debug buffer


def file_beside(run: Path, suffix: str) -> Path | None:
    """`run` with `suffix` in the same folder, else the folder's only file with that suffix."""
    same = run.with_suffix(suffix)
    if same.is_file():
        return same
    try:
        found = [p for p in run.parent.iterdir() if p.suffix == suffix and p.is_file()]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def program_beside(run: Path, cache: dict | None = None) -> tuple[str, str] | None:
    """(program identity, the file it came from) from the .pte, else the .etrecord, beside `run`;
    None when neither is there. `cache` maps (path, size, mtime) to hashes already computed (many
    runs share one program file)."""
    cache = {} if cache is None else cache
    for suffix, prefix in ((".pte", ""), (".etrecord", "etrecord-")):
        found = file_beside(run, suffix)
        if found is None:
            continue
        st = found.stat()
        key = (str(found), st.st_size, st.st_mtime_ns)
        if key not in cache:
            cache[key] = prefix + program_hash(found)
        return cache[key], found.name
    return None


def structure_fingerprint(cols) -> str:
    """`etdp-<32 hex>`: a hash of the distinct run-block layouts of a read ETDump (etlab.etdump.read_etdump);
    see the module docstring for what a layout holds."""
    strings = cols.strings
    name = lambda c: "" if c < 0 else strings[c]
    layouts = set()
    prof = np.asarray(cols.has_profile, dtype=bool)
    for run in cols.runs:
        rows = np.arange(run.first_event, run.first_event + run.num_events)
        rows = rows[prof[rows]]
        names = [name(c) for c in cols.name_code[rows].tolist()]
        columns = (cols.chain_index, cols.instruction_id, cols.delegate_id_int, cols.delegate_id_str_code)
        events = tuple((n, ch, ins, did, name(ds))
                       for n, ch, ins, did, ds in zip(names, *(c[rows].tolist() for c in columns))
                       if n not in _NOT_STRUCTURE)
        if events:
            layouts.add((run.name or "", events))
    digest = hashlib.blake2b(repr(sorted(layouts)).encode("utf-8", "surrogateescape"), digest_size=16)
    return "etdp-" + digest.hexdigest()
