"""Ready-made fleet queries as SQL that DuckDB and Spark SQL both run unchanged, and DuckDB over a store.

The queries read two views: `events` (one row per profile event, with the partition columns
`program` and `build`, and the memory rows: category memory, `bytes`) and `files` (the manifest). They use
only what both engines share (CTEs, `percentile_cont(q) WITHIN GROUP (ORDER BY x)`, `stddev_samp`,
`JOIN ... USING`), so the Spark tests can compare the two engines on the same text, row for row.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from etlab.fleet import _store
from etlab.fleet._events import PARTITION_COLUMNS, PLAIN_EVENT_SCHEMA

GROUP_COLUMNS = ("program", "build", "method", "device", "device_class", "op", "category", "event", "run_name",
                 "debug_handle", "chain", "instruction", "delegate_id_str", "labels")
# The rows of OP_CATEGORIES. Not a bare "(is_op)": Spark (ANSI off) would read `events WHERE (is_op)`
# as the table aliased WHERE with a column list.
OPS_WHERE = "is_op = true"
DIALECTS = ("ansi", "duckdb", "spark")
_QUANTILES = (0.5, 0.9, 0.99)
_IDENT = re.compile(r"[a-z_]+")


def _columns(cols, what: str) -> list[str]:
    """Grouping columns named by a caller, checked against the store's columns (they go into SQL)."""
    cols = [cols] if isinstance(cols, str) else list(cols)
    for c in cols:
        if c not in GROUP_COLUMNS or not _IDENT.fullmatch(c):
            raise ValueError(f"{what}: unknown column {c!r} (one of {', '.join(GROUP_COLUMNS)})")
    return cols


def _where(*conds: str | None) -> str:
    parts = [f"({c})" for c in conds if c]
    return "WHERE " + " AND ".join(parts) if parts else ""


def _sel(cols: list[str]) -> str:
    return "".join(f"{c}, " for c in cols)


def op_percentiles_sql(by=("device_class",), where: str | None = None, dialect: str = "ansi") -> str:
    """Per op (and `by` columns): event count, p50/p90/p99 and mean duration in ns.

    "ansi" is the text both engines run (`percentile_cont ... WITHIN GROUP`, one sort per
    quantile); "duckdb" and "spark" compute the three quantiles from one sort with the engine's
    list form (`quantile_cont(x, [..])`, `percentile(x, array(..))`): same values, faster.
    """
    cols = [*_columns(by, "by"), "op"]
    keys = ", ".join(cols)
    names = [f"p{int(q * 100)}_ns" for q in _QUANTILES]
    if dialect == "ansi":
        pct = ", ".join(f"percentile_cont({q}) WITHIN GROUP (ORDER BY duration_ns) AS {n}"
                        for q, n in zip(_QUANTILES, names))
        return (f"SELECT {keys}, count(*) AS n, {pct}, avg(duration_ns) AS mean_ns FROM events "
                f"{_where(OPS_WHERE, where)} GROUP BY {keys} ORDER BY {keys}")
    if dialect not in DIALECTS:
        raise ValueError(f"dialect {dialect!r}: one of {', '.join(DIALECTS)}")
    qs = ", ".join(map(str, _QUANTILES))
    agg, first = (f"quantile_cont(duration_ns, [{qs}])", 1) if dialect == "duckdb" else \
        (f"percentile(duration_ns, array({qs}))", 0)
    pct = ", ".join(f"q[{first + i}] AS {n}" for i, n in enumerate(names))
    return (f"SELECT {keys}, n, {pct}, mean_ns FROM (SELECT {keys}, count(*) AS n, {agg} AS q, "
            f"avg(duration_ns) AS mean_ns FROM events {_where(OPS_WHERE, where)} GROUP BY {keys}) t ORDER BY {keys}")


def slowest_ops_sql(limit: int = 20, by=(), where: str | None = None) -> str:
    """The ops that take the most time in total (and their share of all op time)."""
    cols = [*_columns(by, "by"), "op", "category"]
    return (f"WITH t AS (SELECT {_sel(cols)}count(*) AS n, sum(duration_ns) AS total_ns, "
            f"percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ns) AS p50_ns FROM events "
            f"{_where(OPS_WHERE, where)} GROUP BY {', '.join(cols)}) "
            f"SELECT t.*, t.total_ns / sum(t.total_ns) OVER () AS share FROM t "
            f"ORDER BY total_ns DESC, {', '.join(cols)} LIMIT {int(limit)}")


