"""A .bpte written by etlab.devtools is loaded and verified by upstream ExecuTorch's runtime."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from etlab.devtools import BundledProgram, MethodTestCase, MethodTestSuite, serialize_from_bundled_program_to_flatbuffer

REF_BUNDLED = Path(__file__).resolve().parents[1] / "interop" / "ref_bundled.py"


@pytest.mark.interop
def test_upstream_verifies_our_bpte(ref_python, mlp, tmp_path):
    module, inputs, et = mlp
    cases = []
    for seed in (0, 1):
        x = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            cases.append(MethodTestCase([x], module(x)))
    with torch.no_grad():
        wrong = module(inputs[0]) + 1.0  # deliberately wrong: upstream must report a mismatch
    cases.append(MethodTestCase([inputs[0]], wrong))
    bpte = tmp_path / "ours.bpte"
    bpte.write_bytes(serialize_from_bundled_program_to_flatbuffer(
        BundledProgram(et, [MethodTestSuite("forward", cases)])))
    out = tmp_path / "ours.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    p = subprocess.run([ref_python, str(REF_BUNDLED), str(bpte), "--json", str(out)], capture_output=True,
                       text=True, timeout=600, env=env)
    assert p.returncode == 0, f"ref_bundled.py failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert report["method"] == "forward"
    assert [c["passed"] for c in report["cases"]] == [True, True, False]
