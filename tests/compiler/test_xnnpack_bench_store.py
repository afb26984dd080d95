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


def _pair(bench, store, name, scratch, commit="c9", etlab=b"E" * 10, upstream=b"U" * 20):
    scratch.mkdir(parents=True, exist_ok=True)
    for file, data in (("etlab.pte", etlab), ("upstream.pte", upstream), ("inputs.pt", b"I")):
        (scratch / file).write_bytes(data)
    return sys.modules["_xnnpack_ptes"].keep_pair(store, name, scratch, commit, "bench")


def test_a_kept_pair_is_read_back_and_a_replaced_file_is_named(bench, tmp_path):
    ptes = sys.modules["_xnnpack_ptes"]
    store = tmp_path / "pairs"
    kept = _pair(bench, store, "mlp", tmp_path / "s")
    got = ptes.read_pair(store, "mlp")
    assert (got.commit, got.source, got.folder) == ("c9", "bench", kept.folder)
    assert ptes.kept_models(store) == ["mlp"]
    (store / "mlp" / "etlab.pte").write_bytes(b"X" * 10)  # same size, other bytes
    with pytest.raises(ValueError, match=r"mlp/etlab.pte: SHA-256 differs"):
        ptes.read_pair(store, "mlp")
    assert ptes.read_pair(store, "mlp", verify=False).commit == "c9"
    (store / "mlp" / "upstream.pte").write_bytes(b"U")
    with pytest.raises(ValueError, match=r"upstream.pte: 1 bytes, the manifest says 20"):
        ptes.read_pair(store, "mlp", verify=False)
    with pytest.raises(ValueError, match=r"cnn/manifest.json: no manifest"):
        ptes.read_pair(store, "cnn")
    (store / "mlp" / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match=r"manifest\.json: not JSON"):
        ptes.read_pair(store, "mlp")
    with pytest.raises(FileNotFoundError, match=r"no etlab\.pte, upstream\.pte, inputs\.pt"):
        ptes.keep_pair(store, "gru", tmp_path / "empty", "c9", "bench")


def _timed_row(bench, name, ms):
    r = _row(bench, name, 20)
    r.latency = {"1": {"etlab": ms, "upstream": ms}, "default": {"etlab": ms, "upstream": ms}}
    r.load = [9.0, 9.5]
    return r


def test_rounds_fit_the_budget_small_models_get_more(bench, tmp_path):
    lat = sys.modules["_xnnpack_latency"]
    store = tmp_path / "pairs"
    rows = [_timed_row(bench, "mlp", 0.01), _timed_row(bench, "cnn", 200.0)]
    pairs = {r.name: _pair(bench, store, r.name, tmp_path / r.name) for r in rows}
    roomy = lat.plan(rows, pairs, ["1"], budget_s=1e4)
    assert [p.rounds for p in roomy] == [30, 30]
    tight = lat.plan(rows, pairs, ["1", "default"], budget_s=20)
    by = {(p.model, p.label): p for p in tight}
    assert sum(p.seconds for p in tight) <= 20
    assert by["mlp", "1"].rounds == 30 and by["mlp", "1"].per_round == lat.MAX_PER_ROUND
    assert 5 <= by["cnn", "1"].rounds < 30 and by["cnn", "1"].per_round == 1
    starved = lat.plan(rows, pairs, ["1"], budget_s=0.1)  # never fewer than min_rounds: over budget, said so
    assert min(p.rounds for p in starved) == 5 and sum(p.seconds for p in starved) > 0.1


