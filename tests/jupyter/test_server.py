"""The server extension's endpoints on a real server: JSON per file kind, paths confined to the
root, a corrupt file answered with the reader's FormatError message, the server up afterwards; the
extension listed as enabled by the venv's own `jupyter` after `make setup`, and shipped in a wheel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from etlab.errors import FormatError
from etlab.schema import load_file
from tests.jupyter.conftest import VENV_BIN

pytestmark = pytest.mark.xdist_group("jupyter")
REPO = Path(__file__).resolve().parents[2]


def test_views_as_json(lab, lab_files):
    status, pte = lab.get_json("etlab/api/view/pte?path=mlp.pte")
    assert status == 200
    assert pte["methods"][0]["name"] == "forward"
    assert [d["backend"] for d in pte["methods"][0]["delegates"]] == ["DemoBackend"] * 3
    assert len(pte["graph"]["nodes"]) == 7 and len(pte["memory"]) == 6 and pte["steps"] == 5
    status, run = lab.get_json("etlab/api/view/etdp?path=run.etdp")
    assert status == 200 and run["program"] == "mlp.etrecord" and run["mismatch"] is None
    assert run["graphs"] == [] and run["graphs_pending"]  # the ETRecord's graphs come in a second request
    status, graphs = lab.get_json("etlab/api/view/etdp?path=run.etdp&part=graphs")
    assert status == 200 and {g["kind"] for g in graphs["graphs"]} == {"aten", "edge"}
    assert all(n["latency"] for g in graphs["graphs"] for n in g["nodes"] if n["kind"] == "op")
    status, with_pte = lab.get_json("etlab/api/view/etdp?path=run.etdp&program=mlp.pte")
    assert status == 200 and not with_pte["graphs_pending"] and len(with_pte["graphs"][0]["nodes"]) == 7
    assert run["runs"] == lab_files.runs
    assert run["memory_source"] == "mlp.pte" and len(run["memory"]) == len(pte["memory"])
    assert len(run["spans"]) == len(run["rows"]) * lab_files.runs
    status, rec = lab.get_json("etlab/api/view/etrecord?path=mlp.etrecord")
    assert status == 200 and rec["kinds"] == ["aten", "edge"] and rec["signature"] == pte["signature"]
    status, b = lab.get_json("etlab/api/view/bpte?path=mlp.bpte")
    assert status == 200 and len(b["suites"][0]["cases"]) == 3 and b["signature"] == pte["signature"]


def test_dashboard_graphs_gaps_from_the_buffer_beside_and_delegate_time_once(lab):
    """run.bin beside run.etdp gives the numeric-gap overlay its data (run2 has none); on each graph the
    nodes of a delegate call sum to the call's p50."""
    _, run = lab.get_json("etlab/api/view/etdp?path=run.etdp")
    calls = [r for r in run["rows"] if r["name"] == "DELEGATE_CALL"]
    assert len(calls) == 3
    status, graphs = lab.get_json("etlab/api/view/etdp?path=run.etdp&part=graphs")
    assert status == 200 and graphs["graphs"]
    for g in graphs["graphs"]:
        assert any(n["gap"] is not None for n in g["nodes"]), g["kind"]
        for call in calls:
            nodes = [n for n in g["nodes"] if set(n["handles"]) & set(call["handles"])]
            assert sum(n["latency"]["p50"] for n in nodes) == pytest.approx(call["p50"], rel=1e-6), g["kind"]
    _, other = lab.get_json("etlab/api/view/etdp?path=run2.etdp&part=graphs")
    assert all(n["gap"] is None for g in other["graphs"] for n in g["nodes"])


def test_mismatched_pair_is_named(lab):
    status, run = lab.get_json("etlab/api/view/etdp?path=other_run.etdp&program=mlp.etrecord")
    assert status == 200 and run["program"] is None
    assert "other_run.etdp does not match mlp.etrecord" in run["mismatch"]
    status, auto = lab.get_json("etlab/api/view/etdp?path=other_run.etdp")
    assert auto["program"] is None and auto["candidates"] == ["mlp.etrecord", "corrupt.pte", "mlp.pte"]


@pytest.mark.parametrize("path, code", [("../etc/passwd", 403), ("/etc/passwd", 400), ("nope.pte", 404),
                                        ("mlp.etrecord", 400)])
def test_paths_confined_to_root(lab, path, code):
    status, body = lab.get_json(f"etlab/api/view/pte?path={path}")
    assert status == code and body["error"]


def test_symlink_out_of_root_refused(lab, lab_files, tmp_path):
    outside = tmp_path / "secret.pte"
    outside.write_bytes((lab_files.root / "mlp.pte").read_bytes())
    link = lab_files.root / "link.pte"
    link.symlink_to(outside)
    try:
        status, body = lab.get_json("etlab/api/view/pte?path=link.pte")
        assert status == 403 and "outside" in body["error"]
        _, listing = lab.get_json("etlab/api/artifacts")
        assert "link.pte" not in {f["path"] for g in listing["groups"] for f in g["files"]}
    finally:
        link.unlink()


