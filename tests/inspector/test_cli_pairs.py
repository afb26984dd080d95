"""The command line on real runs with a delegate call (etlab-compiled, DemoPartitioner): strict JSON
(NaN as null) and a run given the wrong ETRecord (a warning with the evidence; --strict refuses it),
through `etlab inspect` / `report` / `compare` in a child process (all in one), as a user runs them. The runs: the
`delegate_runs` fixture (conftest)."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from etlab.inspector import Inspector, PairingError


@pytest.fixture(scope="module")
def cli(delegate_runs, tmp_path_factory) -> dict[str, dict]:
    """Every command this file checks, run once in one child process (tests/_cli_batch.py: torch imported once,
    each command's stdout, stderr and exit status its own): name -> {status, stdout, stderr}."""
    from tests._cli_batch import run_etlab

    cnn, mlp, tmp = delegate_runs["cnn"], delegate_runs["mlp"], tmp_path_factory.mktemp("pairs")
    commands = {
        "json": ["inspect", mlp / "run.etdp", "--etrecord", mlp / "model.etrecord", "--debug-buffer", mlp / "run.bin",
                 "--format", "json"],
        "wrong": ["inspect", cnn / "run.etdp", "--etrecord", mlp / "model.etrecord"],
        "wrong-strict": ["inspect", cnn / "run.etdp", "--etrecord", mlp / "model.etrecord", "--strict"],
        "right": ["inspect", cnn / "run.etdp", "--etrecord", cnn / "model.etrecord", "--strict"],
        "report": ["report", cnn / "run.etdp", "--etrecord", mlp / "model.etrecord", "-o", tmp / "r.html"],
        "report-strict": ["report", "--etdump", cnn / "run.etdp", "--etrecord", mlp / "model.etrecord",
                          "-o", tmp / "s.html", "--strict"],
        "compare": ["compare", cnn, cnn / "run.etdp", "--etrecord-b", mlp / "model.etrecord"],
        "compare-strict": ["compare", mlp, mlp / "run.etdp", "--etrecord-b", cnn / "model.etrecord", "--strict"],
        "version": ["--version"], "help": ["--help"]}
    runs = dict(zip(commands, run_etlab(list(commands.values()))))
    runs["tmp"] = {"path": tmp}
    return runs


def test_inspect_json_of_a_run_with_delegate_calls_is_strict_json(delegate_runs, cli):
    d = delegate_runs["mlp"]
    out = cli["json"]
    assert out["status"] == 0, out["stderr"]
    rows = json.loads(out["stdout"], parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in the output"))
    df = Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord")).to_dataframe()
    assert len(rows) == len(df) and list(rows[0]) == [str(c) for c in df.columns]
    # a column of delegate ids (ints) and None: a column-wise conversion made it float, None -> NaN
    ids = [r["delegate_debug_identifier"] for r in rows]
    assert ids == df["delegate_debug_identifier"].tolist() and 0 in ids and None in ids
    assert all(isinstance(i, int) for i in ids if i is not None)
    delegated = [r for r in rows if r["is_delegated_op"]]
    assert delegated and all(r["delegate_debug_identifier"] == 0 for r in delegated)
    assert [r["p50 (ms)"] for r in rows] == pytest.approx(df["p50 (ms)"].tolist())
    assert all(isinstance(r["debug_data"], list) for r in rows)  # tensors as "float32[...]" strings
    assert any(isinstance(x, str) and x.startswith("float32[") for r in rows for x in r["debug_data"])


def test_json_cells_with_nan_or_inf_are_null():
    import pandas as pd

    from etlab.inspector._cli import render

    df = pd.DataFrame({"a": [1.0, math.nan, math.inf], "b": [[1.0, math.nan], None, []], "c": [None, 1, 2]})
    assert json.loads(render(df, "json")) == [{"a": 1.0, "b": [1.0, None], "c": None},
                                              {"a": None, "b": None, "c": 1}, {"a": None, "b": [], "c": 2}]


def test_wrong_etrecord_is_a_warning_with_evidence_and_strict_refuses_it(delegate_runs, cli):
    etdp, etrecord = delegate_runs["cnn"] / "run.etdp", delegate_runs["mlp"] / "model.etrecord"
    out = cli["wrong"]
    assert out["status"] == 0, out["stderr"]
    warning = [ln for ln in out["stderr"].splitlines() if ln.startswith("etlab inspect: warning:")]
    assert len(warning) == 1, out["stderr"]
    assert f"{etdp} does not match {etrecord}" in warning[0] and "instruction 0 of 'forward'" in warning[0]
    assert "delegate call" in warning[0] and "kernel call" in warning[0]  # the evidence: what each side has there
    strict = cli["wrong-strict"]
    assert strict["status"] == 2 and strict["stdout"] == ""
    assert strict["stderr"].startswith("etlab inspect: error: ") and "does not match" in strict["stderr"]
    assert len(strict["stderr"].strip().splitlines()) == 1


def test_right_etrecord_is_silent(delegate_runs, cli):
    out = cli["right"]
    assert out["status"] == 0 and "warning" not in out["stderr"], out["stderr"]
    for d in delegate_runs.values():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord"),
                             strict=True).pairing_mismatch is None


@pytest.mark.slow  # etlab report and compare in a child process: left out of make test-fast
def test_report_and_compare_check_the_pair_too(delegate_runs, cli):
    cnn, mlp, tmp = delegate_runs["cnn"], delegate_runs["mlp"], cli["tmp"]["path"]
    report = cli["report"]  # the ETDump positional, as inspect takes it
    assert report["status"] == 0 and "etlab report: warning:" in report["stderr"]
    assert "does not match" in report["stderr"] and (tmp / "r.html").is_file()
    refused = cli["report-strict"]
    assert refused["status"] == 2 and "does not match" in refused["stderr"] and not (tmp / "s.html").exists()
    compare = cli["compare"]
    assert compare["status"] == 0 and "etlab compare: warning:" in compare["stderr"]
    assert "does not match" in compare["stderr"]
    strict = cli["compare-strict"]
    assert strict["status"] == 2 and "does not match" in strict["stderr"]
    # the other way round, in process: the MLP's delegate calls sit on the CNN's kernel calls
    with pytest.raises(PairingError, match="is a kernel call in the program but the run logged a delegate call"):
        Inspector(etdump_path=mlp / "run.etdp", etrecord=str(cnn / "model.etrecord"), strict=True)


def test_same_structure_other_operators_is_caught_by_the_recorded_ops(delegate_runs):
    """A record whose instructions are the run's (same kinds) but whose operators are not: the
    kernels the run logged disagree with the recorded ops on most calls."""
    from etlab.inspector import MethodInfo, OpInfo, ProgramInfo

    d = delegate_runs["cnn"]
    real = Inspector(etdump_path=d / "run.etdp", etrecord=str(d / "model.etrecord")).program_info.methods["forward"]
    fake_ops = {h: [OpInfo(name=f"n{h}", op_type="aten.sigmoid.default")] for h in real.ops}
    forged = ProgramInfo(methods={"forward": MethodInfo(instruction_debug_handles=real.instruction_debug_handles,
                                                        delegates=real.delegates, ops=fake_ops)})
    with pytest.warns(RuntimeWarning, match=r"kernel calls ran another operator .* records sigmoid but the run "
                                            r"called convolution"):
        Inspector(etdump_path=d / "run.etdp", etrecord=forged)
    with pytest.raises(PairingError):
        Inspector(etdump_path=d / "run.etdp", etrecord=forged, strict=True)


def test_etlab_version_and_help_name_the_real_usage(cli):
    out = cli["version"]
    assert out["status"] == 0 and out["stdout"].startswith("etlab ") and out["stdout"].split()[1][0].isdigit()
    usage = cli["help"]["stdout"]
    assert "etlab inspect RUN.etdp" in usage and "inspect --etdump" not in usage


def test_missing_or_directory_etrecord_is_one_plain_line(delegate_runs, tmp_path, capsys):
    from etlab.inspector._cli import inspect_main

    etdp = delegate_runs["mlp"] / "run.etdp"
    for record, why in ((tmp_path / "missing.etrecord", "no such file"), (tmp_path, "is a directory, not a file")):
        assert inspect_main([str(etdp), "--etrecord", str(record)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"etlab inspect: error: --etrecord {record}: {why}"]
