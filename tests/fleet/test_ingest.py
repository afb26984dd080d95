"""Ingest: rows, tags, bad files skipped and reported, resume, leftovers of an interrupted run, parallel == serial."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from etlab.fleet import FleetSpec, generate_fleet, ingest, read_manifest
from etlab.fleet._cli import fleet_main
from etlab.schema import deserialize_etdump


def _events(store) -> list[tuple]:
    glob = str(Path(store) / "events" / "*" / "*" / "*.parquet")
    return duckdb.sql(f"SELECT * EXCLUDE (labels) FROM read_parquet('{glob}', hive_partitioning=true, "
                      "hive_types_autocast=false) ORDER BY file_id, run, start_ns, event, category").fetchall()


def test_bad_files_reported_and_skipped(fleet, store):
    _, summary = store
    assert summary.files_found == len(fleet.files) + 3
    assert summary.files_ingested == len(fleet.files)
    reasons = dict(summary.bad)
    assert set(reasons) == {str(p.absolute()) for p in fleet.bad.values()}
    assert "only" in reasons[str(fleet.bad["truncated"].absolute())]        # size prefix vs bytes present
    assert "malformed vtable" in reasons[str(fleet.bad["corrupt"].absolute())]
    assert "program tag '../outside' must match" in reasons[str(fleet.bad["mistagged"].absolute())]
    text = summary.format()
    assert "3 bad (skipped)" in text and "truncated.etdp" in text and "corrupt.etdp" in text
    manifest = read_manifest(store[0]).to_pandas()
    assert sorted(manifest["status"].value_counts().items()) == [("bad", 3), ("ok", len(fleet.files))]


def test_one_row_per_profile_event_with_tags(fleet, store):
    """Row counts and tags match what the generic decoder and the sidecars say, file by file."""
    path, summary = store
    manifest = read_manifest(path).to_pandas().set_index("path")
    db = duckdb.connect()
    glob = str(path / "events" / "*" / "*" / "*.parquet")
    counts = dict(db.sql(f"SELECT file_id, count(*) FROM read_parquet('{glob}') GROUP BY 1").fetchall())
    for f in fleet.files[:6]:
        model = deserialize_etdump(Path(f).read_bytes())
        n_profile = sum(e.profile_event is not None for r in model.run_data for e in r.events)
        row = manifest.loc[str(Path(f).absolute())]
        assert counts[row["file_id"]] == n_profile == row["events"]
        tags = json.loads(Path(f + ".json").read_text())
        assert (row["build"], row["device"], row["device_class"], row["program"]) == (
            tags["build"], tags["device"], tags["device_class"], tags["program"])
    assert sum(counts.values()) == summary.events
    rows = db.sql(f"SELECT DISTINCT program, build FROM read_parquet('{glob}', hive_partitioning=true, "
                  "hive_types_autocast=false) ORDER BY 2").fetchall()
    assert rows == [(fleet.spec.program, "A"), (fleet.spec.program, "B")]


def test_op_categories_and_kernel_pairing(store):
    db = duckdb.connect()
    glob = str(store[0] / "events" / "*" / "*" / "*.parquet")
    got = dict(db.sql(f"SELECT event, string_agg(DISTINCT category ORDER BY category) FROM read_parquet('{glob}') "
                      "GROUP BY event").fetchall())
    assert got["native_call_convolution.out"] == "kernel"
    assert got["OPERATOR_CALL"] == "operator_call"          # every one wraps a kernel in this fleet
    assert got["DELEGATE_CALL"] == "delegate_call" and got["backend_op_0"] == "delegate"
    assert got["Method::execute"] == "framework"
    # an OPERATOR_CALL takes the op of the kernel of the same instruction
    pairs = db.sql(f"SELECT DISTINCT instruction, op FROM read_parquet('{glob}') WHERE event = 'OPERATOR_CALL' "
                   "ORDER BY 1").fetchall()
    assert pairs[0] == (0, "convolution.out") and pairs[6] == (6, "addmm.out")


def test_resume_reads_only_new_files(fleet, tmp_path):
    store = tmp_path / "s"
    tree = tmp_path / "tree"
    shutil.copytree(fleet.root, tree)
    first = ingest(tree, store, workers=1)
    again = ingest(tree, store, workers=1)
    assert again.files_ingested == 0 and again.events == 0
    assert again.files_already_stored == first.files_ingested and again.files_bad == 3   # bad ones are retried
    extra = tree / "A" / "flagship" / "flagship-00" / "extra.etdp"
    src = tree / "A" / "flagship" / "flagship-00" / "session-000.etdp"
    shutil.copy(src, extra)
    shutil.copy(str(src) + ".json", str(extra) + ".json")
    third = ingest(tree, store, workers=1)
    assert third.files_ingested == 1 and third.events == first.events // len(fleet.files)
    assert len(_events(store)) == first.events + third.events


def test_interrupted_ingest_leaves_no_duplicates(fleet, tmp_path):
    """Event parts written without their manifest part (a crash in between) are removed and redone."""
    store = tmp_path / "s"
    full = ingest(fleet.root, store, workers=1, chunk_files=8)
    expected = _events(store)
    manifest_parts = sorted((store / "files").glob("files-*.parquet"))
    manifest_parts[0].unlink()                     # as if the crash came before this chunk's commit
    redo = ingest(fleet.root, store, workers=1)
    assert redo.leftovers_removed >= 1
    assert 0 < redo.files_ingested <= 8 and redo.events < full.events
    assert _events(store) == expected


def test_parallel_ingest_equals_serial(fleet, store, tmp_path):
    par = ingest(fleet.root, tmp_path / "p", workers=2, chunk_files=5)
    assert par.events == store[1].events and par.files_bad == 3
    assert _events(tmp_path / "p") == _events(store[0])


def test_path_pattern_and_default_tags(fleet, tmp_path):
    """Without sidecars, tags come from the path pattern and --tag defaults."""
    tree = tmp_path / "tree"
    shutil.copytree(fleet.root, tree, ignore=shutil.ignore_patterns("*.json", "corrupt*", "truncated*", "mistagged*"))
    s = ingest(tree, tmp_path / "s", pattern="{build}/{device_class}/{device}/session-{label.session}.etdp",
               tags={"program": "abc123", "method": "forward"}, workers=1)
    assert s.files_ingested == len(fleet.files) and not s.bad
    m = read_manifest(tmp_path / "s").to_pandas()
    row = m[m["path"].str.endswith("B/mid/mid-01/session-001.etdp")].iloc[0]
    assert (row["program"], row["build"], row["device_class"], row["device"]) == ("abc123", "B", "mid", "mid-01")
    assert json.loads(row["labels"]) == {"session": "001"}


def test_hostile_tree_entries(fleet, tmp_path):
    """A FIFO and a device named .etdp are skipped unopened (no hang); an unsafe build tag is refused."""
    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "pipe.etdp")
    os.symlink("/dev/zero", tree / "zero.etdp")
    good = Path(fleet.files[0])
    shutil.copy(good, tree / "escape.etdp")
    tags = json.loads(Path(str(good) + ".json").read_text())
    (tree / "escape.etdp.json").write_text(json.dumps({**tags, "build": "../../outside"}))
    shutil.copy(good, tree / "huge.etdp")
    (tree / "huge.etdp.json").write_bytes(b" " * (2 << 20))
    s = ingest(tree, tmp_path / "s", workers=1)
    reasons = {Path(p).name: r for p, r in s.bad}
    assert s.files_ingested == 0
    assert reasons["pipe.etdp"] == "not a regular file" and reasons["zero.etdp"] == "not a regular file"
    assert "build tag '../../outside'" in reasons["escape.etdp"]
    assert "larger than" in reasons["huge.etdp"]
    assert not (tmp_path / "outside").exists()


def test_end_before_start_is_dropped_and_counted(tmp_path):
    from etlab.schema import etdump as E
    from etlab.schema import serialize_etdump

    def ev(name, start, end):
        return E.Event(profile_event=E.ProfileEvent(name=name, chain_index=0, instruction_id=0, start_time=start,
                                                    end_time=end, delegate_debug_id_int=-1))

    run = E.RunData(name="Execute", events=[ev("native_call_add.out", 10, 20), ev("native_call_add.out", 30, 5),
                                            ev("OPERATOR_CALL", 0, (1 << 64) - 1),
                                            E.Event(allocation_event=E.AllocationEvent(allocator_id=0,
                                                                                       allocation_size=8))])
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x.etdp").write_bytes(serialize_etdump(E.ETDump(version=0, run_data=[run])))
    s = ingest(tmp_path / "t", tmp_path / "s", tags={"program": "p", "build": "b"}, workers=1)
    # stored: the one valid profile event, and what the allocation event adds up to (memory rows: its
    # allocator's bytes, the run's tracked peak); the allocation event itself is counted, not stored
    assert (s.events, s.dropped_events, s.not_profile_events) == (3, 2, 1)
    t = pq.read_table(next((tmp_path / "s" / "events").rglob("*.parquet")))
    assert t.column("duration_ns").to_pylist() == [10, 0, 0] and t.column("bytes").to_pylist() == [0, 8, 8]
    assert np.all(t.column("category").to_pylist() == np.array(["kernel", "memory", "memory"]))


def test_store_refuses_foreign_directory(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("x")
    with pytest.raises(Exception, match="not a fleet store"):
        ingest([], tmp_path / "d")


def test_cli_ingest_prints_summary(fleet, tmp_path, capsys):
    assert fleet_main(["ingest", fleet.root, "--store", str(tmp_path / "s"), "--no-progress", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{len(fleet.files)} ingested" in out and "3 bad (skipped)" in out and "truncated.etdp" in out
    assert fleet_main(["ingest", fleet.root, "--store", str(tmp_path / "s"), "--no-progress", "--strict"]) == 1


def test_generator_is_deterministic(tmp_path):
    spec = FleetSpec(devices_per_class=1, sessions=1, runs=3, seed=7)
    a, b = generate_fleet(tmp_path / "a", spec), generate_fleet(tmp_path / "b", spec)
    assert [Path(f).read_bytes() for f in a.files] == [Path(f).read_bytes() for f in b.files]