def run_variance_sql(by=("program", "build", "device"), where: str | None = None, min_runs: int = 3) -> str:
    """Run-to-run variation of each op's time per run: mean, standard deviation and their ratio (cv)."""
    cols = [*_columns(by, "by"), "op"]
    keys = ", ".join(cols)
    return (f"WITH per_run AS (SELECT {keys}, file_id, run, sum(duration_ns) AS run_ns FROM events "
            f"{_where(OPS_WHERE, where)} GROUP BY {keys}, file_id, run) "
            f"SELECT {keys}, count(*) AS runs, avg(run_ns) AS mean_ns, stddev_samp(run_ns) AS std_ns, "
            f"stddev_samp(run_ns) / avg(run_ns) AS cv FROM per_run GROUP BY {keys} "
            f"HAVING count(*) >= {int(min_runs)} ORDER BY cv DESC, {keys}")


def outlier_runs_sql(z: float = 5.0, by=("program", "build", "method", "device"), where: str | None = None) -> str:
    """Runs whose Method::execute time is more than `z` robust standard deviations (1.4826 MAD) above
    the median of their group."""
    cols = _columns(by, "by")
    keys = ", ".join(cols)
    run_events = _where("event = 'Method::execute'", where)
    return (f"WITH runs AS (SELECT {keys}, file_id, run, sum(duration_ns) AS run_ns FROM events "
            f"{run_events} GROUP BY {keys}, file_id, run), "
            f"med AS (SELECT {keys}, percentile_cont(0.5) WITHIN GROUP (ORDER BY run_ns) AS median_ns "
            f"FROM runs GROUP BY {keys}), "
            f"dev AS (SELECT runs.*, med.median_ns, abs(run_ns - median_ns) AS abs_dev "
            f"FROM runs JOIN med USING ({keys})), "
            f"mad AS (SELECT {keys}, percentile_cont(0.5) WITHIN GROUP (ORDER BY abs_dev) AS mad_ns "
            f"FROM dev GROUP BY {keys}), "
            f"scored AS (SELECT dev.*, mad.mad_ns, (run_ns - median_ns) / (1.4826 * mad_ns) AS robust_z "
            f"FROM dev JOIN mad USING ({keys}) WHERE mad_ns > 0) "
            f"SELECT {keys}, file_id, run, run_ns, median_ns, mad_ns, robust_z FROM scored "
            f"WHERE robust_z > {float(z)} ORDER BY robust_z DESC, file_id, run")


MEMORY_WHERE = "category = 'memory'"
TRACKED = "tracked"  # the op of a run block's tracked peak (etlab.inspector.MemorySummary.blocks)


def memory_peaks_sql(by=("device_class", "build"), where: str | None = None, owner: str = TRACKED) -> str:
    """Peak memory per `by` group: over the blocks (runs) of the files in it, p50 / p90 / max of `owner`'s
    bytes; by default each run's tracked peak (load bytes plus the most the run added at one instruction).
    The rows come from allocation events (a run traced with trace_allocations); files without them add none."""
    cols = _columns(by, "by")
    keys = ", ".join(cols)
    pct = ", ".join(f"percentile_cont({q}) WITHIN GROUP (ORDER BY bytes) AS p{int(q * 100)}_bytes" for q in (0.5, 0.9))
    return (f"SELECT {keys}, count(*) AS runs, count(DISTINCT file_id) AS files, {pct}, max(bytes) AS max_bytes "
            f"FROM events {_where(MEMORY_WHERE, f'op = {_sql_string(owner)}', where)} GROUP BY {keys} ORDER BY {keys}")


def memory_owners_sql(by=("build",), where: str | None = None) -> str:
    """Per owner (planned arenas, method allocator, temporaries, each delegate, unplanned, rss, ...; and
    "tracked") and `by` group: blocks, p50 and max of its bytes in a block (its load bytes, or its run peak)."""
    cols = [*_columns(by, "by"), "op"]
    keys = ", ".join(cols)
    return (f"SELECT {keys}, count(*) AS blocks, percentile_cont(0.5) WITHIN GROUP (ORDER BY bytes) AS p50_bytes, "
            f"max(bytes) AS max_bytes FROM events {_where(MEMORY_WHERE, where)} GROUP BY {keys} ORDER BY {keys}")


