"""Ready-made DuckDB queries checked against numpy on the same rows, outliers against the planted truth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from etlab.fleet import FleetDB, ingest
from etlab.fleet._cli import fleet_main


@pytest.fixture(scope="module")
def db(store):
    with FleetDB(store[0]) as d:
        yield d


@pytest.fixture(scope="module")
def rows(db) -> pd.DataFrame:
    return db.sql("SELECT * FROM events")


def test_views_have_partition_columns_as_strings(db, fleet):
    got = db.sql("SELECT DISTINCT program, build FROM events ORDER BY build")
    assert got.values.tolist() == [[fleet.spec.program, "A"], [fleet.spec.program, "B"]]
    files = db.sql("SELECT status, count(*) AS n FROM files GROUP BY status ORDER BY status")
    assert files.values.tolist() == [["bad", 3], ["ok", len(fleet.files)]]


def test_op_percentiles_match_numpy(db, rows):
    got = db.op_percentiles(by=("device_class",)).set_index(["device_class", "op"])
    ops = rows[rows["category"].isin(["kernel", "operator", "delegate_call", "delegate"])]
    assert set(got.index) == set(ops.groupby(["device_class", "op"]).groups)
    for (cls, op), g in ops.groupby(["device_class", "op"]):
        d = g["duration_ns"].to_numpy()
        r = got.loc[(cls, op)]
        assert r["n"] == len(d)
        np.testing.assert_allclose([r["p50_ns"], r["p90_ns"], r["p99_ns"], r["mean_ns"]],
                                   [*np.quantile(d, [0.5, 0.9, 0.99]), d.mean()], rtol=1e-12)


def test_percentile_dialects_agree(db):
    from etlab.fleet import op_percentiles_sql

    ansi = db.sql(op_percentiles_sql(by=("build", "device"), dialect="ansi"))
    pd.testing.assert_frame_equal(db.sql(op_percentiles_sql(by=("build", "device"), dialect="duckdb")), ansi)
    with pytest.raises(ValueError, match="dialect"):
        op_percentiles_sql(dialect="oracle")


def test_slowest_ops_rank_total_time(db, rows):
    got = db.slowest_ops(limit=3)
    ops = rows[rows["category"].isin(["kernel", "operator", "delegate_call", "delegate"])]
    totals = ops.groupby(["op", "category"])["duration_ns"].sum().sort_values(ascending=False)
    assert list(zip(got["op"], got["category"])) == list(totals.index[:3])
    assert got["op"].iloc[0] == "convolution.out"
    np.testing.assert_allclose(got["share"], totals.iloc[:3] / totals.sum())


def test_run_variance_is_per_run_totals(db, rows):
    got = db.run_variance(by=("device",), min_runs=2).set_index(["device", "op"])
    g = rows[(rows["op"] == "convolution.out") & (rows["category"] == "kernel") & (rows["device"] == "mid-00")]
    per_run = g.groupby(["file_id", "run"])["duration_ns"].sum()
    r = got.loc[("mid-00", "convolution.out")]
    assert r["runs"] == len(per_run)
    np.testing.assert_allclose([r["mean_ns"], r["std_ns"]], [per_run.mean(), per_run.std(ddof=1)])


def test_outlier_runs_are_exactly_the_planted_ones(db, fleet):
    got = db.outlier_runs(z=5.0)
    assert len(fleet.outlier_runs) >= 2
    assert sorted(zip(got["path"], got["run"])) == sorted(fleet.outlier_runs)
    assert (got["robust_z"] > 5).all()


def test_raw_sql_params_and_errors(db):
    assert db.sql("SELECT count(*) AS n FROM events WHERE build = ?", ["B"])["n"].iloc[0] > 0
    with pytest.raises(ValueError, match="unknown column"):
        db.op_percentiles(by=("device; DROP TABLE x",))


def test_empty_store_answers_with_no_rows(tmp_path):
    ingest([], tmp_path / "s")
    with FleetDB(tmp_path / "s") as d:
        assert d.op_percentiles().empty and d.outlier_runs().empty


def test_cli_query_and_stats(store, capsys):
    assert fleet_main(["query", str(store[0]), "SELECT build, count(*) AS n FROM events GROUP BY 1 ORDER BY 1",
                       "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "build,n" and out[1].startswith("A,") and out[2].startswith("B,")
    assert fleet_main(["stats", str(store[0]), "percentiles", "--by", "device_class", "--format", "json"]) == 0
    assert '"p99_ns"' in capsys.readouterr().out
    assert fleet_main(["query", str(store[0]), "SELECT nosuch FROM events"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("etlab fleet: error: ") and "nosuch" in err[0]


def test_etlab_cli_delegates_to_fleet(store, capsys):
    from etlab.cli import main

    assert main(["fleet", "stats", str(store[0]), "slowest", "--limit", "2", "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("op,category,n,total_ns") and out[1].startswith("convolution.out,kernel,")
