"""Every `etlab` command's default output fits 120 columns (issue 26, item 9), on etlab's zoo files (the
`delegate_runs` CNN: a demo-delegated program, its ETRecord, run and debug buffer) and on upstream's
(ExecuTorch 1.5.1 wrote the portable CNN and transformer with their ETRecords, and an XNNPACK CNN):
info of each file kind, inspect (with and without the record; its JSON strict JSON), compare (portable
against XNNPACK too), report, run, export-me, every fleet subcommand, quant report and fix, and each command's --help.

The commands run as `etlab.cli.main(argv)` in ONE child process (tests/_cli_batch.py) whose stdout is a pipe,
as when a user pipes the output (no terminal: the 120-column default applies, COLUMNS unset); one process keeps the
test to seconds where a process per command would pay torch's import some 60 times. Each command's
exit status is checked too, so a command that failed with a short message does not pass for narrow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._cli_batch import run_etlab

REPO = Path(__file__).resolve().parents[2]
WIDTH = 120

def _run_all(commands: list[list]) -> list[dict]:
    env = dict(os.environ)  # etlab as installed in the venv (make setup), no path override
    env.pop("COLUMNS", None)
    return run_etlab(commands, env)


def _file_commands(d: Path, tmp: Path, tag: str, etrecord: bool = True, debug_buffer: bool = True) -> list[list]:
    etdp, rec, pte, buf = d / "run.etdp", d / "model.etrecord", d / "model.pte", d / "run.bin"
    with_rec = ["--etrecord", rec] if etrecord else []
    with_buf = ["--debug-buffer", buf] if debug_buffer else []
    cmds = [["info", pte], ["info", etdp], ["inspect", etdp], ["inspect", etdp, *with_rec, *with_buf],
            ["inspect", etdp, *with_rec, "--all"], ["inspect", etdp, "--format", "json"], ["run", pte, "--runs", "2"],
            ["report", etdp, "-o", tmp / f"{tag}-timings.html"],
            ["report", etdp, *with_rec, *with_buf, "-o", tmp / f"{tag}.html"]]
    if etrecord:
        cmds += [["info", rec], ["info", pte, "--etrecord", rec], ["compare", d, d],
                 ["export-me", etdp, "--etrecord", rec, "-o", tmp / f"me-{tag}"]]
    if (d / "model.bpte").is_file():
        cmds.append(["info", d / "model.bpte"])
    (tmp / f"me-{tag}").mkdir()
    return cmds


def _fleet_commands(files: Path, tmp: Path, generated: bool = True) -> list[list]:
    """Ingest `files`, then every query and stats subcommand on the store; with `generated`, also the commands
    that do not read `files` (a generated fleet, its ingest and diff): the same on every file set, run once."""
    store, gen, gen_store = tmp / "store", tmp / "generated", tmp / "gen-store"
    for d in (store, gen_store):
        d.mkdir()
    cmds = [["fleet", "ingest", files, "--store", store, "--tag", "build=A"],
            ["fleet", "query", store, "SELECT * FROM events LIMIT 20"],
            ["fleet", "stats", store, "percentiles"], ["fleet", "stats", store, "slowest"],
            ["fleet", "stats", store, "variance"], ["fleet", "stats", store, "outliers"]]
    if generated:
        cmds += [["fleet", "generate", gen, "--devices-per-class", "1", "--sessions", "1", "--runs", "2"],
                 ["inspect", f"glob:{gen}/**/*.etdp", "--format", "json"],  # its runs have delegate calls (item 1)
                 ["fleet", "ingest", gen, "--store", gen_store],
                 ["fleet", "diff", gen_store, "--base", "build=A", "--head", "build=B"]]
    return cmds


def _help_commands() -> list[list]:
    cmds = [["--help"]]
    for c in ("info", "run", "inspect", "compare", "report", "export-me", "fleet", "quant"):
        cmds.append([c, "--help"])
    cmds += [["fleet", c, "--help"] for c in ("ingest", "query", "stats", "diff", "generate")]
    cmds += [["quant", c, "--help"] for c in ("report", "fix")]
    return cmds


def _key(argv: list[str]) -> tuple:
    return tuple(argv[:2]) if argv[0] in ("fleet", "quant") and argv[1] != "--help" else (argv[0],)


def _wide(results: list[dict]) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    for r in results:
        lines = r["stdout"].splitlines()
        if lines and max(len(line) for line in lines) > WIDTH:
            out.setdefault(_key(r["argv"]), []).append((r["argv"], max(len(line) for line in lines),
                                                         max(lines, key=len)[:200]))
    return out


def _check(results: list[dict]) -> None:
    failed = [(r["argv"], r["status"], r["stderr"][-500:]) for r in results
              if not (r["status"] == 0 or (r["argv"][:2] == ["fleet", "diff"] and r["status"] == 1))]
    assert not failed, failed
    wide = _wide(results)
    assert not wide, wide
    for r in results:  # JSON output is strict JSON (NaN as null; item 1): upstream's XNNPACK run included
        argv = r["argv"]
        if "--format" in argv and argv[argv.index("--format") + 1] == "json":
            rows = json.loads(r["stdout"], parse_constant=_not_json)
            assert rows, argv
    assert all(r["stdout"].strip() for r in results if r["argv"][-1] == "--help" or r["argv"][0] in ("info", "inspect"))


def _not_json(constant: str):
    raise AssertionError(f"non-JSON constant {constant} in the output")


@pytest.fixture(scope="module")
def zoo_results(delegate_runs, tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("width-zoo")
    d = delegate_runs["cnn"]
    commands = (_file_commands(d, tmp, "zoo") + _fleet_commands(d, tmp) + _help_commands()
                + [["quant", "report", "mlp", "--inputs", "4", "--calibration", "2", "--backend", "portable",
                    "--no-progress"],
                   # a budget int8 meets: the summary, the search's steps and the layers table, two steps (the
                   # whole search's tables at 60 columns: tests/devtools/test_quant_fix_text.py)
                   ["quant", "fix", "mlp", "--budget", "top1>=0.5", "--inputs", "4", "--calibration", "2",
                    "--backend", "portable", "--no-progress"]])
    return _run_all(commands)


@pytest.fixture(scope="module")
def upstream_results(tmp_path_factory) -> list[dict]:
    from tests.interop.conftest import (
        ET_REF,
        REF_TOOLS,
        ZOO,
        cache_key,
        cached_build,
        ensure_upstream_artifacts,
        run_ref,
        setup_reference,
    )

    ref = setup_reference()
    root = ensure_upstream_artifacts(ref)

    def xnnpack(tmp: Path) -> None:  # tests/interop/test_inspector.py's xnnpack_run: one cached build
        run_ref(ref, ET_REF, "export", f"{ZOO}:make_cnn", "--xnnpack", "--out", tmp)
        run_ref(ref, ET_REF, "run", tmp / "model.pte", "--inputs", tmp / "inputs.pt", "--etdump", tmp / "run.etdp",
                "--iters", "3")
        run_ref(ref, REF_TOOLS, "inspect-events", tmp / "run.etdp", "--json", tmp / "events.json")

    tmp = tmp_path_factory.mktemp("width-upstream")
    # upstream's files in folders of their own, as a user keeps them: the interop cache's paths (100+
    # characters, echoed by `info`) say nothing about the tool, and its folders hold upstream's JSON dumps of
    # each file (run.etdp.json), which fleet would read as tag sidecars
    cnn, tf, xnn = (_copy(src, tmp / name) for src, name in ((root / "cnn", "cnn"), (root / "transformer", "tf"),
                    (cached_build("inspector-xnnpack", cache_key()[:16], xnnpack), "xnn")))
    commands = (_file_commands(cnn, tmp, "cnn") + _file_commands(tf, tmp, "tf")
                + _file_commands(xnn, tmp, "xnn", etrecord=False, debug_buffer=False)
                + [["compare", cnn / "run.etdp", xnn / "run.etdp", "--etrecord-a", cnn / "model.etrecord"]]
                + _fleet_commands(_device_folder(tmp, cnn, tf, xnn), tmp, generated=False))
    return _run_all(commands)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("model.pte", "model.etrecord", "model.bpte", "run.etdp", "run.bin"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    return dst


def _device_folder(tmp: Path, *runs: Path) -> Path:
    """The runs' .etdp files with their .pte beside them, as devices hand them over."""
    folder = tmp / "devices"
    for i, d in enumerate(runs):
        (folder / f"device{i}").mkdir(parents=True)
        for name in ("run.etdp", "model.pte"):
            shutil.copy(d / name, folder / f"device{i}" / name)
    return folder


