"""Every upstream process the corpus harness starts is bounded (bench/_corpus_upstream.py): a background
job that outlives its timeout or dies under its memory bound is published as "bounded out" and shown as
n/a naming why (upstream cannot do it here), the process going on with the next job; never a FAIL or a
hang. Checked with a fake reference script standing in for bench/_ref_corpus.py."""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest

from tests.corpus.conftest import load_bench_corpus

corpus = load_bench_corpus()
up = sys.modules["_corpus_upstream"]

pytestmark = pytest.mark.corpus

FAKE_REF = """
import json, os, resource, sys, time
jobs = json.load(open(sys.argv[1]))
for job in jobs:
    d = job["dir"]
    if job["mode"] == "hang":
        time.sleep(60)
    if job["mode"] == "hog":  # more than the address-space bound: MemoryError, then the process dies
        try:
            block = bytearray(512 * 2**20)
        except MemoryError:
            os._exit(3)
    if job["mode"] == "limit":  # reports the bound it runs under
        json.dump({"load": {"ok": True}, "xnnpack": {"ok": True, "as": resource.getrlimit(resource.RLIMIT_AS)[0]}},
                  open(os.path.join(d, "upstream.json"), "w"))
        continue
    json.dump({"load": {"ok": True}, "xnnpack": {"ok": True}}, open(os.path.join(d, "upstream.json"), "w"))
"""


def _jobs(modes):
    jobs = []
    for i, mode in enumerate(modes):
        job = up.new_job("xnnpack", f"{i}" * 64)
        job.spec = {"dir": str(job.tmp), "mode": mode}
        jobs.append(job)
    return jobs


def test_jobs_past_their_timeout_or_memory_are_bounded_out_and_the_rest_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ETLAB_CORPUS_CACHE", str(tmp_path / "cache"))
    script = tmp_path / "ref.py"
    script.write_text(textwrap.dedent(FAKE_REF))
    monkeypatch.setattr(up, "REF_SCRIPT", script)
    jobs = _jobs(["hang", "ok", "hog", "limit"])
    logs = []
    up.run_jobs(sys.executable, jobs, parallel=1, log=logs.append, timeout=3, memory=256 * 2**20)
    results = [json.loads((j.final / "upstream.json").read_text()) for j in jobs]
    assert results[0]["xnnpack"]["bounded"] and "still running after 3 s, killed" in results[0]["xnnpack"]["error"]
    assert results[1]["xnnpack"] == {"ok": True}  # the process was restarted after the hung job
    assert results[2]["xnnpack"]["bounded"] and "exited with code 3" in results[2]["xnnpack"]["error"]
    assert results[3]["xnnpack"]["as"] == 256 * 2**20
    assert len(logs) == 2 and all(up.cached("xnnpack", j.final.name) for j in jobs)


def test_a_bounded_out_lowering_is_na_naming_why(tmp_path):
    work = corpus._Work(entry=None, result=corpus.ModelResult("m", "test"))
    work.xnnpack_dir = tmp_path
    res = {"load": {"ok": True}, "xnnpack": {"ok": False, "bounded": True,
                                             "error": "bounded out here: still running after 60 s, killed"}}
    check = corpus._xnnpack_check(work, res)
    assert check.ok is None and "upstream cannot lower: bounded out here" in check.detail
    oom = corpus._xnnpack_check(work, {"xnnpack": {"ok": False, "error": "MemoryError: "}})
    assert oom.ok is None and "out of memory under its bound" in oom.detail


def test_a_dead_compile_worker_is_na_and_the_row_is_kept(tmp_path, monkeypatch):
    script = tmp_path / "worker.py"
    script.write_text("import sys\nfor line in sys.stdin:\n    sys.exit(9)\n")
    monkeypatch.setattr(up, "TIMER_SCRIPT", script)
    monkeypatch.setenv("ETLAB_CORPUS_CACHE", str(tmp_path / "cache"))
    compiler = up.UpstreamCompiler(sys.executable, timeout=5, memory=2**30)
    work = corpus._Work(entry=types.SimpleNamespace(tags=()), result=corpus.ModelResult("m", "test"),
                        programs={"forward": None})
    work.programs_dir = tmp_path
    try:
        corpus._upstream_sample(work, compiler, up.new_job("portable", "c" * 64), timed=True)
    finally:
        compiler.close()
    check = work.result.checks["upstream compile"]
    assert check.ok is None and "bounded out here" in check.detail and "exit code 9" in check.detail
    assert not check.unmeasured and "upstream" not in work.result.samples
