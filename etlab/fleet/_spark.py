"""The same ingest and SQL on Apache Spark, for fleets one machine cannot hold.

`SparkFleet(master="local[2]")` runs in-process in local mode (tests, benchmarks); a cluster's
master URL (`spark://host:7077`, `yarn`) runs the same code there, with the store on a filesystem
every executor and the driver share.

Ingest: the driver plans exactly as the process-pool ingest does (tags, resume from the
manifest), Spark reads the files in parallel with `mapInArrow` (the same per-file conversion,
so the rows are identical), writes them partitioned by program and build into a staging
directory of the store, and the driver moves the parts into `events/` under the chunk's id and
commits the manifest part last, so the pool ingest's leftover cleanup covers Spark's too.
Queries: the views `events` and `files` over the same Parquet layout, and the same SQL text.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import uuid
import warnings
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from etlab.fleet import _queries, _store
from etlab.fleet._events import PARTITION_COLUMNS, PLAIN_EVENT_SCHEMA, events_table
from etlab.fleet._ingest import (
    IngestItem,
    IngestSummary,
    _reason,
    _record,
    commit_chunk,
    plan_ingest,
    prepare_store,
    read_file_events,
)
from etlab.fleet._store import FileRecord
from etlab.fleet._tags import FileTags

STAGING_DIR = "_staging"
_ITEM_SCHEMA = "path string, size long, mtime_ns long, file_id long, tags string, error string"
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",   # build "1.10" stays a string
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.ansi.enabled": "false",
}


def _spark_type(t: pa.DataType) -> str:
    return {pa.int64(): "long", pa.int32(): "int", pa.bool_(): "boolean", pa.string(): "string"}[t]


OUT_SCHEMA = pa.schema(list(PLAIN_EVENT_SCHEMA) + [(c, pa.string()) for c in PARTITION_COLUMNS])
_OUT_DDL = ", ".join(f"{f.name} {_spark_type(f.type)}" for f in OUT_SCHEMA)


@contextlib.contextmanager
def _pandas_warnings_off():
    """pyspark 4 warns about pandas 3 on every conversion; the conversions used here work."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not yet fully support pandas")
        warnings.filterwarnings("ignore", message="The copy keyword is deprecated")
        yield


class _Concat(AccumulatorParam):
    """Accumulates lists (the manifest rows reported by the executors)."""

    def zero(self, value):
        return []

    def addInPlace(self, a, b):
        a.extend(b)
        return a


def _item_of(row: dict) -> IngestItem:
    tags = None
    if row["tags"] is not None:
        raw = json.loads(row["tags"])
        tags = FileTags(**raw)
    return IngestItem(row["path"], row["size"], row["mtime_ns"], row["file_id"], tags, row["error"])


def _convert_batches(batches, records_acc, chunk: str):
    """Executor side of the ingest: item rows in, event rows out (Arrow); manifest rows go to an accumulator."""
    for batch in batches:
        records = []
        for row in batch.to_pylist():
            item = _item_of(row)
            try:
                ev = read_file_events(item)
            except Exception as e:  # any defect of one untrusted file skips that file, never the ingest
                records.append(asdict(_record(item, chunk, None, _reason(e, item.path))))
                continue
            records.append(asdict(_record(item, chunk, ev, None)))
            table = events_table([ev]).cast(PLAIN_EVENT_SCHEMA)
            n = table.num_rows
            table = table.append_column("program", pa.array([item.tags.program] * n, pa.string()))
            table = table.append_column("build", pa.array([item.tags.build] * n, pa.string()))
            yield from table.to_batches()
        records_acc.add(records)


