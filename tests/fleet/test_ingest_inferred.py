"""`etlab fleet ingest` of plain device .etdp files (no sidecar, no pattern, no --tag), as a user types it:
the program comes from the .pte (else .etrecord) beside the run, else from the run's structure, the
summary says which, and a call that stores nothing exits non-zero."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from etlab.fleet import read_manifest
from etlab.schema import etdump as E
from etlab.schema import serialize_etdump

ETLAB = str(Path(sys.executable).with_name("etlab"))  # the console script the README tells users to run


def _etlab(*args) -> subprocess.CompletedProcess:
    return subprocess.run([ETLAB, *map(str, args)], capture_output=True, text=True, timeout=600)


def _plain_copies(fleet, folder: Path, n: int) -> list[Path]:
    """n of the fleet's files (one program, timings differ) copied without their sidecars."""
    folder.mkdir(parents=True)
    out = []
    for i, f in enumerate(fleet.files[:n]):
        out.append(folder / f"run{i}.etdp")
        shutil.copy(f, out[-1])
    return out


def _other_program_run(path: Path) -> Path:
    ev = lambda name, i: E.Event(profile_event=E.ProfileEvent(name=name, chain_index=0, instruction_id=i, start_time=10,
                                                               end_time=20 + i, delegate_debug_id_int=-1))
    run = E.RunData(name="Execute", events=[ev("native_call_add.out", 0), ev("native_call_mul.out", 1)])
    path.write_bytes(serialize_etdump(E.ETDump(version=0, run_data=[run])))
    return path


def _manifest(store: Path) -> dict[str, dict]:
    return {Path(r["path"]).name: r for r in read_manifest(store).to_pylist()}


def test_plain_runs_are_stored_under_their_structure(fleet, tmp_path):
    runs = _plain_copies(fleet, tmp_path / "device", 3)
    _other_program_run(tmp_path / "device" / "other.etdp")
    out = _etlab("fleet", "ingest", tmp_path / "device", "--store", tmp_path / "s", "--workers", "1", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "4 ingested" in out.stdout and "0 bad" in out.stdout
    assert "program inferred for 4 file(s)" in out.stdout, out.stdout
    assert "\n    4 from the run's structure" in out.stdout, out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 120
    assert "4 file(s) stored as build=unknown" in out.stdout
    rows = _manifest(tmp_path / "s")
    programs = {rows[r.name]["program"] for r in runs}
    assert len(programs) == 1 and next(iter(programs)).startswith("etdp-")       # one program, timings aside
    assert rows["other.etdp"]["program"].startswith("etdp-") and rows["other.etdp"]["program"] not in programs
    assert all(json.loads(r["labels"]) == {"program_from": "the run's structure"} for r in rows.values())
    assert {r["build"] for r in rows.values()} == {"unknown"}
    # the fingerprint is the program's: the same runs elsewhere get the same one
    again = _plain_copies(fleet, tmp_path / "elsewhere", 1)
    assert _etlab("fleet", "ingest", *again, "--store", tmp_path / "s2", "--workers", "1",
                  "--no-progress").returncode == 0
    assert _manifest(tmp_path / "s2")["run0.etdp"]["program"] in programs


def test_program_from_the_pte_else_the_etrecord_beside_the_run(fleet, tmp_path):
    with_pte = _plain_copies(fleet, tmp_path / "a", 2)
    pte = tmp_path / "a" / "model.pte"
    pte.write_bytes(b"stand-in program bytes")
    with_record = _plain_copies(fleet, tmp_path / "b", 1)
    record = tmp_path / "b" / "model.etrecord"
    record.write_bytes(b"stand-in record bytes")
    out = _etlab("fleet", "ingest", tmp_path / "a", tmp_path / "b", "--store", tmp_path / "s", "--tag", "build=v1",
                 "--workers", "1", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "program inferred for 3 file(s)" in out.stdout, out.stdout
    assert "\n    2 from model.pte\n    1 from model.etrecord" in out.stdout, out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 120
    assert "build=unknown" not in out.stdout
    rows = read_manifest(tmp_path / "s").to_pylist()
    by_dir = {(Path(r["path"]).parent.name, r["program"], r["build"]) for r in rows}
    assert by_dir == {("a", hashlib.sha256(pte.read_bytes()).hexdigest(), "v1"),
                      ("b", "etrecord-" + hashlib.sha256(record.read_bytes()).hexdigest(), "v1")}
    # a program tag wins over the files beside the run, and no label says otherwise
    out = _etlab("fleet", "ingest", with_pte[0], "--store", tmp_path / "t", "--tag", "program=given",
                 "--no-progress")
    assert out.returncode == 0 and "inferred" not in out.stdout
    row = read_manifest(tmp_path / "t").to_pylist()[0]
    assert row["program"] == "given" and json.loads(row["labels"]) == {}
    assert with_record


def test_nothing_ingested_exits_non_zero(tmp_path):
    (tmp_path / "empty").mkdir()
    out = _etlab("fleet", "ingest", tmp_path / "empty", "--store", tmp_path / "s", "--no-progress")
    assert out.returncode == 1 and "nothing ingested: no .etdp file found" in out.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.etdp").write_bytes(b"not an etdump at all")
    out = _etlab("fleet", "ingest", tmp_path / "junk", "--store", tmp_path / "s", "--no-progress")
    assert out.returncode == 1 and "every file was bad" in out.stderr and "1 bad (skipped)" in out.stdout
    # files already stored are not a failure: a second ingest of a good tree stores nothing new, exit 0
    _other_program_run(tmp_path / "junk" / "ok.etdp")
    assert _etlab("fleet", "ingest", tmp_path / "junk", "--store", tmp_path / "s", "--no-progress").returncode == 0
    again = _etlab("fleet", "ingest", tmp_path / "junk" / "ok.etdp", "--store", tmp_path / "s", "--no-progress")
    assert again.returncode == 0 and "1 already stored" in again.stdout
