"""Inspector.compare / `etlab compare` across runtimes: upstream ExecuTorch's runtime and etlab's
host runtime, each running the same upstream-exported portable .pte with intermediate outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etlab.inspector import Inspector
from etlab.runtime import Runtime
from tests.interop.conftest import ITERS, REPO

pytestmark = pytest.mark.interop

MODELS = ("mlp", "cnn")


@pytest.fixture(scope="module")
def host_runs(upstream_artifacts, tmp_path_factory) -> dict[str, Path]:
    """etlab's runtime on each upstream .pte (same inputs, same number of iterations): a folder with
    run.etdp and run.bin per model."""
    out = {}
    for m in MODELS:
        d = upstream_artifacts[m]
        folder = tmp_path_factory.mktemp(f"host_{m}")
        inputs = torch.load(d / "inputs.pt", weights_only=True)
        program = Runtime.get().load_program(d / "model.pte", enable_etdump=True, debug_buffer_size=16 << 20)
        method = program.load_method("forward")
        for _ in range(ITERS):
            method.execute(list(inputs))
        program.write_etdump_result_to_file(folder / "run.etdp", folder / "run.bin")
        out[m] = folder
    return out


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
    """The upstream folder holds upstream's .etrecord, which etlab does not read: the CLI says so
    and compares the runs without it."""
    d, h = upstream_artifacts["mlp"], host_runs["mlp"]
    out = subprocess.run([sys.executable, "-m", "etlab.cli", "compare", str(d), str(h), "--json",
                          str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert "warning" in out.stderr and "model.etrecord" in out.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["by"] == "event" and data["rows"] and all(r["present"] == "both" for r in data["rows"])
    assert all(r["max_abs"] is not None and r["relative"] <= 1e-5 for r in data["rows"])
