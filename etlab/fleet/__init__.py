"""Fleet analysis: ETDumps from many devices and builds in one Parquet store, queried with SQL.

- `ingest(sources, store, pattern=..., tags=...)` -> `IngestSummary`: .etdp files tagged with
  program (hash of the .pte), method, device, build and labels, one row per profile event,
  partitioned by program and build; bad files skipped and counted; resumable.
- `FleetDB(store)`: DuckDB over the store; `.sql(query)` -> pandas, and ready-made queries
  `op_percentiles`, `slowest_ops`, `run_variance`, `outlier_runs`; memory (runs traced with allocation
  events): `memory_peaks` (peak per device class and build), `memory_owners`.
- `diff(store, base={"build": "A"}, head={"build": "B"})` -> `FleetDiff`: per-op p50 change with a
  bootstrap confidence interval, Mann-Whitney U with Holm correction, threshold flags; `.view()`;
  `metric="memory"`: memory per owner instead (a regression is memory that grew).
- `SparkFleet(master="local[2]")`: the same ingest and SQL on Apache Spark, same store layout.
- `generate_fleet(out, FleetSpec(...))`: a synthetic fleet with a planted regression.
"""

from etlab.fleet._cli import fleet_main
from etlab.fleet._diff import FleetDiff, diff, holm, parse_selector
from etlab.fleet._events import CATEGORIES, EVENT_SCHEMA, OP_CATEGORIES
from etlab.fleet._ingest import IngestSummary, ingest
from etlab.fleet._queries import (
    FleetDB,
    memory_owners_sql,
    memory_peaks_sql,
    op_percentiles_sql,
    outlier_runs_sql,
    run_variance_sql,
    slowest_ops_sql,
)
from etlab.fleet._store import read_manifest
from etlab.fleet._synthetic import PATH_PATTERN, FleetSpec, Regression, SyntheticFleet, generate_fleet
from etlab.fleet._tags import FileTags, PathPattern, program_hash

__all__ = [
    "CATEGORIES", "EVENT_SCHEMA", "OP_CATEGORIES", "PATH_PATTERN", "FileTags", "FleetDB", "FleetDiff", "FleetSpec",
    "IngestSummary", "PathPattern", "Regression", "SparkFleet", "SyntheticFleet", "diff", "fleet_main",
    "generate_fleet", "holm", "ingest", "memory_owners_sql", "memory_peaks_sql",
    "op_percentiles_sql", "outlier_runs_sql", "parse_selector", "program_hash",
    "read_manifest", "run_variance_sql", "slowest_ops_sql",
]


def __getattr__(name: str):
    # Spark is optional at import time: pyspark (and a JVM) are loaded only when SparkFleet is used.
    if name == "SparkFleet":
        from etlab.fleet._spark import SparkFleet

        return SparkFleet
    raise AttributeError(f"module 'etlab.fleet' has no attribute {name!r}")
