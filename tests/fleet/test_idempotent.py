"""Ingest is idempotent (issue 24, item 6): `etlab fleet ingest` run again over the same tree adds no
manifest row (a file still bad for the same reason is reported, not recorded again), and a bad
file fixed since has its bad row replaced by its ok row: one row per file version."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from etlab.fleet import read_manifest

REPO = Path(__file__).resolve().parents[2]


def _ingest(tree: Path, store: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "etlab.cli", "fleet", "ingest", str(tree), "--store", str(store),
                           "--workers", "2", "--no-progress"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _rows(store: Path) -> list[tuple]:
    return sorted((r["path"], r["status"]) for r in read_manifest(store).to_pylist())


def test_ingest_twice_leaves_the_manifest_as_it_was(fleet, tmp_path):
    tree, store = tmp_path / "tree", tmp_path / "store"
    shutil.copytree(fleet.root, tree)
    first = _ingest(tree, store)
    rows = _rows(store)
    assert sum(s == "bad" for _, s in rows) == 3 and len(rows) == len(fleet.files) + 3
    assert len({p for p, _ in rows}) == len(rows)
    for _ in range(2):
        again = _ingest(tree, store)
        assert "3 bad (skipped)" in again.stdout + again.stderr  # still reported each time
        assert _rows(store) == rows
    assert "3 bad (skipped)" in first.stdout + first.stderr

    # the mistagged file gets good tags: its bad row is replaced, not joined, by an ok row
    untagged = tree / fleet.bad["mistagged"].relative_to(fleet.root)
    good = Path(fleet.files[0])
    sidecar = tree / good.relative_to(fleet.root).with_name(good.name + ".json")
    untagged.with_name(untagged.name + ".json").write_text(json.dumps(json.loads(sidecar.read_text())))
    _ingest(tree, store)
    fixed = _rows(store)
    assert len(fixed) == len(rows) and (str(untagged.absolute()), "ok") in fixed
    assert sum(s == "bad" for _, s in fixed) == 2
    _ingest(tree, store)
    assert _rows(store) == fixed
