"""Exports of a real run with delegate calls: `to_dataframe().to_parquet()` (tensors as {dtype,
shape, data}), `etlab inspect --format parquet` / `compare --parquet` through the CLI, and a Chrome
trace with each op once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from etlab.inspector import Inspector

REPO = Path(__file__).resolve().parents[2]


def _inspector(d: Path) -> Inspector:
    return Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord"), debug_buffer_path=d / "run.bin")


def test_to_parquet_keeps_the_debug_tensors(delegate_runs, tmp_path):
    df = _inspector(delegate_runs["cnn"]).to_dataframe()
    df.to_parquet(tmp_path / "run.parquet")
    back = pd.read_parquet(tmp_path / "run.parquet")
    assert back.shape == df.shape and back["event_name"].tolist() == df["event_name"].tolist()
    checked = 0
    for ours, theirs in zip(df["debug_data"], back["debug_data"]):
        assert len(ours) == len(theirs)
        for t, rec in zip(ours, theirs):
            assert rec["dtype"] == str(t.dtype).replace("torch.", "") and list(rec["shape"]) == list(t.shape)
            got = np.frombuffer(rec["data"], dtype=str(t.dtype).replace("torch.", "")).reshape(list(t.shape))
            assert torch.equal(torch.from_numpy(got.copy()), t)
            checked += 1
    assert checked > 10
    assert isinstance(df.head(3), pd.DataFrame)  # a DataFrame (a TensorFrame), also once sliced
    df.head(3).to_parquet(tmp_path / "head.parquet")


def _etlab(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etlab.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_cli_writes_parquet_for_inspect_and_compare(delegate_runs, tmp_path):
    d = delegate_runs["mlp"]
    out = _etlab("inspect", d / "run.etdp", "--etrecord", d / "model.etrecord", "--debug-buffer", d / "run.bin",
                 "--format", "parquet", "-o", tmp_path / "i.parquet")
    assert out.returncode == 0 and out.stdout == "", out.stderr
    frame = pd.read_parquet(tmp_path / "i.parquet")
    assert frame["event_name"].tolist() == _inspector(d).to_dataframe()["event_name"].tolist()
    refused = _etlab("inspect", d / "run.etdp", "--format", "parquet")
    assert refused.returncode == 2 and "-o" in refused.stderr
    cmp = _etlab("compare", d, d, "--parquet", tmp_path / "c.parquet", "--json", tmp_path / "c.json")
    assert cmp.returncode == 0, cmp.stderr
    rows = pd.read_parquet(tmp_path / "c.parquet")
    assert len(rows) == len(json.loads((tmp_path / "c.json").read_text())["rows"]) > 0


def test_chrome_trace_has_each_kernel_once(delegate_runs):
    ins = _inspector(delegate_runs["cnn"])
    trace = ins.to_chrome_trace()
    names = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]
    kernels = [e.name for b in ins.event_blocks for e in b.events if e.name.startswith("native_call_")]
    assert "OPERATOR_CALL" not in names
    assert sorted(n for n in names if n.startswith("native_call_")) == sorted(kernels) and kernels