def test_latency_only_changes_only_the_latency_fields_and_says_so(bench, tmp_path):
    lat = sys.modules["_xnnpack_latency"]
    store = tmp_path / "pairs"
    rows = [_timed_row(bench, n, 1.0) for n in ("mlp", "cnn", "gru")]
    before = {r.name: (r.etlab_nodes, r.etlab_s, r.upstream_s, r.commit, r.load) for r in rows}
    _pair(bench, store, "mlp", tmp_path / "a", commit="p1")
    _pair(bench, store, "cnn", tmp_path / "b", commit="p1")
    asked, saved, said = [], [], []

    def ask(timeout=None, **req):
        asked.append(req)
        if req["cmd"] == "ready":
            return {"ready": True}
        if "cnn" in req["ptes"]["etlab"] and req["threads"] == 0:
            raise RuntimeError("upstream worker exited (code -11)")
        return {"median_ms": {"etlab": 0.5, "upstream": 0.4}, "iqr_ms": {"etlab": [0.4, 0.6], "upstream": [0.3, 0.5]},
                "threads": req["threads"] or 2}

    done = lat.retime(rows, store, ["1", "default"], 60, ask, saved.append, log=said.append)
    assert sorted(r.name for r in done) == ["cnn", "mlp"] and len(saved) == 3
    assert asked[0] == {"cmd": "ready"} and len(asked) == 5
    assert {(q["threads"], q["ptes"]["upstream"].endswith("upstream.pte")) for q in asked[1:]} == {(1, True), (0, True)}
    assert any("no usable kept pair for 1 rows" in s and "gru" in s for s in said)
    assert any("cnn default: FAILED (upstream worker exited (code -11)); row left as it is" in s for s in said)
    mlp, cnn, gru = rows
    assert mlp.latency_ratio("1") == pytest.approx(1.25) and mlp.latency_ratio("default") == pytest.approx(1.25)
    assert mlp.threads_default == 2 and cnn.latency["default"] == {"etlab": 1.0, "upstream": 1.0}
    assert gru.latency_retimed == {} and gru.latency_ratio("1") == 1.0
    assert {r.name: (r.etlab_nodes, r.etlab_s, r.upstream_s, r.commit, r.load) for r in rows} == before
    note = bench._note_cell(mlp)
    assert "latency 1T re-timed alone" in note and "default (2 threads) re-timed alone" in note
    assert "from the kept .pte pair lowered at p1 (bench)" in note and "only the latency columns changed" in note
    assert bench._note_cell(gru).endswith("rounds 1 / 10")


def test_default_threads_re_timed_on_a_quiet_machine_are_a_measurement(bench):
    rows = [_timed_row(bench, n, 1.0) for n in ("mlp", "cnn")]
    for r in rows:
        r.load = [1e4, 1e4]
    assert "NOT a measurement" in bench.render(rows)
    for r in rows:
        r.latency_retimed["default"] = {"date": "2026-11-28T01:00:00Z", "load": [0.2, 0.3], "rounds": 30,
                                        "per_round": 5, "threads": 2, "pte_commit": "p1", "pte_source": "bench"}
    text = bench.render(rows)
    assert "NOT a measurement" not in text and "Latency at default threads: median 1.000" in text
    assert "re-timed from the kept .pte pairs (--latency-only): default threads of 2 of 2 rows (load 0.2-0.3)" in text


def test_store_only_takes_the_rows_without_a_pair_smallest_first(bench, tmp_path):
    store = tmp_path / "pairs"
    rows = [_row(bench, "mlp", 20), _row(bench, "cnn", 40), _row(bench, "gru", 10), _row(bench, "lstm", 5)]
    rows[3].etlab_partitions = None  # etlab's lowering failed: nothing to keep
    _pair(bench, store, "cnn", tmp_path / "c")
    assert [r.name for r in bench.lacking_pairs(rows, store)] == ["gru", "mlp"]


def test_latency_only_and_store_only_are_refused_together(bench):
    with pytest.raises(SystemExit, match="--latency-only and --store-only are two runs"):
        bench.main(["--latency-only", "--store-only"])


def test_a_silent_or_dead_worker_is_named_and_started_again(bench, tmp_path):
    """An unattended --latency-only run goes on after a program that hangs or crashes upstream's runtime."""
    import subprocess

    script = tmp_path / "worker.py"
    script.write_text("import json, sys, time\n"
                      "for line in sys.stdin:\n"
                      "    req = json.loads(line)\n"
                      "    if req['cmd'] == 'hang': time.sleep(60)\n"
                      "    if req['cmd'] == 'die': sys.exit(3)\n"
                      "    print(json.dumps({'echo': req['cmd']}), flush=True)\n")

    class Fake(bench.Upstream):
        def _start(self):
            return subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True)

    up = Fake("unused")
    try:
        assert up.ask(cmd="a") == {"echo": "a"}
        with pytest.raises(RuntimeError, match=r"gave no answer in 1 s \(stopped\)"):
            up.ask(cmd="hang", timeout=1)
        assert up.ask(cmd="b", timeout=30) == {"echo": "b"}
        with pytest.raises(RuntimeError, match=r"upstream worker exited \(code 3\)"):
            up.ask(cmd="die")
        assert up.ask(cmd="c") == {"echo": "c"}
    finally:
        up.close()
