"""bench/corpus.py on the fast subset, against upstream ExecuTorch (marker interop): every check green.

Upstream's compiles and runs are cached by content (bench/_corpus_upstream.py), so a warm run is
etlab-only work; a cold cache adds about a minute per model on 2 cores.
"""

from __future__ import annotations

import pytest

from tests.corpus.conftest import load_bench_corpus

corpus = load_bench_corpus()

pytestmark = [pytest.mark.corpus, pytest.mark.interop]


def test_fast_subset_is_green_next_to_upstream(ref_python, tmp_path):
    results = corpus.measure(list(corpus.FAST), repeat=1, parallel=2, ref_python=ref_python, outdir=tmp_path,
                             log=lambda *_: None)
    table = corpus.render(results, repeat=1)
    failing = {r.name: {k: c.detail for k, c in r.checks.items() if c.ok is False} for r in results if not r.green}
    assert not failing, table
    for r in results:
        assert set(r.checks) == set(corpus.COLUMNS), (r.name, sorted(r.checks))
        ran = r.checks["upstream runs etlab pte"]
        assert ran.ok or "has no" in ran.detail, (r.name, ran)  # n/a only for a kernel upstream lacks
        assert (tmp_path / f"{r.name}.html").stat().st_size > 0
    assert f"Fully green: {len(results)}/{len(results)}" in table


def test_render_counts_green_and_names_failures():
    ok = corpus.ModelResult("a", "torch.nn", etlab_compile_s=0.1, upstream_compile_s=2.0,
                            checks={c: corpus.Check(True) for c in corpus.COLUMNS})
    bad = corpus.ModelResult("b", "torch.nn", checks={"export": corpus.Check(True),
                                                      "etlab compile": corpus.Check(False, "CompileError: x")})
    na = corpus.ModelResult("c", "torch.nn", checks={"upstream compile": corpus.Check(None, "upstream fails: y")})
    table = corpus.render([ok, bad, na], repeat=3)
    assert "Fully green: 2/3" in table
    assert "FAIL CompileError: x" in table and "n/a upstream fails: y" in table
    assert "20.0x" in table


def test_render_marks_an_interrupted_run_as_partial():
    ok = corpus.ModelResult("a", "torch.nn", checks={c: corpus.Check(True) for c in corpus.COLUMNS})
    assert "PARTIAL" not in corpus.render([ok], repeat=2, total=1)
    table = corpus.render([ok], repeat=2, total=102)
    assert "PARTIAL: the run was stopped after 1 of 102 models" in table and "Fully green: 1/1" in table


def test_speed_render_marks_a_partial_run_and_reads_without_cpu_times():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "corpus_speed.py"
    spec = importlib.util.spec_from_file_location("etlab_bench_corpus_speed", path)
    speed = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = speed
    spec.loader.exec_module(speed)
    t = speed.Timing("a", etlab=[0.1, 0.1, 0.1], upstream=[2.0])
    out = speed.render([t], 1, (1.0, 2.0), total=5)
    assert "PARTIAL: the run was stopped after 1 of 5 models" in out and "20.0x" in out and "CPU-time" not in out
    t.etlab_cpu, t.upstream_cpu = [0.1] * 3, [3.0]
    t.etrecord, t.upstream_etrecord = [(1.0, 0.2, 10), (1.0, 0.2, 10)], [(2.0, 0.4, 20)]
    out = speed.render([t], 1, (1.0, 2.0), total=1)
    assert "PARTIAL" not in out and "CPU-time speed-up: median 30.0x" in out
    assert "ETRecord save: median 2.0x faster than upstream" in out and "| a | 1.00 | 2.00 | 2.00x |" in out
