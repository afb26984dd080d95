"""bench/corpus.py's side-by-side compile timing: upstream's compile worker (bench/_corpus_upstream.py
UpstreamCompiler), the content keys of upstream's compiles, and how the table shows speed-ups (rows
measured before the interleaved timing are not shown as side-by-side ratios)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from tests.corpus.conftest import load_bench_corpus

corpus = load_bench_corpus()
up = sys.modules["_corpus_upstream"]

pytestmark = pytest.mark.corpus


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


def _export(net, x):
    return {"forward": torch.export.export(net, (x,))}


def test_compile_keys_hash_what_the_compile_reads_not_the_inputs_or_name():
    torch.manual_seed(0)
    net = _Net()
    a, b = _export(net, torch.randn(2, 4)), _export(net, torch.ones(2, 4))  # other example values, same program
    key = up.artifact_key("portable", a, False)
    assert key == up.artifact_key("portable", b, False)
    assert up.artifact_key("portable", a, False) != up.artifact_key("portable", a, True)
    assert up.artifact_key("portable", a, False) != up.artifact_key("xnnpack", a, False)
    with torch.no_grad():  # (the exported program shares the module's weights: `key` was taken before)
        net.fc.weight[0, 0] += 1
    assert up.artifact_key("portable", _export(net, torch.randn(2, 4)), False) != key


def _checks():
    return {c: corpus.Check(True, "fine") for c in corpus.COLUMNS}


def test_table_shows_side_by_side_ratios_and_marks_old_rows():
    fast = corpus.ModelResult("fast", "timm", 1.0, 0.1, 4.0, _checks(), etlab_first_s=0.5,
                              samples={"etlab": [0.1, 0.12, 0.09], "upstream": [4.0]})
    slow = corpus.ModelResult("slow", "timm", 1.0, 0.5, 4.0, _checks(), etlab_first_s=0.8)
    old = corpus.ModelResult.from_json("old", {"source": "timm", "etlab_compile_s": 0.645, "upstream_compile_s": 5.8,
                                               "checks": {c: [True, "fine"] for c in corpus.COLUMNS}})
    assert old.speedup is None and fast.speedup == pytest.approx(40.0) and fast.first_speedup == pytest.approx(8.0)
    assert corpus.ModelResult.from_json("fast", fast.to_json()).samples == fast.samples
    table = corpus.render([fast, slow, old], repeat=3)
    assert "| fast | timm | 40.0x (first 8.0x) |" in table  # no CPU samples: no CPU ratio
    assert "| old | timm | - |" in table
    assert "below 10x: slow 8.0x (CPU time: none; first compile: fast 8.0x, slow 5.0x)" in table
    fast.samples.update(etlab_cpu=[0.05, 0.06, 0.04], upstream_cpu=[3.0])
    assert "| fast | timm | 40.0x (CPU 60.0x, first 8.0x) |" in corpus.render([fast], repeat=3)
    assert "min 8.0x over 2 models" in table and "not side by side (rows from before the interleaved timing, shown " \
        "as `-`): old." in table


FAKE_WORKER = """
import json, sys, time
mode = {mode!r}
for line in sys.stdin:
    req = json.loads(line)
    if req.get("warmup"):
        print(json.dumps({{"ok": True}}), flush=True)
        continue
    if mode == "exit":
        sys.exit(3)
    if mode == "hang":
        time.sleep(60)
    print("a library's chatter on stdout", flush=True)
    open(req["pte"], "wb").write(b"PTE")
    print(json.dumps({{"seconds": 2.5, "cpu_seconds": 2.0, "pte_bytes": 3, "share": req["share_mutable_buffers"]}}),
          flush=True)
"""


@pytest.mark.parametrize("mode", ["ok", "exit", "hang"])
def test_compile_worker_answers_or_is_reported_dead(tmp_path, monkeypatch, mode):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(FAKE_WORKER.format(mode=mode)))
    monkeypatch.setattr(up, "TIMER_SCRIPT", script)
    compiler = up.UpstreamCompiler(sys.executable, timeout=5)
    try:
        if mode == "ok":
            answer = compiler.compile(tmp_path, ["forward"], tmp_path / "up.pte", True)
            assert answer["seconds"] == 2.5 and answer["share"] is True and (tmp_path / "up.pte").read_bytes() == b"PTE"
        else:
            with pytest.raises(up.WorkerDied, match="died or took over 5 s"):
                compiler.compile(tmp_path, ["forward"], tmp_path / "up.pte", False)
            assert compiler.proc is None  # the next request starts a new worker
    finally:
        compiler.close()


def test_a_published_portable_compile_records_its_time_or_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ETLAB_CORPUS_CACHE", str(tmp_path))
    job = up.new_job("portable", "a" * 64)
    (job.tmp / "upstream.pte").write_bytes(b"PTE")
    final = up.publish_portable(job, {"seconds": 3.0, "cpu_seconds": 2.5})
    assert up.cached("portable", "a" * 64) == final and (final / "upstream.pte").read_bytes() == b"PTE"
    failed = up.publish_portable(up.new_job("portable", "b" * 64), {"error": "SpecViolationError: x"})
    assert '"ok": false' in (failed / "upstream.json").read_text() and up.cached("portable", "b" * 64) == failed


def test_an_exported_tree_names_its_commit(tmp_path, monkeypatch):
    rows = sys.modules["_corpus_rows"]
    monkeypatch.setattr(rows, "REPO", tmp_path)  # a `git archive` export: no .git
    monkeypatch.setenv("ETLAB_TREE_COMMIT", "0233d32")
    assert rows.git_state() == ("0233d32", False)
    monkeypatch.delenv("ETLAB_TREE_COMMIT")
    assert rows.git_state() == ("unknown", True)
