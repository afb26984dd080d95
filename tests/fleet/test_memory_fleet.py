"""Memory in a fleet: runs traced with allocation events, ingested; peak memory per device class and build,
memory per owner, and a planted memory regression (build B's unplanned tensors twice as large) found by
`fleet diff --metric memory`, in Python and through the CLI."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from etlab.fleet import PATH_PATTERN, FleetDB, diff, ingest
from etlab.schema import serialize_etdump, write_atomic
from tests.inspector._memory_dumps import Planted, memory_dump

RUNS = 4
BASE = Planted(unplanned=(2000, 3000, 2500, 2200))
HEAD = replace(BASE, unplanned=tuple(2 * u for u in BASE.unplanned))  # the planted regression
CLASSES = ("flagship", "low")


@pytest.fixture(scope="module")
def memory_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("memfleet")
    tree = root / "tree"
    for build, planted in (("A", BASE), ("B", HEAD)):
        for dc in CLASSES:
            for d in range(2):
                for k in range(2):
                    path = tree / build / dc / f"{dc}-{d}" / f"session-{k}.etdp"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(path, serialize_etdump(memory_dump(RUNS, planted)))
    store = root / "store"
    summary = ingest(tree, store, pattern=PATH_PATTERN, workers=1)
    assert summary.files_ingested == 16 and summary.files_bad == 0
    return store


def _tracked(planted: Planted) -> list[int]:
    return [max(planted.run_bytes(r).values()) for r in range(RUNS)]


def test_peak_memory_per_device_class_and_build(memory_store):
    with FleetDB(memory_store) as db:
        peaks = db.memory_peaks()
        owners = db.memory_owners(by=("build",))
        ops = db.op_percentiles(by=("build",))
    assert peaks[["device_class", "build"]].values.tolist() == [[dc, b] for dc in CLASSES for b in "AB"]
    assert (peaks["runs"] == 4 * RUNS).all() and (peaks["files"] == 4).all()
    for build, planted in (("A", BASE), ("B", HEAD)):
        mine = peaks[peaks["build"] == build]
        assert (mine["max_bytes"] == max(_tracked(planted))).all()
        assert np.allclose(mine["p50_bytes"], np.median(_tracked(planted)))
        own = owners[owners["build"] == build].set_index("op")
        assert own.loc["temp", "max_bytes"] == planted.temp and own.loc["planned:1", "max_bytes"] == planted.arena
        assert own.loc["unplanned", "max_bytes"] == max(planted.unplanned)
        assert own.loc["delegate:XnnpackBackend", "max_bytes"] == planted.packed  # at load, more than the workspace
    # the op statistics are the profile events' alone
    assert "tracked" not in set(ops["op"]) and "temp" not in set(ops["op"])


def test_fleet_diff_flags_the_memory_that_grew(memory_store):
    result = diff(memory_store, "build=A", "build=B", metric="memory", threshold=0.02)
    t = result.table.set_index(["op", "run_name"])
    assert set(result.regressions["op"]) == {"tracked", "unplanned"}
    assert t.loc[("tracked", "Execute"), "p50_head_bytes"] == np.median(_tracked(HEAD))
    assert t.loc[("tracked", "Execute"), "change"] == pytest.approx(np.median(_tracked(HEAD)) /
                                                                  np.median(_tracked(BASE)) - 1)
    assert t.loc[("unplanned", "Execute"), "change"] == pytest.approx(1.0)
    # load and run bytes of one owner are two rows: the delegate's packed weights and its workspace
    assert t.loc[("delegate:XnnpackBackend", "Default"), "p50_base_bytes"] == BASE.packed
    assert t.loc[("delegate:XnnpackBackend", "Execute"), "p50_base_bytes"] == BASE.workspace
    assert t.loc[("temp", "Execute"), "flag"] == "" and t.loc[("planned:1", "Default"), "change"] == 0
    text = result.format()
    assert result.exit_code == 1 and text.startswith("memory: base build=A vs head build=B: 2 regression")
    assert "p50 A (KiB)" in text
    # at the default threshold (5%) the tracked peak's 3% growth is not flagged, the unplanned bytes' 100% is
    assert set(diff(memory_store, "build=A", "build=B", metric="memory").regressions["op"]) == {"unplanned"}
    # the time comparison of the same store is unchanged by the memory rows
    assert "tracked" not in set(diff(memory_store, "build=A", "build=B").table["op"])
    with pytest.raises(ValueError, match="metric 'bytes'"):
        diff(memory_store, "build=A", "build=B", metric="bytes")


def test_fleet_cli_memory(memory_store, tmp_path):
    out = subprocess.run([sys.executable, "-m", "etlab.cli", "fleet", "diff", str(memory_store), "--base", "build=A",
                          "--head", "build=B", "--metric", "memory", "--html", str(tmp_path / "d.html")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "memory: base build=A vs head build=B: 1 regression(s)" in out.stdout and "unplanned" in out.stdout
    assert "p50 base (KiB)" in (tmp_path / "d.html").read_text()
    stats = subprocess.run([sys.executable, "-m", "etlab.cli", "fleet", "stats", str(memory_store), "memory",
                            "--format", "csv"], capture_output=True, text=True, timeout=300)
    assert stats.returncode == 0, stats.stderr
    assert stats.stdout.splitlines()[0].startswith("device_class,build,runs,files,p50_bytes")