class SparkFleet:
    """A Spark session set up for fleet stores: `ingest`, `sql` and the ready-made queries."""

    def __init__(self, master: str = "local[2]", *, app_name: str = "etlab-fleet", conf: dict | None = None):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(master).appName(app_name)
        for k, v in {**DEFAULT_CONF, **(conf or {})}.items():
            builder = builder.config(k, v)
        self.spark = builder.getOrCreate()
        self.spark.sparkContext.setLogLevel("ERROR")

    # -- queries ---------------------------------------------------------------------------------
    def register(self, store) -> None:
        """Creates (replaces) the temp views `events` and `files` over `store`."""
        root = _store.check_store(store)
        if _store.event_parts(root):
            events = (self.spark.read.option("basePath", str(root / _store.EVENTS_DIR))
                      .parquet(str(root / _store.EVENTS_DIR / "program=*" / "build=*" / "*.parquet")))
        else:
            events = self.spark.createDataFrame([], _OUT_DDL)
        events.createOrReplaceTempView("events")
        if _store.manifest_parts(root):
            files = self.spark.read.parquet(*map(str, _store.manifest_parts(root)))
        else:
            files = self.spark.createDataFrame(_store.MANIFEST_SCHEMA.empty_table().to_pandas())
        files.createOrReplaceTempView("files")

    def sql(self, store, query: str) -> pd.DataFrame:
        """Any Spark SQL over the views `events` and `files` of `store`, as a DataFrame."""
        self.register(store)
        with _pandas_warnings_off():
            return self.spark.sql(query).toPandas()

    def op_percentiles(self, store, by=("device_class",), where: str | None = None) -> pd.DataFrame:
        """`FleetDB.op_percentiles` computed by Spark (one sort for the three quantiles)."""
        return self.sql(store, _queries.op_percentiles_sql(by, where, dialect="spark"))

    def slowest_ops(self, store, limit: int = 20, by=(), where: str | None = None) -> pd.DataFrame:
        """`FleetDB.slowest_ops` computed by Spark."""
        return self.sql(store, _queries.slowest_ops_sql(limit, by, where))

    def run_variance(self, store, by=("program", "build", "device"), where: str | None = None,
                     min_runs: int = 3) -> pd.DataFrame:
        """`FleetDB.run_variance` computed by Spark."""
        return self.sql(store, _queries.run_variance_sql(by, where, min_runs))

    def outlier_runs(self, store, z: float = 5.0, by=("program", "build", "method", "device"),
                     where: str | None = None) -> pd.DataFrame:
        """`FleetDB.outlier_runs` computed by Spark (without the manifest's paths joined)."""
        return self.sql(store, _queries.outlier_runs_sql(z, by, where))

    # -- ingest ----------------------------------------------------------------------------------
    def ingest(self, sources, store, *, pattern: str | None = None, tags: dict | None = None,
               partitions: int | None = None) -> IngestSummary:
        """Like `etlab.fleet.ingest`, with Spark reading the files and writing the Parquet parts."""
        t0 = time.perf_counter()
        root, known_bad, removed = prepare_store(store)
        shutil.rmtree(root / STAGING_DIR, ignore_errors=True)
        items, already = plan_ingest(sources, root, pattern=pattern, tags=tags)
        summary = IngestSummary(store=str(root), files_found=len(items) + already, files_already_stored=already,
                                leftovers_removed=removed)
        if items:
            chunk = uuid.uuid4().hex
            rows = [{"path": i.path, "size": i.size, "mtime_ns": i.mtime_ns, "file_id": i.file_id,
                     "tags": None if i.tags is None else json.dumps(asdict(i.tags)), "error": i.error}
                    for i in items]
            sc = self.spark.sparkContext
            n_parts = partitions or max(1, min(len(rows), sc.defaultParallelism * 4))
            acc = sc.accumulator([], _Concat())
            with _pandas_warnings_off():
                df = self.spark.createDataFrame(pd.DataFrame(rows), _ITEM_SCHEMA).repartition(n_parts)
                out = df.mapInArrow(lambda it: _convert_batches(it, acc, chunk), _OUT_DDL)
            staging = root / STAGING_DIR / chunk
            out.write.partitionBy(*PARTITION_COLUMNS).mode("overwrite").parquet(str(staging))
            _publish(root, staging, chunk)
            records = [FileRecord(**r) for r in {r["file_id"]: r for r in acc.value}.values()]
            records.sort(key=lambda r: r.path)
            commit_chunk(root, chunk, records, known_bad)
            shutil.rmtree(root / STAGING_DIR, ignore_errors=True)
            summary.add(records)
        summary.bad.sort()
        summary.seconds = time.perf_counter() - t0
        return summary

    def stop(self) -> None:
        """Stops the Spark session (getOrCreate's, so also anyone else's in this process); `with` does it."""
        self.spark.stop()

    def __enter__(self) -> SparkFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _publish(root: Path, staging: Path, chunk: str) -> None:
    """Moves Spark's staged parts into the store's partitions as `part-<chunk>-<n>.parquet`."""
    for n, part in enumerate(sorted(staging.glob("program=*/build=*/*.parquet"))):
        dest = root / _store.EVENTS_DIR / part.parent.parent.name / part.parent.name
        dest.mkdir(parents=True, exist_ok=True)
        os.replace(part, dest / f"part-{chunk}-{n:05d}.parquet")
