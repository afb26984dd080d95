"""`etlab inspect`'s default table fits a terminal: the slowest events, few columns, cut cells."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from etlab.inspector import Inspector
from etlab.inspector._terminal import compact_table, short_ops

REPO = Path(__file__).resolve().parents[2]


def test_short_ops():
    assert short_ops(["aten.convolution.default", "aten._native_batch_norm_legit_no_training.default",
                      "aten.convolution.default"]) == "convolution, batch_norm_legit_no_training"
    assert short_ops([]) == "" and short_ops(None) == ""


@pytest.mark.parametrize("width", [60, 80, 120])
def test_compact_table_fits_the_width_and_keeps_the_slowest(delegate_runs, width):
    d = delegate_runs["cnn"]
    df = Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord")).to_dataframe()
    text = compact_table(df, width, top=10)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    n = int((df.event_name != "OPERATOR_CALL").sum())
    assert lines[-1].startswith(f"(10 of {n} events: the slowest by average, in run order")
    body = lines[2:-1]
    assert len(body) == 10 and not any("OPERATOR_CALL" in line for line in body)
    assert f"{df['avg (ms)'].max():.4g}" in text  # the slowest event is listed
    every = compact_table(df, width, top=None).splitlines()
    assert len(every) == 2 + int((df.event_name != "OPERATOR_CALL").sum())


def test_cli_default_table_fits_120_columns(delegate_runs):
    d = delegate_runs["cnn"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("COLUMNS", None)
    out = subprocess.run([sys.executable, "-m", "etlab.cli", "inspect", str(d / "run.etdp"), "--etrecord",
                          str(d / "model.etrecord")], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 120
    assert lines[0].split()[:2] == ["block", "event"] and "--all" in lines[-1]
    assert "convolution" in out.stdout


@pytest.mark.parametrize("width", [80, 120])
def test_compare_table_fits_the_width(delegate_runs, width):
    from etlab.inspector._cli import compare_table

    ins = [Inspector(etdump_path=delegate_runs[m] / "run.etdp", etrecord=str(delegate_runs[m] / "model.etrecord"))
           for m in ("cnn", "cnn")]
    c = ins[0].compare(ins[1], name_a=str(delegate_runs["cnn"] / "a" / ("x" * 150)), name_b="b")
    lines = compare_table(c, top=20, width=width).splitlines()
    assert max(len(line) for line in lines) <= width
    assert any(line.startswith("row ") for line in lines) and "max|B-A|" not in " ".join(lines)  # no outputs here