def test_corrupt_file_is_a_json_error_and_the_server_stays_up(lab, lab_files):
    with pytest.raises(FormatError) as e:
        load_file(lab_files.root / "corrupt.pte", what="corrupt.pte")
    status, body = lab.get_json("etlab/api/view/pte?path=corrupt.pte")
    assert status == 422 and body["error"] == str(e.value)
    assert lab.alive()
    status, _ = lab.get_json("etlab/api/view/pte?path=mlp.pte")
    assert status == 200


def test_artifacts_grouped_by_program(lab):
    status, d = lab.get_json("etlab/api/artifacts")
    assert status == 200
    groups = {g["program"]: sorted(f["path"] for f in g["files"]) for g in d["groups"]}
    mlp = next(files for files in groups.values() if "mlp.pte" in files)
    assert mlp == ["mlp.bpte", "mlp.etrecord", "mlp.pte", "run.etdp", "run2.etdp"]
    assert sorted(groups[None]) == ["corrupt.pte", "other_run.etdp"]


def test_compare_two_runs(lab):
    status, d = lab.get_json("etlab/api/compare?a=run.etdp&b=run2.etdp&program=mlp.pte")
    assert status == 200 and d["rows"] and all(r["ratio"] is None or r["ratio"] > 0 for r in d["rows"])
    assert d["warning"].startswith("Run A captured intermediate outputs and run B did not")  # run.bin: A logged
    assert d["graphs"][0]["latency_center"] == 1.0
    assert sum(1 for n in d["graphs"][0]["nodes"] if n["latency"]) == 5
    status, bad = lab.get_json("etlab/api/compare?a=run.etdp&b=other_run.etdp")
    assert status == 422 and "different programs" in bad["error"]


def test_verify_bundled_program(lab):
    status, r = lab.get_json("etlab/api/verify?path=mlp.bpte", method="POST")
    assert status == 200 and [c["ok"] for c in r["cases"]] == [True, True, False]


def _plain(out: subprocess.CompletedProcess) -> str:
    """stdout + stderr without terminal colors."""
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)


def _venv_jupyter(*args: str) -> str:
    """`jupyter ARGS` from the Makefile's venv as a user runs it (the environment untouched), its output."""
    out = subprocess.run([str(VENV_BIN / "jupyter"), *args], capture_output=True, text=True, timeout=120)
    return _plain(out)


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_set_up_venv_lists_the_extensions_enabled(lab):
    """`make setup` left both halves enabled in the venv itself: no JUPYTER_PATH, no config of the test's."""
    labext = _venv_jupyter("labextension", "list")
    assert re.search(r"etlab-labextension v0\.1\.0 enabled\s+OK \(python, etlab\)", labext), labext
    server = _venv_jupyter("server", "extension", "list")
    assert re.search(r"etlab\.jupyter enabled\s*\n\s*- Validating etlab\.jupyter\.\.\.\s*\n\s*etlab\.jupyter\s+OK",
                     server), server
    # and the server `make lab-server` started loaded it and serves the lab extension's files
    assert "etlab.jupyter | extension was successfully loaded" in lab.log()
    with urllib.request.urlopen(lab.url("lab/api/extensions"), timeout=30) as r:
        names = {e["name"]: e for e in json.loads(r.read())}
    assert names["etlab-labextension"]["enabled"] and names["etlab-labextension"]["status"] == "ok"


@pytest.mark.slow
def test_wheel_ships_the_prebuilt_extension(lab, tmp_path):
    """A wheel of etlab carries the built extension and the server config where pip installs them.

    The wheel's Python half only (ETLAB_NO_NATIVE=1): compiling the native core again takes minutes on a
    busy machine and proves nothing here; `make wheel-check` builds and installs the whole wheel from a
    clean clone with an isolated build (tests/wheelcheck/clean_clone_wheel.py)."""
    from etlab.jupyter._launch import built_labextension

    built_labextension()
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=3600,
                         env={**os.environ, "ETLAB_NO_NATIVE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    wheel = next(tmp_path.glob("etlab-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "etlab/cli.py" in names and "etlab/jupyter/labextension/package.json" in names
    data = [n for n in names if ".data/data/" in n]
    assert any(n.endswith("share/jupyter/labextensions/etlab-labextension/package.json") for n in data)
    assert any("share/jupyter/labextensions/etlab-labextension/static/remoteEntry." in n for n in data)
    assert any(n.endswith("etc/jupyter/jupyter_server_config.d/etlab.json") for n in data)
    prefix = tmp_path / "prefix"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q",
                          "--prefix", str(prefix), str(wheel)], capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-2000:]
    env = {**os.environ, "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
           "JUPYTER_CONFIG_PATH": str(prefix / "etc" / "jupyter"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert "etlab-labextension v0.1.0 enabled OK (python, etlab)" in _plain(out), _plain(out)
