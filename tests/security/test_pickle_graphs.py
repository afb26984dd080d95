"""Upstream `.etrecord` members whose pickle shares containers (issue 24, item 1).

A memo lets a 1 KB pickle describe 2**60 elements (each list holds the previous one twice); any
walk that revisits shared containers never ends. etlab walks each decoded container once and
bounds the value's size as a tree in proportion to the pickle's (64 elements per opcode beyond
2**16, at most 2**20), so such a member is a FormatError naming the file and the entry, at once,
and every later walk over a value that passed is linear in the file's size. Every hostile load
runs in a child process with a timeout: a regression hangs the child, not pytest.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.security._craft import REPO, shared_list_pickle, small_etrecord, torch_member, upstream_etrecord_with

_LOAD_EACH = """
import json, sys
from etlab.errors import FormatError
from etlab.etrecord._torch_pickle import load_torch_bytes
from tests.security._craft import shared_list_pickle, torch_member
out = {}
for name, levels, refs in json.loads(sys.argv[1]):
    try:
        value = load_torch_bytes(torch_member(shared_list_pickle(levels, refs)), f"entry {name!r}")
        out[name] = "loaded"
    except FormatError as e:
        out[name] = "FormatError: " + str(e)
print(json.dumps(out))
"""


def test_shared_and_wide_pickles_fail_fast_naming_the_member():
    cases = [("deep-shared", 60, 2), ("wide", 3, 2000), ("just-over", 16, 2), ("within", 15, 2), ("small", 8, 3),
             ("spelled-out", 1, 200_000), ("wide-two", 2, 3000)]
    proc = subprocess.run([sys.executable, "-c", _LOAD_EACH, json.dumps(cases)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("deep-shared", "wide", "just-over", "wide-two"):
        assert re.match(rf"FormatError: entry {name!r}: the value has more than \d+ elements", got[name]), got
    assert "more than 65536 elements" in got["just-over"]  # 2**17 - 1 elements from a 100-byte pickle
    assert got["within"] == "loaded" and got["small"] == "loaded"  # 2**16 - 1 elements: at the free bound, read
    assert got["spelled-out"] == "loaded"  # 200,001 elements, each its own opcode: as large as the file says


def test_shared_containers_within_the_budget_keep_their_sharing():
    from etlab.etrecord._torch_pickle import load_torch_bytes

    value = load_torch_bytes(torch_member(shared_list_pickle(4, 3)), "m")
    assert value[0] is value[1] is value[2] and len(value[0]) == 3  # read as pickle.loads would, not copied


def test_depth_through_shared_containers_is_still_bounded():
    """A chain of 70 lists that each hold the previous once is too deep however it is reached."""
    from etlab.errors import FormatError
    from etlab.etrecord._torch_pickle import load_torch_bytes

    with pytest.raises(FormatError, match=r"^m: the value is nested more than 64 levels deep"):
        load_torch_bytes(torch_member(shared_list_pickle(70, 1)), "m")
    assert load_torch_bytes(torch_member(shared_list_pickle(64, 1)), "m") is not None


def test_error_messages_do_not_expand_shared_values():
    """A persistent id or global name that is itself a shared graph is described, not printed."""
    from etlab.errors import FormatError
    from etlab.etrecord._torch_pickle import load_torch_bytes

    graph = shared_list_pickle(60)[:-1]  # the graph left on the stack, no STOP
    as_pid = graph + b"Q."               # BINPERSID of it
    with pytest.raises(FormatError, match=r"persistent id a list of 2 items is not a typed storage"):
        load_torch_bytes(torch_member(as_pid), "m")
    as_global = graph + b"X\x01\x00\x00\x00a\x93."  # STACK_GLOBAL(module=graph, name='a')
    with pytest.raises(FormatError, match=r"names a list of 2 items\.a"):
        load_torch_bytes(torch_member(as_global), "m")
    huge_int = b"\x80\x02\x8b" + (40000).to_bytes(4, "little") + b"\x01" * 40000 + b"Q."  # LONG4, then BINPERSID
    with pytest.raises(FormatError, match=r"persistent id an int of 319993 bits"):
        load_torch_bytes(torch_member(huge_int), "m")


def _etlab_report(run_dir, etrecord, out) -> subprocess.CompletedProcess:
    """`etlab report` as a user runs it, in its own process (a hang fails the test at the timeout)."""
    return subprocess.run([sys.executable, "-m", "etlab.cli", "report", "--etdump", str(run_dir / "run.etdp"),
                           "--etrecord", str(etrecord), "--debug-buffer", str(run_dir / "run.bin"), "-o", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = small_etrecord(tmp_path_factory.mktemp("run") / "mlp.etrecord")
    return path.parent


@pytest.mark.parametrize("levels, refs", [(60, 2), (3, 2000)])
def test_etlab_report_on_a_shared_graph_etrecord_ends_with_a_clear_error(run_dir, tmp_path, levels, refs):
    member = "representative_inputs"  # read when the file is parsed
    crafted = upstream_etrecord_with(run_dir / "mlp.etrecord", tmp_path / "shared.etrecord",
                                     {member: torch_member(shared_list_pickle(levels, refs))})
    proc = _etlab_report(run_dir, crafted, tmp_path / "r.html")
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "etlab report: error:" in proc.stderr and str(crafted) in proc.stderr and member in proc.stderr
    assert re.search(r"more than \d+ elements", proc.stderr), proc.stderr[-2000:]
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow  # over 5 s of CPU: left out of make test-fast
@pytest.mark.parametrize("member, program", [
    ("edge_dialect_exported_program/forward_example_inputs", "edge_dialect_program"),
    ("exported_program_state_dict", "exported_program"),
])
def test_program_members_with_shared_graphs_are_refused_when_the_program_is_rebuilt(run_dir, tmp_path, member,
                                                                                    program):
    crafted = upstream_etrecord_with(run_dir / "mlp.etrecord", tmp_path / "shared.etrecord",
                                     {member: torch_member(shared_list_pickle(3, 2000))})
    code = f"import sys\nfrom etlab.etrecord import parse_etrecord\ngetattr(parse_etrecord(sys.argv[1]), {program!r})"
    proc = subprocess.run([sys.executable, "-c", code, str(crafted)], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 1 and "FormatError" in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert str(crafted) in last and member in last and re.search(r"more than \d+ elements", last), last
    proc = _etlab_report(run_dir, crafted, tmp_path / "r.html")  # the report says so too, instead of a graph-less page
    assert proc.returncode == 2 and "etlab report: error:" in proc.stderr and member in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "r.html").exists()


def test_etlab_report_on_the_honest_upstream_etrecord_works(run_dir, tmp_path):
    honest = upstream_etrecord_with(run_dir / "mlp.etrecord", tmp_path / "honest.etrecord", {})
    proc = _etlab_report(run_dir, honest, tmp_path / "r.html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "r.html").stat().st_size > 1000
