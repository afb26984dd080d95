"""A small synthetic fleet (24 files, planted regression in build B's convolutions) with a corrupt
and a truncated file in its tree, ingested once per test session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etlab.fleet import FleetSpec, generate_fleet, ingest


def add_bad_files(root: Path, good: str) -> dict[str, Path]:
    """A corrupt file, a truncated one (both with valid sidecars) and one whose sidecar names an unsafe
    program (a file with no tags at all is ingested under an inferred program: test_ingest)."""
    good = Path(good)
    sidecar = json.loads(good.with_name(good.name + ".json").read_text())
    bad = {"corrupt": root / "A" / "corrupt.etdp", "truncated": root / "B" / "truncated.etdp",
           "mistagged": root / "mistagged.etdp"}
    data = good.read_bytes()
    corrupt = bytearray(data)
    corrupt[16:48] = b"\xff" * 32   # the root table's offsets now point outside the buffer
    bad["corrupt"].write_bytes(bytes(corrupt))
    bad["truncated"].write_bytes(data[: len(data) // 2])
    bad["mistagged"].write_bytes(data)
    bad["mistagged"].with_name("mistagged.etdp.json").write_text(json.dumps({**sidecar, "program": "../outside"}))
    for key in ("corrupt", "truncated"):
        bad[key].with_name(bad[key].name + ".json").write_text(json.dumps(sidecar))
    return bad


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet") / "tree"
    fl = generate_fleet(root, FleetSpec(devices_per_class=2, sessions=2, runs=8, seed=5, outlier_rate=0.02))
    fl.bad = add_bad_files(root, fl.files[0])
    return fl


@pytest.fixture(scope="session")
def store(fleet, tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "s"
    summary = ingest(fleet.root, path, workers=1)
    return path, summary
