"""`etlab fleet ...`: ingest ETDumps into a store, query it, compare builds.

    etlab fleet ingest DIR|FILE... --store S [--pattern P] [--tag K=V]... [--workers N] [--engine spark]
    etlab fleet query S "SQL" [--format table|csv|json] [--engine duckdb|spark]
    etlab fleet stats S percentiles|slowest|variance|outliers [--by COL,...] [--where SQL]
    etlab fleet diff S --base build=A --head build=B [--per device_class] [--threshold 0.05] [--html F]
    etlab fleet generate OUT [--devices-per-class N] [--sessions N] [--runs N] [--regression OP=FACTOR]

A run with no 'program' tag (sidecar, --pattern, --tag) is stored under the SHA-256 of the .pte beside
it, else of the .etrecord beside it, else a fingerprint of its run blocks' layout (`etdp-...`); which
one is the label program_from. A run with no 'build' tag is stored as build=unknown.

Exit codes: 0 fine; 1 `diff` found a regression, `ingest` stored nothing (no file, or every file bad;
files already stored count as stored) or, with --strict, skipped a bad file;
2 an error (missing store, bad arguments, SQL error), one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from etlab.errors import FormatError

HASH_PREFIX = 12  # a 64-hex program identity printed as its first 12 characters, as git shortens commit ids
MAX_CELL = 32  # the widest a cell gets in the default table


def _print_frame(df, fmt: str, wide: bool = False) -> None:
    if fmt == "csv":
        sys.stdout.write(df.to_csv(index=False))
    elif fmt == "json":
        sys.stdout.write(df.to_json(orient="records", lines=False, default_handler=str) + "\n")
    else:
        print(frame_table(df, wide))


def frame_table(df, wide: bool = False, width: int | None = None) -> str:
    """A query's rows as a text table. By default within `width` (the terminal's) columns: 64-hex program
    hashes shortened to a prefix, cells cut at MAX_CELL characters with "…", and the columns that still do
    not fit left out, with a line saying how many and that `--wide` prints them all whole."""
    import re
    import textwrap

    from tabulate import tabulate

    from etlab.inspector import cut, terminal_width

    heads = [str(c) for c in df.columns]
    rows = [["" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in r]
            for r in df.itertuples(index=False)]
    count = f"({len(df)} row{'s' if len(df) != 1 else ''})"
    if wide:
        return tabulate(rows, headers=heads, tablefmt="simple", disable_numparse=True) + "\n" + count
    width = width or terminal_width()
    sha = re.compile(r"[0-9a-f]{64}")
    hashed = {k for r in rows for k, v in enumerate(r) if sha.fullmatch(v)}
    long_cells = {k for r in rows for k, v in enumerate(r) if len(v) > MAX_CELL and k not in hashed}
    rows = [[cut(v[:HASH_PREFIX] if sha.fullmatch(v) else v, MAX_CELL) for v in r] for r in rows]
    # tabulate's "simple" format makes a column at least 2 wider than its header
    sizes = [max([len(h) + 2] + [len(r[k]) for r in rows]) for k, h in enumerate(heads)]
    keep, used = [], -2
    for k, size in enumerate(sizes):
        if used + 2 + size > width and keep:
            break
        keep.append(k)
        used += 2 + size
    hashed, long_cells = hashed.intersection(keep), long_cells.intersection(keep)
    text = tabulate([[r[k] for k in keep] for r in rows], headers=[cut(heads[k], width) for k in keep],
                    tablefmt="simple", disable_numparse=True)
    notes = [count]
    if len(keep) < len(heads):
        notes.append(f"{len(heads) - len(keep)} of {len(heads)} columns left out ({', '.join(heads[len(keep):])})")
    if hashed:
        notes.append(f"program hashes shortened to {HASH_PREFIX} characters")
    if long_cells:
        notes.append(f"cells cut at {MAX_CELL} characters")
    if len(notes) > 1:
        notes.append("--wide: every column, whole")
    return "\n".join(line[:width] for line in text.splitlines()) + "\n" + textwrap.fill("; ".join(notes), width)


def _columns_arg(text: str | None) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()] if text else []


def _ingest(args) -> int:
    from etlab.fleet._tags import parse_tag_args

    tags = parse_tag_args(args.tag)
    if args.engine == "spark":
        from etlab.fleet._spark import SparkFleet

        with SparkFleet(args.master) as sf:
            summary = sf.ingest(args.sources, args.store, pattern=args.pattern, tags=tags)
    else:
        from etlab.fleet._ingest import ingest

        summary = ingest(args.sources, args.store, pattern=args.pattern, tags=tags, workers=args.workers,
                         progress=not args.no_progress and sys.stderr.isatty())
    print(summary.format())
    if summary.files_ingested == 0 and summary.files_already_stored == 0:
        why = "no .etdp file found" if summary.files_found == 0 else "every file was bad (listed above)"
        print(f"etlab fleet: error: nothing ingested: {why}", file=sys.stderr)
        return 1
    return 1 if args.strict and summary.files_bad else 0


def _query(args) -> int:
    if args.engine == "spark":
        from etlab.fleet._spark import SparkFleet

        with SparkFleet(args.master) as sf:
            df = sf.sql(args.store, args.sql)
    else:
        from etlab.fleet._queries import FleetDB

        with FleetDB(args.store) as db:
            df = db.sql(args.sql)
    _print_frame(df, args.format, args.wide)
    return 0


def _stats(args) -> int:
    from etlab.fleet._queries import MEMORY_QUERIES, READY_QUERIES

    make = {**READY_QUERIES, **MEMORY_QUERIES}[args.query]
    kwargs = {"where": args.where}
    if args.by is not None:
        kwargs["by"] = _columns_arg(args.by)
    if args.query == "percentiles":
        kwargs["dialect"] = args.engine   # the engine's one-sort form of the three quantiles
    if args.query == "outliers":
        kwargs["z"] = args.z
    if args.query == "slowest":
        kwargs["limit"] = args.limit
    args.sql = make(**kwargs)
    return _query(args)


def _diff(args) -> int:
    from etlab.fleet._diff import diff

    result = diff(args.store, args.base, args.head, key=_columns_arg(args.key), strata=_columns_arg(args.per),
                  where=args.where, adjust_by=None if args.adjust_by == "none" else args.adjust_by,
                  threshold=args.threshold, alpha=args.alpha, n_boot=args.bootstrap,
                  seed=args.seed, metric=args.metric)
    if args.format == "table":
        print(result.format(only_flagged=not args.all))
    else:
        _print_frame(result.table, args.format, args.wide)
    if args.html:
        path = result.view().save_html(args.html)
        print(f"wrote {path}", file=sys.stderr)
    return result.exit_code


def _generate(args) -> int:
    from etlab.fleet._synthetic import FleetSpec, Regression, generate_fleet

    regression = None
    if args.regression != "none":
        op, sep, factor = args.regression.rpartition("=")
        if not sep:
            raise ValueError(f"--regression {args.regression!r}: expected OP=FACTOR or none")
        regression = Regression(build=args.regression_build, op=op, factor=float(factor))
    spec = FleetSpec(devices_per_class=args.devices_per_class, sessions=args.sessions, runs=args.runs,
                     regression=regression, seed=args.seed)
    fleet = generate_fleet(args.out, spec, workers=args.workers)
    import textwrap

    from etlab.inspector import terminal_width

    print(textwrap.fill(f"wrote {len(fleet.files)} ETDumps (+ sidecars) under {args.out}: {len(fleet.devices)} "
                        f"devices, builds {', '.join(spec.builds)}, {len(fleet.outlier_runs)} planted outlier "
                        f"run(s), regression {regression}", terminal_width(), subsequent_indent="  ",
                        break_long_words=False, break_on_hyphens=False))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="etlab fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def engine(sp):
        sp.add_argument("--engine", choices=("duckdb", "spark"), default="duckdb",
                        help="duckdb (default: in this process) or spark (Apache Spark; needs a JDK)")
        sp.add_argument("--master", default="local[2]", help="Spark master URL (with --engine spark)")

    def output(sp):
        sp.add_argument("--format", choices=("table", "csv", "json"), default="table",
                        help="table (default), or every row as CSV or JSON on stdout")
        sp.add_argument("--wide", action="store_true",
                        help="table: every column and whole cells (default: within the terminal's width)")

    ing = sub.add_parser("ingest", help="add .etdp files (directories are walked) to a store")
    ing.add_argument("sources", nargs="+", metavar="DIR|FILE", help=".etdp files, or folders to walk for them")
    ing.add_argument("--store", required=True, help="the store folder (created if missing; its parent must exist)")
    ing.add_argument("--pattern", help="relative path pattern with tags, e.g. '{build}/{device}/*.etdp'")
    ing.add_argument("--tag", action="append", help="default tag KEY=VALUE (program, method, device, "
                                                     "device_class, build, label.NAME); repeatable")
    ing.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    ing.add_argument("--no-progress", action="store_true",
                     help="no progress bar (there is one only when stderr is a terminal)")
    ing.add_argument("--strict", action="store_true", help="exit 1 if any file was bad")
    engine(ing)
    ing.set_defaults(run=_ingest)

    q = sub.add_parser("query", help="run SQL over the views `events` and `files`")
    q.add_argument("store", help="the store folder")
    q.add_argument("sql", help="the query, over the views `events` and `files` (quote it)")
    engine(q)
    output(q)
    q.set_defaults(run=_query)

    st = sub.add_parser("stats", help="a ready-made query")
    st.add_argument("store", help="the store folder")
    st.add_argument("query", choices=("percentiles", "slowest", "variance", "outliers", "memory", "memory-owners"),
                    help="percentiles (p50/p90/p99 per op), slowest ops, variance per op, outlier runs, peak memory "
                         "per group (memory: each run's tracked peak), or memory per owner")
    st.add_argument("--by", help="grouping columns, comma separated")
    st.add_argument("--where", help="extra SQL condition on events")
    st.add_argument("--z", type=float, default=5.0, help="outliers: robust z-score threshold")
    st.add_argument("--limit", type=int, default=20, help="slowest: how many ops")
    engine(st)
    output(st)
    st.set_defaults(run=_stats)

    d = sub.add_parser("diff", help="compare two slices per op; exit 1 on a regression")
    d.add_argument("store", help="the store folder")
    d.add_argument("--base", required=True, help="COLUMN=VALUE[,...], e.g. build=A")
    d.add_argument("--head", required=True, help="COLUMN=VALUE[,...], e.g. build=B")
    d.add_argument("--key", help="what an op is: op (the default), or op,debug_handle; with --metric memory "
                                 "op,run_name (the default: load and run bytes apart)")
    d.add_argument("--per", default="", help="compare separately per these columns, e.g. device_class")
    d.add_argument("--where", help="extra SQL condition on events")
    d.add_argument("--adjust-by", default="device", help="compare each run to its device's typical base time "
                                                          "(a column, or none for raw times)")
    d.add_argument("--metric", choices=("time", "memory"), default="time",
                   help="compare op times, or memory per owner (the runs' allocation events; raw bytes)")
    d.add_argument("--threshold", type=float, default=0.05, help="smallest p50 change flagged (0.05 = 5%%)")
    d.add_argument("--alpha", type=float, default=0.05, help="significance after Holm correction")
    d.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the interval")
    d.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    d.add_argument("--all", action="store_true", help="print every op, not only flagged ones")
    d.add_argument("--html", metavar="OUT.html", help="also write the view as an offline HTML file")
    output(d)
    d.set_defaults(run=_diff)

    g = sub.add_parser("generate", help="write a synthetic fleet (with a planted regression)")
    g.add_argument("out", help="the folder to write (created; its parent must exist)")
    g.add_argument("--devices-per-class", type=int, default=2, help="devices of each device class (default 2)")
    g.add_argument("--sessions", type=int, default=2, help="ETDump files per device and build (default 2)")
    g.add_argument("--runs", type=int, default=8, help="runs (Execute blocks) per file (default 8)")
    g.add_argument("--regression", default="convolution.out=1.25",
                   help="the planted regression, OP=FACTOR (default convolution.out=1.25), or none")
    g.add_argument("--regression-build", default="B", help="the build the regression is planted in (default B)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0): the same seed, the same files")
    g.add_argument("--workers", type=int, default=1, help="processes writing files (default 1)")
    g.set_defaults(run=_generate)
    return p


def _check_paths(args) -> None:
    """The folders a command creates and the files it writes: their parents must exist (a mistyped
    path is an error, not a new tree), and what must be a folder is not a file."""
    from etlab.inspector import output_file

    for flag, path in (("--store", getattr(args, "store", None) if args.command == "ingest" else None),
                       ("OUT", getattr(args, "out", None))):
        if path is not None:
            if Path(path).exists() and not Path(path).is_dir():
                raise NotADirectoryError(f"{flag} {path}: is a file, not a folder")
            if not Path(path).is_dir():
                output_file(flag, path)
    output_file("--html", getattr(args, "html", None))


def fleet_main(argv: list[str] | None = None) -> int:
    """`etlab fleet ...` (ingest, query, diff, synthesize): runs the subcommand and returns the exit code; bad input and
    SQL errors print one line naming the problem and return 2 instead of a traceback."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        _check_paths(args)
        return args.run(args)
    except (FormatError, ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        from etlab.inspector import error_line

        print(f"etlab fleet: error: {error_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # SQL errors from DuckDB/Spark: one line, not a traceback
        if any(m in type(e).__module__ for m in ("duckdb", "pyspark", "py4j")):
            print(f"etlab fleet: error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(fleet_main())
