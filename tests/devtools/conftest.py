"""Fixtures for the devtools tests: small compiled programs, shared per session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from etlab.compiler import to_edge, to_edge_transform_and_lower
from etlab.compiler.backends import DemoPartitioner
from etlab.models import make_cond, make_mlp

REPO = Path(__file__).resolve().parents[2]
SETUP_SH = REPO.parent / "shared" / "reference" / "setup.sh"


@pytest.fixture(scope="session")
def mlp():
    """(module, inputs, ExecutorchProgramManager) of the zoo MLP, no delegation."""
    module, inputs = make_mlp()
    et = to_edge(torch.export.export(module, tuple(inputs))).to_executorch()
    return module, inputs, et


@pytest.fixture(scope="session")
def mlp_lowered():
    """The zoo MLP's edge program with its linear layers delegated to the demo backend."""
    module, inputs = make_mlp()
    return to_edge_transform_and_lower(torch.export.export(module, tuple(inputs)), partitioner=[DemoPartitioner()])


@pytest.fixture(scope="session")
def cond_program():
    """A program whose cond outputs share storage with what each branch returns."""
    module, inputs = make_cond()
    return to_edge(torch.export.export(module, tuple(inputs))).to_executorch()


@pytest.fixture(scope="session")
def ref_python() -> str:
    """The upstream reference python (setup.sh's last line); any failure fails the test."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    try:
        p = subprocess.run(["bash", str(SETUP_SH)], capture_output=True, text=True, timeout=1800, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"could not run {SETUP_SH}: {e}", pytrace=False)
    lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
    py = lines[-1] if lines else ""
    if p.returncode != 0 or not os.access(py, os.X_OK):
        pytest.fail(f"{SETUP_SH} failed (exit {p.returncode}, printed {py!r}):\n{p.stderr[-3000:]}", pytrace=False)
    return py
