"""bench/xnnpack_lowering.py keeps every measured model: a run over a few models replaces their rows in
the store and the section, and keeps the other models' rows and the hand-written notes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "xnnpack_lowering.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("etlab_bench_xnnpack_lowering", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _row(bench, name, speedup, commit="c1"):
    return bench.Result(name, etlab_nodes=3, etlab_partitions=1, upstream_nodes=3, upstream_partitions=1,
                        etlab_s=[0.1], upstream_s=[0.1 * speedup], commit=commit, rounds=1, latency_rounds=10,
                        latency={"1": {"etlab": 1.0, "upstream": 1.0}})


def test_a_partial_run_replaces_its_rows_and_keeps_the_others(bench, tmp_path):
    store = tmp_path / "store.jsonl"
    bench.merge_into_store([_row(bench, "mlp", 20), _row(bench, "cnn", 30)], store)
    rows = bench.merge_into_store([_row(bench, "cnn", 40, "c2"), _row(bench, "gru", 50, "c2")], store)
    assert [(r.name, round(r.speedup), r.commit) for r in rows] == [("mlp", 20, "c1"), ("cnn", 40, "c2"),
                                                                     ("gru", 50, "c2")]
    assert len(store.read_text().splitlines()) == 3
    text = bench.render(rows, "a hand-written note")
    assert "**3 models lowered by both**" in text and "min 20.0x" in text
    assert "| cnn | 3 / 3 |" in text and "etlab at c2, rounds 1 / 10" in text
    assert "default threads" not in text  # no row measured it
    assert bench.NOTES_BEGIN + "\na hand-written note\n" + bench.NOTES_END in text
    not_measured = next(ln for ln in text.splitlines() if ln.startswith("Not measured yet"))
    assert "mobilenet_v2" in not_measured and "cnn" not in not_measured.split(":", 1)[1].split(", ")


def test_a_remark_stays_with_its_row_when_the_model_is_re_measured(bench, tmp_path):
    store = tmp_path / "store.jsonl"
    first = _row(bench, "mlp", 20)
    first.remark = "one no-op copy fewer"
    bench.merge_into_store([first], store)
    rows = bench.merge_into_store([_row(bench, "mlp", 30, "c2")], store)
    assert rows[0].remark == "one no-op copy fewer" and rows[0].commit == "c2"
    assert "| one no-op copy fewer; etlab at c2, rounds 1 / 10 |" in bench.render(rows)
    assert bench._remarks(["mlp = a | b"]) == {"mlp": "a / b"}
    with pytest.raises(SystemExit, match="expected MODEL=TEXT"):
        bench._remarks(["mlp"])


def test_default_threads_under_load_are_not_called_a_measurement(bench):
    rows = [_row(bench, n, 20) for n in ("mlp", "cnn")]
    for r in rows:
        r.latency["default"] = {"etlab": 3.0, "upstream": 1.0}
        r.load = [0.5, 0.7]
    assert "Latency at default threads: median 3.000, max 3.000 (above 1.2: mlp, cnn)." in bench.render(rows)
    for r in rows:
        r.load = [1e4, 1e4]  # above any core count
    assert "Latency at default threads: NOT a measurement: 2 of 2 rows" in bench.render(rows)


def test_the_note_names_the_op_types_upstream_delegates_more(bench):
    r = _row(bench, "mlp", 20)
    r.etlab_ops = {"aten_linear_default": 2, "getitem": 2}
    r.upstream_ops = {"aten_linear_default": 2, "getitem": 2, "dim_order_ops__clone_dim_order_default": 1}
    assert bench.fewer_ops(r) == "upstream delegates more: dim_order_ops__clone_dim_order_default +1"
    assert "| upstream delegates more: dim_order_ops__clone_dim_order_default +1; etlab at c1" in bench.render([r])
    r.etlab_ops["dim_order_ops__clone_dim_order_default"] = 1
    assert bench.fewer_ops(r) == ""


def test_notes_are_read_back_from_the_section(bench, tmp_path):
    md = tmp_path / "RESULTS.md"
    body = bench.render([_row(bench, "mlp", 20)], "line one\n\n- line two")
    md.write_text(f"# Benchmark results\n\n{body}\n## other\n\nkept\n")
    assert bench.kept_notes(md) == "line one\n\n- line two"
    md.write_text("# Benchmark results\n\n## other\n")
    assert bench.kept_notes(md) == ""


def test_a_bad_saved_line_names_file_and_line(bench, tmp_path):
    bad = tmp_path / "run.jsonl"
    bad.write_text(json.dumps({"name": "mlp"}) + "\n{not json\n")
    with pytest.raises(SystemExit, match=r"run.jsonl:2: not JSON"):
        bench.load_results([bad])
    bad.write_text(json.dumps({"name": "mlp", "speed": 3}) + "\n")
    with pytest.raises(SystemExit, match=r"run.jsonl:1: unknown fields \['speed'\]"):
        bench.load_results([bad])
    bad.write_text(json.dumps({"name": "mlp"}) + "\n")
    assert bench.load_results([bad], "abc")[0][0].commit == "abc"
