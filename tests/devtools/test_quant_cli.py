"""`etlab quant report|fix` through a subprocess, as a user runs it: zoo names, module:function models, the
outputs it writes, budgets as exit statuses, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torchao")


def _etlab(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etlab.cli", "quant", *map(str, args)], capture_output=True,
                          text=True, timeout=900, cwd=cwd)


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    """A user's file: a function returning (model, dataset), the dataset a list of (x,) tuples."""
    d = tmp_path_factory.mktemp("quant_cli")
    (d / "mymodel.py").write_text(textwrap.dedent('''
        import torch

        def build():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
            data = [(torch.randn(1, 16),) for _ in range(12)]
            return model, data

        def not_a_pair():
            return 3
    '''))
    return d


def test_report_zoo_model_writes_json_html_csv(tmp_path):
    out = tmp_path / "r.json"
    p = _etlab("report", "mlp", "--inputs", 12, "--calibration", 4, "--backend", "portable", "--json", out,
               "--html", tmp_path / "r.html", "--csv", tmp_path / "r.csv", "--no-progress", "--top", 3)
    assert p.returncode == 0, p.stderr
    assert "12 inputs through the portable program on etlab's runtime" in p.stdout
    assert "Layers that introduced the most error" in p.stdout and "Calibrated ranges clipped" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["model"] == "mlp" and doc["output"]["inputs"] == 12 and len(doc["per_input"]) == 12
    assert {"layer", "local_sqnr_p95", "clipped_inputs"} <= set(doc["layers"][0])
    assert doc["coverage"] and doc["budget"] is None
    assert "Quantization over 12 inputs" in (tmp_path / "r.html").read_text()
    assert (tmp_path / "r.csv").read_text().startswith("order,layer,")


@pytest.mark.slow  # three etlab processes (over 5 s of CPU): left out of make test-fast
def test_report_user_function_and_budget_exit_status(user_model):
    spec = f"{user_model / 'mymodel.py'}:build"
    p = _etlab("report", spec, "--budget", "top1>=0.5", "--no-progress", "--backend", "xnnpack")
    assert p.returncode == 0, p.stderr
    assert "the given dataset" in p.stdout and "12 inputs through the xnnpack program" in p.stdout
    assert "budget top1>=0.5: top1" in p.stdout and "-> met" in p.stdout
    missed = _etlab("report", spec, "--budget", "min_sqnr>=200dB", "--no-progress", "--backend", "none")
    assert missed.returncode == 1, missed.stderr
    assert "MISSED" in missed.stdout and "through the converted graph in torch" in missed.stdout
    # module:function by import path (the folder on sys.path)
    by_module = _etlab("report", "mymodel:build", "--inputs", 3, "--no-progress", "--backend", "none",
                       cwd=user_model)
    assert by_module.returncode == 0, by_module.stderr
    assert "3 inputs through" in by_module.stdout


ERRORS = [
    (["report", "no_such_model"], "not a zoo model"),
    (["report", "nowhere/file.py:build"], "no such file"),
    (["report", "mlp", "--budget", "top1>=2"], "budget"),
    (["report", "mlp", "--inputs", "0"], "--inputs must be >= 1"),
    (["report", "mlp", "--html", "/no/such/folder/r.html"], "does not exist"),
    (["report", "mlp", "--pte", "/no/such.pte"], "no such file"),
]


@pytest.fixture(scope="module")
def error_runs() -> list[dict]:
    """Every ERRORS command as `etlab quant ...` in one child process (tests/_cli_batch.py: torch imported once)."""
    from tests._cli_batch import run_etlab

    return run_etlab([["quant", *args, "--no-progress"] for args, _ in ERRORS])


@pytest.mark.parametrize("case", range(len(ERRORS)), ids=[message for _, message in ERRORS])
def test_errors_are_one_line(error_runs, case):
    p, message = error_runs[case], ERRORS[case][1]
    assert p["status"] == 2, (p["stdout"], p["stderr"])
    lines = p["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etlab quant: error:") and message in lines[0], p["stderr"]


def test_function_must_return_a_pair(user_model):
    p = _etlab("report", f"{user_model / 'mymodel.py'}:not_a_pair", "--no-progress")
    assert p.returncode == 2 and "must return (model, data)" in p.stderr


@pytest.mark.slow  # the search compiles and runs several programs: left out of make test-fast
def test_fix_meets_a_budget_and_writes_the_program(tmp_path):
    pte, doc = tmp_path / "mlp.pte", tmp_path / "fix.json"
    p = _etlab("fix", "mlp", "--budget", "top1>=0.9", "--inputs", 8, "--calibration", 4, "--backend", "portable",
               "-o", pte, "--json", doc, "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "budget top1>=0.9 met" in p.stdout
    result = json.loads(doc.read_text())
    assert result["met"] is True and result["budget"] == "top1>=0.9"
    assert pte.read_bytes()[4:8] == b"ET12"
    # the written program is what `etlab quant report --pte` runs
    r = _etlab("report", "mlp", "--inputs", 4, "--pte", pte, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert f"through {pte} on etlab's runtime" in r.stdout
