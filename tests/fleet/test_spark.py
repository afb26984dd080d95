"""Spark local mode: the same ingest and the same SQL as DuckDB, compared row for row (marker `spark`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from etlab.fleet import FleetDB, read_manifest
from etlab.fleet._queries import READY_QUERIES

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.xdist_group("spark"),
              pytest.mark.filterwarnings("ignore:.*does not yet fully support pandas"),
              pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")]


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None:
        pytest.skip("no JDK: `make test` installs Debian's default-jdk-headless")
    from etlab.fleet import SparkFleet

    sf = SparkFleet("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    yield sf
    sf.stop()


@pytest.fixture(scope="module")
def spark_store(spark, fleet, tmp_path_factory):
    path = tmp_path_factory.mktemp("spark") / "s"
    return path, spark.ingest(fleet.root, path, partitions=4)


def _all_events(store: Path) -> pd.DataFrame:
    glob = str(store / "events" / "*" / "*" / "*.parquet")
    return duckdb.sql(f"SELECT * FROM read_parquet('{glob}', hive_partitioning=true, hive_types_autocast=false) "
                      "ORDER BY file_id, run, start_ns, event, category").df()


def test_spark_ingest_writes_the_same_rows(spark_store, store):
    """Every event row and every manifest row is the same as the process-pool ingest's."""
    s_path, s_sum = spark_store
    assert (s_sum.files_ingested, s_sum.events, s_sum.bad) == (store[1].files_ingested, store[1].events, store[1].bad)
    pd.testing.assert_frame_equal(_all_events(s_path), _all_events(store[0]), check_dtype=False)
    cols = ["file_id", "path", "status", "error", "events", "runs", "program", "build", "device", "labels"]
    spark_m = read_manifest(s_path).to_pandas()[cols].sort_values("path").reset_index(drop=True)
    pool_m = read_manifest(store[0]).to_pandas()[cols].sort_values("path").reset_index(drop=True)
    pd.testing.assert_frame_equal(spark_m, pool_m)
    assert not (s_path / "_staging").exists()


def _same_frames(s: pd.DataFrame, d: pd.DataFrame) -> None:
    assert list(s.columns) == list(d.columns) and len(d) > 0
    for col in d.columns:
        if d[col].dtype.kind in "fiu":
            np.testing.assert_allclose(s[col].to_numpy(float), d[col].to_numpy(float), rtol=1e-9, err_msg=col)
        else:
            assert s[col].tolist() == d[col].tolist(), col


@pytest.mark.parametrize("name", sorted(READY_QUERIES))
def test_ready_queries_agree_row_for_row(name, spark, store):
    """The same SQL text on both engines gives the same rows."""
    sql = READY_QUERIES[name]()
    with FleetDB(store[0]) as db:
        _same_frames(spark.sql(store[0], sql), db.sql(sql))


def test_engine_specific_percentiles_agree(spark, store):
    with FleetDB(store[0]) as db:
        _same_frames(spark.op_percentiles(store[0]), db.op_percentiles())


def test_spark_resume_and_raw_sql(spark, spark_store, fleet):
    again = spark.ingest(fleet.root, spark_store[0])
    assert again.files_ingested == 0 and again.files_already_stored == len(fleet.files)
    got = spark.sql(spark_store[0], "SELECT build, count(*) AS n FROM events GROUP BY build ORDER BY build")
    assert got["n"].sum() == spark_store[1].events
