"""Every `etlab` command as a user types it (subprocess): a reader that goes away (`| head`) ends it without a
traceback; a missing or directory file argument is one line naming the argument; a file to write in a
folder that does not exist is refused, not a new tree; progress only on stderr (with --progress, or on a
terminal); `etlab run --threads N` recorded in the ETDump; every option has help. (Each command's default
output within 120 columns, these invocations on the CNN's files included: test_cli_width_all.py, all in one
process.) The runs: the `delegate_runs` fixture (conftest)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _etlab(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "etlab.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env or ENV)


def _commands(d: Path, tmp: Path) -> dict[str, list]:
    """One invocation of each command that prints to stdout, on the MLP's files."""
    return {
        "info": ["info", d / "model.pte"],
        "inspect": ["inspect", d / "run.etdp", "--etrecord", d / "model.etrecord", "--all"],
        "inspect-json": ["inspect", d / "run.etdp", "--format", "json"],
        "compare": ["compare", d, d],
        "report": ["report", d / "run.etdp", "-o", tmp / "r.html"],
        "run": ["run", d / "model.pte", "--runs", "2"],
        "help": ["--help"],
    }


@pytest.mark.parametrize("command", ["info", "inspect", "inspect-json", "compare", "report", "run", "help"])
def test_a_closed_pipe_ends_the_command_quietly(delegate_runs, tmp_path, command):
    """The reader closes its end before the command writes (as `| head -0` would): no traceback, no
    'Exception ignored' at exit, the status of a process ended by SIGPIPE."""
    args = _commands(delegate_runs["mlp"], tmp_path)[command]
    p = subprocess.Popen([sys.executable, "-m", "etlab.cli", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV)
    p.stdout.close()
    _, err = p.communicate(timeout=600)
    err = err.decode()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert p.returncode == (141 if command != "help" else 0), err  # argparse's --help ignores a closed stdout


def _bad_inputs(d: Path, missing: Path, folder: Path) -> list[tuple[list, str]]:
    """(command line, the argument its error must name) for every file argument of every command."""
    etdp, rec, pte = d / "run.etdp", d / "model.etrecord", d / "model.pte"
    cases = []
    for bad in (missing, folder):
        cases += [
            (["info", pte, "--etrecord", bad], "--etrecord"),
            (["inspect", etdp, "--etrecord", bad], "--etrecord"),
            (["inspect", etdp, "--debug-buffer", bad], "--debug-buffer"),
            (["inspect", etdp, "--pte", bad], "--pte"),
            (["compare", etdp, etdp, "--etrecord-a", bad], "--etrecord-a"),
            (["compare", etdp, etdp, "--debug-buffer-b", bad], "--debug-buffer-b"),
            (["compare", etdp, etdp, "--pte-b", bad], "--pte-b"),
            (["report", etdp, "--etrecord", bad, "-o", folder / "r.html"], "--etrecord"),
            (["report", etdp, "--debug-buffer", bad, "-o", folder / "r.html"], "--debug-buffer"),
            (["report", etdp, "--etrecord", rec, "--pte", bad, "-o", folder / "r.html"], "--pte"),
            (["run", pte, "--data", bad], "--data"),
        ]
    return cases


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_missing_or_directory_file_arguments_are_one_line_naming_the_argument(delegate_runs, tmp_path):
    missing, folder = tmp_path / "missing.bin", tmp_path / "folder"
    folder.mkdir()
    for args, flag in _bad_inputs(delegate_runs["mlp"], missing, folder):
        out = _etlab(*args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and out.stdout == "", (args, out.stdout, out.stderr)
        assert len(lines) == 1 and "[Errno" not in lines[0] and "Traceback" not in out.stderr, (args, out.stderr)
        bad = missing if missing in args else folder
        why = "no such file" if bad == missing else "is a directory, not a file"
        assert lines[0].endswith(f": error: {flag} {bad}: {why}"), (args, lines[0])
    out = _etlab("run", missing)
    assert out.returncode == 2 and out.stderr.strip() == f"etlab: error: {missing}: no such file"


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_files_to_write_need_an_existing_folder(delegate_runs, tmp_path):
    d = delegate_runs["mlp"]
    nowhere = tmp_path / "no" / "such" / "folder"
    cases = [
        (["inspect", d / "run.etdp", "-o", nowhere / "t.txt"], "-o"),
        (["inspect", d / "run.etdp", "--chrome-trace", nowhere / "t.json"], "--chrome-trace"),
        (["compare", d, d, "--json", nowhere / "c.json"], "--json"),
        (["compare", d, d, "--csv", nowhere / "c.csv"], "--csv"),
        (["compare", d, d, "--parquet", nowhere / "c.parquet"], "--parquet"),
        (["compare", d, d, "--html", nowhere / "c.html"], "--html"),
        (["report", d / "run.etdp", "-o", nowhere / "r.html"], "-o"),
        (["run", d / "model.pte", "--etdump", nowhere / "r.etdp"], "--etdump"),
        (["fleet", "ingest", d, "--store", nowhere / "s"], "--store"),
        (["fleet", "generate", nowhere / "g"], "OUT"),
        (["fleet", "diff", tmp_path, "--base", "build=A", "--head", "build=B", "--html", nowhere / "d.html"],
         "--html"),
    ]
    for args, flag in cases:
        out = _etlab(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert f"error: {flag} {nowhere}" in out.stderr and "does not exist" in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "no").exists()
    # a folder given where a file goes
    out = _etlab("report", d / "run.etdp", "-o", tmp_path)
    assert out.returncode == 2 and f"-o {tmp_path}: is a directory" in out.stderr
    out = _etlab("fleet", "ingest", d, "--store", d / "model.pte")
    assert out.returncode == 2 and "is a file, not a folder" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_progress_goes_to_stderr_only_when_asked_or_on_a_terminal(delegate_runs, tmp_path):
    d = delegate_runs["mlp"]
    quiet = _etlab("compare", d, d, "--json", tmp_path / "c.json")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr  # stderr is a pipe here: nothing
    loud = _etlab("compare", d, d, "--json", tmp_path / "c.json", "--progress")
    assert loud.returncode == 0 and loud.stdout == quiet.stdout
    stages = [line.split(" (")[0] for line in loud.stderr.splitlines()]
    assert stages == [f"etlab compare: reading A: {d / 'run.etdp'} with model.etrecord",
                      f"etlab compare: reading B: {d / 'run.etdp'} with model.etrecord",
                      "etlab compare: joining A and B by debug_handle", f"etlab compare: writing {tmp_path / 'c.json'}"]
    report = _etlab("report", d / "run.etdp", "--etrecord", d / "model.etrecord", "-o", tmp_path / "r.html",
                    "--progress")
    assert report.returncode == 0 and report.stdout.strip() == str(tmp_path / "r.html")
    assert "etlab report: building the dashboard" in report.stderr


def test_progress_on_a_terminal_is_one_line_erased_at_the_end():
    from etlab.inspector import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    with Progress("etlab compare", stream=stream) as step:
        step.DELAY = 0.0
        step("reading A")
        step._draw()   # what the ticker does once the delay has passed
        step("joining")
    text = stream.getvalue()
    assert "\r\x1b[Ketlab compare: reading A (0 s)" in text and "\r\x1b[Ketlab compare: joining (0 s)" in text
    assert text.endswith("\r\x1b[K") and "\n" not in text   # erased: the next output starts on a clean line
    silent = io.StringIO()
    with Progress("etlab compare", stream=silent) as step:
        step("reading A")
    assert silent.getvalue() == ""


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_report_takes_the_pte_for_the_memory_tab(delegate_runs, tmp_path):
    from etlab.devtools import memory_lower_bound
    from etlab.visualizer._memory_view import pte_plan_frame

    cnn, mlp = delegate_runs["cnn"], delegate_runs["mlp"]
    without = _etlab("report", mlp / "run.etdp", "--etrecord", mlp / "model.etrecord", "-o", tmp_path / "n.html")
    assert without.returncode == 0 and "no memory view: give the program's .pte (--pte)" in without.stderr
    assert 'data-tab="memory"' not in (tmp_path / "n.html").read_text()
    ok = _etlab("report", mlp / "run.etdp", "--etrecord", mlp / "model.etrecord", "--pte", mlp / "model.pte",
                "--strict", "-o", tmp_path / "r.html")
    assert ok.returncode == 0 and "warning" not in ok.stderr and "no memory view" not in ok.stderr, ok.stderr
    page = (tmp_path / "r.html").read_text()
    assert 'data-tab="memory"' in page and "memory id 1" in page
    # the plan read from the file: every planned tensor, the arena, and a peak that fits it
    plan = pte_plan_frame(mlp / "model.pte")
    arena = plan.attrs["buffer_sizes"][1]
    assert len(plan) > 0 and 0 < memory_lower_bound(plan) <= arena
    assert (plan["offset"] + plan["size"] <= arena).all() and "placeholder" in set(plan["producing_op"])
    wrong = _etlab("report", mlp / "run.etdp", "--pte", cnn / "model.pte", "--strict", "-o", tmp_path / "s.html")
    assert wrong.returncode == 2 and "does not match" in wrong.stderr and not (tmp_path / "s.html").exists()


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_run_threads_are_recorded_in_the_etdump(delegate_runs, tmp_path):
    from etlab.schema import load_file

    pte = delegate_runs["mlp"] / "model.pte"
    for flag, recorded in ((None, 1), ("2", 2), ("0", 0)):
        etdp = tmp_path / f"t{flag}.etdp"
        out = _etlab("run", pte, "--runs", "2", "--etdump", etdp, *(["--threads", flag] if flag else []))
        assert out.returncode == 0, out.stderr
        assert ("torch default" if recorded == 0 else f"{recorded} thread(s)") in out.stdout
        runs = [r for r in load_file(etdp).run_data if r.name == "Execute"]
        assert len(runs) == 2 and {r.threads for r in runs} == {recorded}
    inspected = _etlab("inspect", tmp_path / "tNone.etdp")
    assert inspected.returncode == 0 and "Execute" in inspected.stdout
    assert _etlab("run", pte, "--threads", "-1").returncode == 2


@pytest.mark.slow  # over 5 s of CPU (etlab run in subprocesses): left out of make test-fast
def test_every_option_has_help_and_every_command_its_usage():
    import argparse

    from etlab.cli import build_parser
    from etlab.fleet._cli import _parser as fleet_parser
    from etlab.inspector._cli import _compare_parser, _inspect_parser, _module_parser
    from etlab.visualizer._cli import report_parser

    def parsers(p):
        yield p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    missing = []
    for top in (build_parser(), fleet_parser(), _compare_parser("etlab compare"), _inspect_parser(),
                _module_parser(), report_parser()):
        for p in parsers(top):
            missing += [f"{p.prog} {'/'.join(a.option_strings) or a.dest}" for a in p._actions
                        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help
                        and p.add_help]
    assert missing == []
    usage = _etlab("--help").stdout
    for command in ("info", "run", "inspect", "compare", "report", "fleet"):
        assert f"etlab {command} " in usage, command
        out = _etlab(command, "--help")
        assert out.returncode == 0 and out.stdout.startswith(f"usage: etlab {command} "), (command, out.stdout[:200])