@pytest.mark.slow  # one child process running ~45 commands (runs, reports, a quantization report)
def test_every_command_fits_120_columns_on_zoo_files(zoo_results):
    _check(zoo_results)


@pytest.mark.interop
@pytest.mark.slow
def test_every_command_fits_120_columns_on_upstream_files(upstream_results):
    _check(upstream_results)


def test_demo_events_table_fits_120_columns(delegate_runs):
    """`make demo` (python -m etlab.demo) prints the run's events with `events_table`, as `etlab inspect` does
    (it printed print_data_tabular()'s whole frame, 930 columns): here on the zoo's delegated CNN."""
    from etlab.demo import TOP, events_table
    from etlab.inspector import Inspector

    d = delegate_runs["cnn"]
    ins = Inspector(etdump_path=d / "run.etdp", etrecord=d / "model.etrecord", debug_buffer_path=d / "run.bin")
    for width in (80, 120):
        lines = events_table(ins, width).splitlines()
        assert max(len(line) for line in lines) <= width, max(lines, key=len)
        assert lines[0].split()[:2] == ["block", "event"] and any("DemoBackend" in line for line in lines)
        assert len(lines) <= TOP + 3  # head, rule, TOP rows, the line saying how many are left out


@pytest.mark.slow  # the whole demo: compile, 20 runs, the HTML report (some 10 s)
def test_demo_output_fits_120_columns(tmp_path):
    """The demo as `make demo` runs it (`python -m etlab.demo`), stdout a pipe: every line within 120 columns."""
    env = dict(os.environ)  # etlab as installed in the venv (make setup), no path override
    env.pop("COLUMNS", None)
    p = subprocess.run([sys.executable, "-m", "etlab.demo", "--out", tmp_path / "out", "--report",
                        tmp_path / "report.html"], capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, max(lines, key=len)
    assert any("DELEGATE_CALL" in line for line in lines) and (tmp_path / "report.html").is_file()
