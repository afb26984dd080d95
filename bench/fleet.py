"""Fleet benchmark: ingest of ~10,000 ETDumps (~10M events), the per-op summary query in DuckDB
and in Spark local mode, and the memory peaks, in one run.

    .venv/bin/python bench/fleet.py [--devices-per-class 50] [--sessions 9] [--copies 4] [--runs 45]
                                    [--workers 2] [--spark-files 1000] [--no-spark] [--generate-only]

The synthetic fleet (etlab.fleet.generate_fleet: 150 devices x 2 builds x 9 sessions = 2,700
files of 45 runs, ~990 events each) is written once with etlab's ETDump writer (~0.13 s a file,
the slow part) and cached under ~/.cache/etlab/bench (ETLAB_BENCH_CACHE); the tree the ingest
reads holds each file `--copies` times under distinct paths (hard links: copy k of a device's
session is its own file to the ingest, with its own file id and rows), 10,800 files in all, so
the ingest reads and converts every one. Each ingest runs in a fresh process into a fresh store,
so its peak RSS (driver, and the largest worker) is its own. Spark is timed on the same per-op
summary over the same store (each engine's one-sort form of the three quantiles; the tests check
it equals the portable SQL), after a warm-up; its ingest on a subset, next to the process pool on
the same subset. Medians. Writes the `## fleet` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from _common import REPO, median, write_section

from etlab.fleet import FleetSpec, generate_fleet
from etlab.schema import write_atomic

CACHE = Path(os.environ.get("ETLAB_BENCH_CACHE", Path.home() / ".cache" / "etlab" / "bench"))
TARGET_INGEST_S = 60.0
TARGET_QUERY_S = 1.0


def cached_fleet(spec: FleetSpec, workers: int, copies: int) -> Path:
    """The fleet's tree for `spec`, generated once (atomically: a finished tree has done.json);
    copies > 1 links every .etdp (and its sidecar) again as copy-<k>-<name> beside it."""
    key = hashlib.sha256(json.dumps([asdict(spec), copies], sort_keys=True, default=str).encode()).hexdigest()[:12]
    root = CACHE / f"fleet-{key}"
    if (root / "done.json").is_file():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-fleet-", dir=CACHE))
    try:
        t0 = time.perf_counter()
        print(f"[bench] generating the fleet into {root} ...", file=sys.stderr, flush=True)
        fleet = generate_fleet(tmp / "tree", spec, workers=workers)
        for f in map(Path, fleet.files):
            for k in range(1, copies):
                for src in (f, f.with_name(f.name + ".json")):
                    os.link(src, src.with_name(f"copy-{k}-{src.name}"))
        write_atomic(tmp / "done.json", json.dumps({**fleet.truth(), "seconds": time.perf_counter() - t0}).encode())
        shutil.rmtree(root, ignore_errors=True)
        os.replace(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # the tree was generated under tmp: sources are re-found under root, sidecars are path-independent
    return root


# Runs in a fresh interpreter: one ingest, its time and the peak RSS of driver and workers.
_INGEST = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from etlab.fleet import ingest
srcs = json.loads(sys.argv[1])
t = time.perf_counter()
s = ingest(srcs, sys.argv[2], workers=int(sys.argv[3]))
dt = time.perf_counter() - t
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({{"seconds": dt, "files": s.files_ingested, "bad": s.files_bad, "events": s.events,
                  "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                  "driver_rss_mb": me.ru_maxrss / 1024, "worker_rss_mb": kids.ru_maxrss / 1024}}))
"""

