"""bench/corpus.py's kept rows (bench/_corpus_rows.py): a stopped run keeps what it measured, the next
run measures the models without a row first, and the table says which commit and date each row is
from; upstream's compile cache is keyed by the exported program, not by whole source files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.corpus.conftest import load_bench_corpus

corpus = load_bench_corpus()
rows = sys.modules["_corpus_rows"]
up = sys.modules["_corpus_upstream"]

pytestmark = pytest.mark.corpus
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ETLAB_CORPUS_CACHE", str(tmp_path))
    return tmp_path


def _result(ok: bool = True) -> dict:
    checks = {c: corpus.Check(True, "fine") for c in corpus.COLUMNS}
    if not ok:
        checks["etlab run"] = corpus.Check(False, "max err 1.0e+00")
    return corpus.ModelResult("x", "torch.nn", 1.0, 0.1, 2.0, checks).to_json()


def _row(name: str, ctx, when: str, ok: bool = True) -> rows.Row:
    entry = corpus.CORPUS[name]
    row = rows.make_row(name, "entry", rows.source_key(entry), ctx, _result(ok))
    row.measured_at = when
    return row


def test_a_row_round_trips_and_a_broken_row_file_is_no_row(cache):
    ctx = rows.RunContext("etlab-a", "abc1234", True, "executorch 1.5.1")
    rows.save(_row("lstm", ctx, "2026-11-27T20:05"))
    back = rows.load("lstm")
    assert back is not None and back.provenance == "abc1234+edits 11-27 20:05"
    result = corpus.ModelResult.from_json("lstm", back.result)
    assert result.green and result.speedup == pytest.approx(20.0)
    (cache / "rows" / "gru.json").write_text("{not json")
    assert rows.load("gru") is None
    (cache / "rows" / "cond.json").write_text(back.__class__.__name__)  # valid file name, not a row
    assert rows.load("cond") is None


def test_run_order_missing_first_then_stale_oldest_first_current_skipped(cache):
    ctx = rows.RunContext("etlab-now", "abc1234", False, "executorch 1.5.1")
    old = rows.RunContext("etlab-old", "0000000", False, "executorch 1.5.1")
    rows.save(_row("lstm", ctx, "2026-11-27T20:00"))  # current
    rows.save(_row("gru", old, "2026-11-27T19:00"))  # stale: another etlab
    rows.save(_row("cond", old, "2026-11-27T18:00"))  # stale, older
    names = ["lstm", "gru", "cond", "bert", "gpt2"]
    assert rows.run_order(names, corpus.CORPUS, ctx) == ["bert", "gpt2", "cond", "gru"]
    assert rows.run_order(names, corpus.CORPUS, ctx, refresh=True) == ["bert", "gpt2", "cond", "gru", "lstm"]
    other_upstream = rows.RunContext("etlab-now", "abc1234", False, "executorch 9.9")
    assert "lstm" in rows.run_order(names, corpus.CORPUS, other_upstream)


def test_render_only_tables_kept_rows_with_their_provenance_and_names_the_missing(cache):
    ctx = rows.RunContext("etlab-a", "abc1234", False, "executorch 1.5.1")
    rows.save(_row("lstm", ctx, "2026-11-27T20:05"))
    rows.save(_row("gru", ctx, "2026-11-27T20:07", ok=False))
    env = {**os.environ, "ETLAB_CORPUS_CACHE": str(cache)}
    p = subprocess.run([sys.executable, str(REPO / "bench" / "corpus.py"), "--render-only", "--no-write",
                        "--models", "lstm", "gru", "cond"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 1, p.stderr  # a row is not green and one model has none
    out = p.stdout
    assert "Fully green: 1/2" in out and "**PARTIAL: 2 of 3 models tabled**; not measured yet: cond." in out
    lstm = next(line for line in out.splitlines() if line.startswith("| lstm |"))
    assert lstm.endswith("| abc1234 11-27 20:05 |") and "20.0x" in lstm
    assert "FAIL max err 1.0e+00" in next(line for line in out.splitlines() if line.startswith("| gru |"))


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x).relu()


def test_program_key_follows_the_program_not_its_source_lines():
    torch.manual_seed(0)
    model, x = _Tiny().eval(), (torch.randn(1, 3),)
    ep = torch.export.export(model, x)
    key = up.program_key("tiny", {"forward": ep}, {"forward": x}, False)
    assert key == up.program_key("tiny", {"forward": torch.export.export(model, x)}, {"forward": x}, False)
    with torch.no_grad():
        model.lin.weight[0, 0] += 1
    assert up.program_key("tiny", {"forward": torch.export.export(model, x)}, {"forward": x}, False) != key
    assert up.program_key("tiny", {"forward": ep}, {"forward": (x[0] + 1,)}, False) != key
    assert up.program_key("tiny", {"forward": ep}, {"forward": x}, True) != key
