"""Inspector.compare / `etlab compare` across runtimes: upstream ExecuTorch's runtime and etlab's
host runtime, each running the same portable .pte with intermediate outputs: upstream-exported
(no ETRecord etlab reads: events pair by name), and etlab-compiled (its ETRecord on both sides:
rows join by debug handle)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etlab.compiler import to_edge
from etlab.inspector import Inspector
from etlab.models import make_mlp
from etlab.runtime import Runtime
from tests.interop.conftest import ET_REF, ITERS, REPO, run_ref
from tests.interop.test_inspector import xnnpack_run  # noqa: F401  (fixture: upstream's XNNPACK CNN, cached)

pytestmark = pytest.mark.interop

MODELS = ("mlp", "cnn")


def host_run(pte: Path, inputs: Path, folder: Path) -> Path:
    """etlab's runtime on `pte` (ITERS runs, intermediates recorded); the folder with run.etdp, run.bin."""
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=16 << 20)
    method = program.load_method("forward")
    for _ in range(ITERS):
        method.execute(list(torch.load(inputs, weights_only=True)))
    program.write_etdump_result_to_file(folder / "run.etdp", folder / "run.bin")
    return folder


@pytest.fixture(scope="module")
def host_runs(upstream_artifacts, tmp_path_factory) -> dict[str, Path]:
    """etlab's runtime on each upstream .pte (same inputs, same number of iterations)."""
    return {m: host_run(upstream_artifacts[m] / "model.pte", upstream_artifacts[m] / "inputs.pt",
                        tmp_path_factory.mktemp(f"host_{m}")) for m in MODELS}


@pytest.mark.parametrize("model", MODELS)
def test_upstream_runtime_vs_etlab_host_same_program(model, upstream_artifacts, host_runs):
    d, h = upstream_artifacts[model], host_runs[model]
    upstream = Inspector(etdump_path=d / "run.etdp", debug_buffer_path=d / "run.bin")
    host = Inspector(etdump_path=h / "run.etdp", debug_buffer_path=h / "run.bin")
    c = upstream.compare(host, name_a="upstream", name_b="etlab host")
    kernels = [e for b in upstream.event_blocks if b.name != "Default" for e in b.events
               if e.name.startswith("native_call_")]
    assert c.by == "event"  # no ETRecord here: the events pair by name and occurrence
    assert len(c.rows) == len(kernels) > 0 and all(r.present == "both" for r in c.rows)
    assert all(r.instructions_a == r.instructions_b for r in c.rows)  # the same instruction on both sides
    assert all(r.runs_a == r.runs_b == ITERS and r.ratio > 0 for r in c.rows)
    # the same kernels on the same inputs: every intermediate output agrees
    assert c.summary.compared_outputs == len(c.rows)
    assert all(r.relative <= 1e-5 and r.cosine == pytest.approx(1.0, abs=1e-6) for r in c.rows), \
        [(r.key, r.relative) for r in c.rows if r.relative > 1e-5]
    assert c.summary.total_a > 0 and c.summary.total_b > 0
    by_instruction = upstream.compare(host, by="instruction")
    assert [r.instructions_a for r in by_instruction.rows] == [r.instructions_a for r in c.rows]


def test_cli_on_an_upstream_run_folder(upstream_artifacts, host_runs, tmp_path):
    """The upstream folder holds upstream's .etrecord, which etlab reads (without pickle): the CLI
    picks it up without a warning and compares the runs."""
    d, h = upstream_artifacts["mlp"], host_runs["mlp"]
    out = subprocess.run([sys.executable, "-m", "etlab.cli", "compare", str(d), str(h), "--json",
                          str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["by"] == "event" and data["rows"] and all(r["present"] == "both" for r in data["rows"])
    assert all(r["max_abs"] is not None and r["relative"] <= 1e-5 for r in data["rows"])


def test_etlab_program_on_both_runtimes_joins_by_debug_handle(ref_python, tmp_path):
    """An etlab-compiled MLP run by upstream's runtime and by etlab's, both read with etlab's ETRecord."""
    model, inputs = make_mlp()
    manager = to_edge(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    manager.write_to_file(tmp_path / "model.pte")
    torch.save(list(inputs), tmp_path / "inputs.pt")
    record = manager.get_etrecord()
    up, host = tmp_path / "upstream", tmp_path / "host"
    up.mkdir()
    host.mkdir()
    run_ref(ref_python, ET_REF, "run", tmp_path / "model.pte", "--inputs", tmp_path / "inputs.pt", "--etdump",
            up / "run.etdp", "--debug-buffer", up / "run.bin", "--debug-buffer-size", str(16 << 20),
            "--iters", str(ITERS))
    host_run(tmp_path / "model.pte", tmp_path / "inputs.pt", host)
    sides = [Inspector(etdump_path=d / "run.etdp", debug_buffer_path=d / "run.bin", etrecord=record)
             for d in (up, host)]
    c = sides[0].compare(sides[1], name_a="upstream runtime", name_b="etlab host")
    assert c.by == "debug_handle" and c.rows and all(r.present == "both" and r.handles for r in c.rows)
    assert {h for r in c.rows for h in r.handles} == set(record.program_info().methods["forward"].ops)
    assert c.summary.compared_outputs == len(c.rows)
    assert all(r.relative <= 1e-5 for r in c.rows), [(r.key, r.relative) for r in c.rows if r.relative > 1e-5]


def test_upstream_portable_vs_xnnpack_builds_join_each_xnnpack_node_to_its_kernels(upstream_artifacts, xnnpack_run,  # noqa: F811
                                                                                     tmp_path):
    """Upstream's portable CNN against its XNNPACK build (each folder: .pte, .etrecord, .etdp): the
    XNNPACK runtime names its events after operators and the ETRecord has no debug map for them; the
    .pte beside the run places each on its node, so every op row joins the portable kernels it
    replaced (conv + batch norm + clamp in one XNNPACK convolution). Only the layout transposes XNNPACK
    added have no portable counterpart."""
    out = subprocess.run([sys.executable, "-m", "etlab.cli", "compare", str(upstream_artifacts["cnn"]),
                          str(xnnpack_run), "--json", str(tmp_path / "c.json")], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr, out.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    rows = data["rows"]
    only_b = [r for r in rows if r["present"] == "b"]
    assert all("Transpose" in " ".join(r["events_b"]) for r in only_b), only_b
    assert not [r for r in rows if r["present"] == "a"]
    assert data["summary"]["matched_pct"] >= 90
    xnn = [r for r in rows if r["present"] == "both" and r["backend_b"] == "XnnpackBackend"]
    assert len(xnn) >= 19
    first = next(r for r in xnn if any("Convolution" in e for e in r["events_b"]))
    assert {"aten.convolution.default", "aten.hardtanh.default"} <= set(first["ops"])
    assert len(first["events_a"]) == 3 and len(first["events_b"]) == 1