_SPARK_INGEST = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from etlab.fleet import SparkFleet
t0 = time.perf_counter()
sf = SparkFleet("local[{workers}]", conf={{"spark.driver.memory": "4g"}})
start = time.perf_counter() - t0
s = sf.ingest(json.loads(sys.argv[1]), sys.argv[2])
print(json.dumps({{"seconds": s.seconds, "session_start": start, "files": s.files_ingested, "events": s.events}}))
sf.stop()
"""


def run_json(code: str, *args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def duckdb_query_times(store: Path, repeats: int) -> tuple[list[float], list[float], int, float]:
    """Wall and CPU seconds (all of DuckDB's threads) of each op_percentiles run after a warm-up run."""
    import resource

    from etlab.fleet import FleetDB

    db = FleetDB(store)
    times, cpu, rows = [], [], 0
    for _ in range(repeats + 1):
        t, c = time.perf_counter(), time.process_time()
        rows = len(db.op_percentiles(by=("device_class",)))
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    db.close()
    return times[1:], cpu[1:], rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_SPARK_QUERY = """
import json, sys, time
sys.path.insert(0, {repo!r})
from etlab.fleet import SparkFleet
sf = SparkFleet("local[{workers}]", conf={{"spark.driver.memory": "4g"}})
times = []
for _ in range({repeats} + 1):
    t = time.perf_counter()
    n = len(sf.op_percentiles(sys.argv[1], by=("device_class",)))
    times.append(time.perf_counter() - t)
print(json.dumps({{"times": times[1:], "warmup": times[0], "rows": n}}))
sf.stop()
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices-per-class", type=int, default=50)
    ap.add_argument("--sessions", type=int, default=9)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--runs", type=int, default=45)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--query-repeats", type=int, default=7)
    ap.add_argument("--spark-files", type=int, default=1000)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--generate-only", action="store_true")
    args, _ = ap.parse_known_args()

    spec = FleetSpec(devices_per_class=args.devices_per_class, sessions=args.sessions, runs=args.runs, seed=11)
    root = cached_fleet(spec, args.workers, args.copies)
    if args.generate_only:
        print(root)
        return 0
    tree = root / "tree"
    files = sorted(str(p) for p in tree.rglob("*.etdp"))
    work = Path(tempfile.mkdtemp(prefix="etlab-fleet-bench-"))
    try:
        code = _INGEST.format(repo=str(REPO))
        full = run_json(code, json.dumps([str(tree)]), work / "store", args.workers)
        print(f"[bench] ingest {full}", file=sys.stderr, flush=True)
        q_times, q_cpu, q_rows, q_rss = duckdb_query_times(work / "store", args.query_repeats)
        print(f"[bench] duckdb {q_times}", file=sys.stderr, flush=True)
        spark_q = spark_i = pool_i = None
        subset = files[: args.spark_files]
        if not args.no_spark:
            spark_q = run_json(_SPARK_QUERY.format(repo=str(REPO), workers=args.workers,
                                                   repeats=max(3, args.query_repeats // 2)), work / "store")
            print(f"[bench] spark query {spark_q}", file=sys.stderr, flush=True)
            pool_i = run_json(code, json.dumps(subset), work / "pool-subset", args.workers)
            spark_i = run_json(_SPARK_INGEST.format(repo=str(REPO), workers=args.workers), json.dumps(subset),
                               work / "spark-subset")
            print(f"[bench] subset pool {pool_i} spark {spark_i}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    d_med = median(q_times)
    lines = [
        "## fleet",
        "",
        f"`bench/fleet.py` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {args.workers} workers). Synthetic "
        f"fleet from `etlab.fleet.generate_fleet`: {len(files) // args.copies:,} ETDumps written by etlab's ETDump "
        f"writer ({3 * spec.devices_per_class} devices x 2 builds x {spec.sessions} sessions, {spec.runs} runs "
        f"each), each present {args.copies} times under distinct paths: {len(files):,} files read, "
        f"{full['events']:,} profile events stored. Each ingest is a fresh process into a fresh store.",
        "",
        "| measure | value | target | ratio to target |",
        "|---|---|---|---|",
        f"| ingest {full['files']:,} files / {full['events'] / 1e6:.1f}M events, process pool | "
        f"{full['seconds']:.1f} s "
        f"({full['events'] / full['seconds'] / 1e6:.2f}M events/s) | < {TARGET_INGEST_S:.0f} s | "
        f"{full['seconds'] / TARGET_INGEST_S:.2f} |",
        f"| ingest CPU time, driver + workers (imports included) / {args.workers} cores: the wall time with the cores "
        f"to itself | {full['cpu_s']:.1f} s / {args.workers} = {full['cpu_s'] / args.workers:.1f} s | "
        f"< {TARGET_INGEST_S:.0f} s | {full['cpu_s'] / args.workers / TARGET_INGEST_S:.2f} |",
        f"| ingest peak RSS: driver / largest worker | {full['driver_rss_mb']:.0f} MB / {full['worker_rss_mb']:.0f} MB "
        "| | |",
        f"| per-op p50/p90/p99 per device class, DuckDB ({q_rows} rows, median of {len(q_times)}) | "
        f"{d_med * 1e3:.0f} ms | < {TARGET_QUERY_S * 1e3:.0f} ms | {d_med / TARGET_QUERY_S:.2f} |",
        f"| the same, CPU time of DuckDB's {args.workers} threads / {args.workers} (the wall time with the cores to "
        f"itself) | {median(q_cpu) * 1e3:.0f} ms / {args.workers} = {median(q_cpu) / args.workers * 1e3:.0f} ms | "
        f"< {TARGET_QUERY_S * 1e3:.0f} ms | {median(q_cpu) / args.workers / TARGET_QUERY_S:.2f} |",
        f"| DuckDB query process peak RSS | {q_rss:.0f} MB | | |",
    ]
    if spark_q:
        s_med = median(spark_q["times"])
        lines += [
            f"| same per-op summary, Spark local[{args.workers}] (median of {len(spark_q['times'])}, after a "
            f"{spark_q['warmup']:.1f} s first run) | {s_med:.2f} s | | Spark / DuckDB = {s_med / d_med:.1f}x |",
            f"| ingest of the first {len(subset):,} files: process pool vs Spark local[{args.workers}] | "
            f"{pool_i['seconds']:.1f} s vs {spark_i['seconds']:.1f} s (+{spark_i['session_start']:.1f} s session "
            f"start) | | Spark / pool = {spark_i['seconds'] / pool_i['seconds']:.1f}x |",
        ]
    load = os.getloadavg()[0]
    lines += ["", f"Absolute times move with machine load: the 2 cores were shared with other jobs while this ran "
              f"(1-minute load average {load:.1f} at the end), which is why the CPU-time line is given; the "
              "DuckDB/Spark and pool/Spark ratios are from the same run."]
    write_section("fleet", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
