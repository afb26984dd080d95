"""The server extension's readers on hostile files, without a server: every truncated or mangled
artifact becomes a FormatError naming the file by its path under the root, never another exception,
a write or a hang."""

from __future__ import annotations

import random

import pytest

from etlab.errors import FormatError
from etlab.jupyter._service import Service
from etlab.jupyter._store import PathError

pytestmark = pytest.mark.xdist_group("jupyter")

KINDS = {"mlp.pte": "pte", "run.etdp": "etdp", "mlp.etrecord": "etrecord", "mlp.bpte": "bpte"}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_mangled_files_raise_format_error(lab_files, tmp_path, name):
    data = (lab_files.root / name).read_bytes()
    rng = random.Random(13)
    suffix = name.rsplit(".", 1)[1]
    variants = {"empty": b"", "truncated": data[: len(data) // 2], "head": data[:64]}
    for i in range(6):
        flipped = bytearray(data)
        for _ in range(8):
            flipped[rng.randrange(len(flipped))] ^= 0xFF
        variants[f"flipped{i}"] = bytes(flipped)
    service = Service(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for label, blob in variants.items():
        path = tmp_path / f"{label}.{suffix}"
        path.write_bytes(blob)
        view = getattr(service, KINDS[name])
        try:
            view(path.name)
        except FormatError as e:
            assert f"{label}.{suffix}" in str(e) and str(tmp_path) not in str(e), str(e)
        path.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # reading wrote nothing


def test_listing_reports_unreadable_files(lab_files, tmp_path):
    (tmp_path / "bad.etrecord").write_bytes(b"PK\x03\x04 not a zip")
    (tmp_path / "mlp.pte").write_bytes((lab_files.root / "mlp.pte").read_bytes())
    d = Service(tmp_path).artifacts("")
    files = {f["path"]: f for g in d["groups"] for f in g["files"]}
    assert files["bad.etrecord"]["error"] and files["bad.etrecord"]["program"] is None
    assert files["mlp.pte"]["program"] and files["mlp.pte"]["error"] is None


def test_folder_outside_root_refused(tmp_path):
    with pytest.raises(PathError):
        Service(tmp_path).artifacts("..")


@pytest.mark.parametrize("rel", ["x" * 5000, "y" * 300 + ".pte", "d/" * 100 + "z" * 300 + ".etdp"])
def test_unusable_request_paths_are_path_errors_without_the_root(tmp_path, rel):
    """Names the file system refuses (too long: ENAMETOOLONG) are a PathError (HTTP 400, or 404 where a
    missing folder answers first), not an OSError carrying the server's absolute path."""
    service = Service(tmp_path)
    for call in (lambda: service.pte(rel), lambda: service.etdp(rel), lambda: service.artifacts(rel)):
        with pytest.raises(PathError) as err:
            call()
        assert str(tmp_path) not in str(err.value) and err.value.status in (400, 404)
