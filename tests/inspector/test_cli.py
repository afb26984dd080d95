"""`python -m etlab.inspector` (subprocess) and `inspect_main` (the `etlab inspect` logic)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from etlab.inspector._cli import inspect_main, module_main


def _module(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etlab.inspector", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_module_cli_prints_table_and_tsv(synthetic_files, tmp_path):
    etdp, buf = synthetic_files
    p = _module("--etdump_path", etdp, "--debug_buffer_path", buf, "--tsv_path", tmp_path / "t.tsv",
                "--target_time_scale", "us")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert "native_call_addmm.out" in p.stdout and "p50 (us)" in p.stdout and "OPERATOR_CALL" not in p.stdout
    assert "p50 (us)" in pd.read_csv(tmp_path / "t.tsv", sep="\t").columns


@pytest.mark.parametrize("case", ["missing", "no_args"])
def test_module_cli_errors_are_one_line(case, tmp_path):
    args = ["--etdump_path", tmp_path / "nope.etdp"] if case == "missing" else []
    p = _module(*args)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etlab.inspector: error: "), p.stderr
    if case == "missing":
        assert "nope.etdp" in lines[0]


@pytest.mark.parametrize("case", ["wrong_format", "bad_scale", "bad_etrecord"])
def test_module_main_errors_in_process(case, synthetic_files, tmp_path, capsys):
    etdp, buf = synthetic_files
    garbage = tmp_path / "garbage.etrecord"
    garbage.write_bytes(b"not a zip")
    args = {
        "wrong_format": ["--etdump_path", buf],
        "bad_scale": ["--etdump_path", etdp, "--target_time_scale", "hours"],
        "bad_etrecord": ["--etdump_path", etdp, "--etrecord_path", garbage],
    }[case]
    assert module_main([str(a) for a in args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etlab.inspector: error: "), captured.err
    if case == "wrong_format":
        assert str(buf) in lines[0] and "ED00" in lines[0]


def test_inspect_main_formats(synthetic_files, tmp_path, capsys):
    etdp, buf = synthetic_files
    out = tmp_path / "rows.json"
    trace = tmp_path / "trace.json"
    assert inspect_main([str(etdp), "--debug-buffer", str(buf), "--format", "json", "-o", str(out),
                         "--chrome-trace", str(trace)]) == 0
    rows = json.loads(out.read_text())
    kernel = next(r for r in rows if r["event_name"] == "native_call_addmm.out")
    assert kernel["debug_data"] == ["float32[16]"] and len(kernel["raw"]) == 3
    assert any(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])
    assert inspect_main([str(etdp), "--format", "csv"]) == 0
    csv_text = capsys.readouterr().out
    assert csv_text.splitlines()[0].startswith("event_block_name,event_name,raw,p10 (ms)")
    assert inspect_main([str(etdp)]) == 0
    table = capsys.readouterr().out
    assert "native_call_relu.out" in table and "OPERATOR_CALL" not in table
    assert inspect_main([str(etdp), "--format", "tsv"]) == 0
    assert "\tp50 (ms)\t" in capsys.readouterr().out


def test_inspect_main_errors(tmp_path, capsys):
    assert inspect_main([str(tmp_path / "missing.etdp")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.etdp" in err[0]
    assert inspect_main(["--format", "xml", "x.etdp"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