def _sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class FleetDB:
    """DuckDB over a fleet store: views `events` and `files`, raw SQL and ready-made queries as pandas.

    The connection is in-memory; the store's Parquet files are read in place, never copied.
    """

    def __init__(self, store, *, threads: int | None = None):
        import duckdb

        self.store = _store.check_store(store)
        self.con = duckdb.connect(config={"threads": threads} if threads else {})
        self._create_views(self.store)

    def _create_views(self, root: Path) -> None:
        import pyarrow as pa

        if _store.event_parts(root):
            glob = _sql_string(str(root / _store.EVENTS_DIR / "program=*" / "build=*" / "*.parquet"))
            # union_by_name: parts written before a column was added (bytes) read with it as null
            self.con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({glob}, hive_partitioning=true, "
                             "hive_types_autocast=false, union_by_name=true)")
        else:  # a store with no events yet still answers every query (with no rows)
            empty = pa.schema(list(PLAIN_EVENT_SCHEMA) + [(c, pa.string()) for c in PARTITION_COLUMNS]).empty_table()
            self.con.register("events_empty", empty)
            self.con.execute("CREATE VIEW events AS SELECT * FROM events_empty")
        self.con.register("files_table", _store.read_manifest(root))
        self.con.execute("CREATE VIEW files AS SELECT * FROM files_table")

    def sql(self, query: str, params=None) -> pd.DataFrame:
        """Any SQL over the views `events` and `files`, as a DataFrame."""
        return self.con.execute(query, params).df()

    def op_percentiles(self, by=("device_class",), where: str | None = None) -> pd.DataFrame:
        """Per op (and `by` columns): n, p50/p90/p99 and mean duration in ns (`op_percentiles_sql`)."""
        return self.sql(op_percentiles_sql(by, where, dialect="duckdb"))

    def slowest_ops(self, limit: int = 20, by=(), where: str | None = None) -> pd.DataFrame:
        """The `limit` ops with the most total time, and their share of all op time (`slowest_ops_sql`)."""
        return self.sql(slowest_ops_sql(limit, by, where))

    def run_variance(self, by=("program", "build", "device"), where: str | None = None,
                     min_runs: int = 3) -> pd.DataFrame:
        """Run-to-run variation of each op's time per run (mean, std, cv), groups of `min_runs` runs or more."""
        return self.sql(run_variance_sql(by, where, min_runs))

    def outlier_runs(self, z: float = 5.0, by=("program", "build", "method", "device"),
                     where: str | None = None) -> pd.DataFrame:
        """Outlier runs, with the source file's path joined from the manifest."""
        out = self.sql(outlier_runs_sql(z, by, where))
        paths = self.sql("SELECT file_id, path FROM files")
        return out.merge(paths, on="file_id", how="left")

    def memory_peaks(self, by=("device_class", "build"), where: str | None = None, owner: str = TRACKED
                     ) -> pd.DataFrame:
        """Peak memory per group: runs, files, p50 / p90 / max bytes of each run's tracked peak (`memory_peaks_sql`)."""
        return self.sql(memory_peaks_sql(by, where, owner))

    def memory_owners(self, by=("build",), where: str | None = None) -> pd.DataFrame:
        """Per owner and group: blocks, p50 and max bytes (`memory_owners_sql`)."""
        return self.sql(memory_owners_sql(by, where))

    def close(self) -> None:
        """Closes the DuckDB connection (the store's files are untouched); `with FleetDB(...)` does it."""
        self.con.close()

    def __enter__(self) -> FleetDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


READY_QUERIES = {
    "percentiles": op_percentiles_sql,
    "slowest": slowest_ops_sql,
    "variance": run_variance_sql,
    "outliers": outlier_runs_sql,
}
# Over the memory rows, which only files traced with allocation events have (`fleet stats S memory`).
MEMORY_QUERIES = {
    "memory": memory_peaks_sql,
    "memory-owners": memory_owners_sql,
}
