"""bench/corpus_speed.py's kept rows (bench/_speed_rows.py, bench/corpus_speed.jsonl): each measured model
is merged into the store as it is timed, runs over subsets add up, and the section renders from the whole
store with each row's commit, time and load, naming the corpus models that have no row."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.corpus
BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load_speed():
    name = "etlab_bench_corpus_speed"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / "corpus_speed.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


speed = _load_speed()
store = sys.modules["_speed_rows"]
rows = sys.modules["_corpus_rows"]


def _ctx(commit: str = "abc1234", key: str = "k") -> rows.RunContext:
    return rows.RunContext(key, commit, False, "executorch 1.5.1")


def _row(name: str, etlab: float, upstream: list[float], ctx=None, when: str = "2026-11-27T23:00",
         error: str = "") -> rows.Row:
    t = speed.Timing(name, etlab=[etlab] * 3, upstream=upstream, etlab_cpu=[etlab / 2] * 3,
                     upstream_cpu=[u / 2 for u in upstream], error=error)
    row = rows.make_row(name, "", rows.source_key(speed.CORPUS[name]), ctx or _ctx(), t.to_result(1, (2.0, 3.5)))
    row.measured_at = when
    return row


def test_runs_over_subsets_add_up_and_a_newer_row_replaces_the_older(tmp_path):
    path = tmp_path / "speed.jsonl"
    store.merge([_row("lstm", 0.1, [5.0]), _row("gru", 0.1, [2.0])], path)
    store.merge([_row("bert", 0.2, [9.0])], path)
    kept = store.merge([_row("lstm", 0.1, [3.0], _ctx("def5678"))], path)
    assert list(kept) == ["lstm", "gru", "bert"]
    again = store.load_store(path)
    assert again["lstm"].commit == "def5678" and again["lstm"].result["upstream_s"] == [3.0]
    assert speed.Timing.from_row(again["gru"]).ratio == pytest.approx(20.0)
    assert speed.Timing.from_row(again["gru"]).cpu_ratio == pytest.approx(20.0)


def test_a_store_line_that_is_not_a_row_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "speed.jsonl"
    store.merge([_row("lstm", 0.1, [5.0])], path)
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(SystemExit, match=r"speed\.jsonl:2: not JSON"):
        store.load_store(path)
    path.write_text(json.dumps({"name": "gru", "result": {}, "colour": 1}) + "\n")
    with pytest.raises(SystemExit, match=r"speed\.jsonl:1: row of 'gru': unknown fields \['colour'\]"):
        store.load_store(path)


def test_section_renders_every_kept_row_with_its_provenance_and_names_the_missing(tmp_path):
    kept = {r.name: r for r in [_row("lstm", 0.1, [5.0]), _row("gru", 0.1, [0.5], _ctx("def5678")),
                                _row("bert", 0.2, [], error="upstream: SpecViolationError")]}
    names = ["lstm", "gru", "bert", "albert"]
    out = speed.render_store(kept, names, notes="kept by hand")
    assert "**Median speed-up 27.5x** (min 5.0x, max 50.0x, over 2 of 4 corpus models" in out
    assert "below 10x: gru." in out and "no ratio (one side failed): bert" in out
    assert "**PARTIAL: 1 of 4 corpus models have no row**: albert." in out
    assert "| lstm | 100 | 5.00 | 50.0x | 50.0x | 3 / 1 | abc1234 11-27 23:00 | 2.0-3.5 |" in out
    assert "| gru | 100 | 0.50 | 5.0x | 5.0x | 3 / 1 | def5678 11-27 23:00 |" in out
    assert out.rstrip().endswith(f"{store.NOTES_BEGIN}\nkept by hand\n{store.NOTES_END}")
    complete = speed.render_store({n: kept[n] for n in ("lstm", "gru")}, ["lstm", "gru"])
    assert "PARTIAL" not in complete and "NOTES" not in complete


def test_render_only_rewrites_the_section_from_the_store_and_keeps_the_notes(tmp_path):
    path, results = tmp_path / "speed.jsonl", tmp_path / "RESULTS.md"
    store.merge([_row("lstm", 0.1, [5.0])], path)
    results.write_text(f"# r\n\n## corpus compile speed\n\nold table\n\n{store.NOTES_BEGIN}\nmy notes\n"
                       f"{store.NOTES_END}\n\n## other\n\nkept\n")
    speed.write_store_section(path, results)
    text = results.read_text()
    assert "old table" not in text and "| lstm | 100 | 5.00 | 50.0x |" in text and "my notes" in text
    assert text.endswith("## other\n\nkept\n") and text.count(store.NOTES_BEGIN) == 1
    first = text
    speed.write_store_section(path, results)
    assert results.read_text() == first


def test_run_order_measures_models_without_a_row_first_then_stale_ones_oldest_first():
    ctx = _ctx(key="now")
    kept = {"lstm": _row("lstm", 0.1, [5.0], _ctx(key="old"), when="2026-11-27T20:00"),
            "gru": _row("gru", 0.1, [5.0], _ctx(key="old"), when="2026-11-27T19:00"),
            "bert": _row("bert", 0.1, [5.0], ctx)}
    assert speed.run_order(["lstm", "gru", "bert", "albert"], kept, ctx, refresh=False) == ["albert", "gru", "lstm"]
    assert speed.run_order(["lstm", "gru", "bert"], kept, ctx, refresh=True) == ["gru", "lstm", "bert"]


def test_an_exported_tree_names_its_commit(monkeypatch):
    monkeypatch.setenv("ETLAB_BENCH_COMMIT", "f00ba47")
    ctx = store.run_context("executorch 1.5.1")
    assert ctx.commit == "f00ba47" and not ctx.dirty and ctx.etlab_key == rows.etlab_key()
