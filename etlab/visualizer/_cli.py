"""`etlab report RUN.etdp [--etrecord R] [--debug-buffer B] [--pte P] [--strict] -o report.html` (or
`--etdump RUN.etdp`): the full dashboard as one offline HTML file."""

from __future__ import annotations

import argparse
import sys

_PROG = "etlab report"


def report_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The argument parser of `etlab report` (the run's .etdp, its ETRecord, --pte, -o), onto `parser` when one is
    given; the CLI-usage tests read it to check the README's commands."""
    from etlab.inspector import PROGRESS_HELP

    parser = parser or argparse.ArgumentParser(
        prog=_PROG, description="Write the run's dashboard (profile, graph, memory with --pte, numeric gap, "
        "delegation) as one offline HTML file.")
    parser.add_argument("run", nargs="?", metavar="RUN.etdp", help="the run's .etdp file (or --etdump)")
    parser.add_argument("--etdump", help="the run's .etdp file (as `etlab inspect`'s positional argument)")
    parser.add_argument("--etrecord", help="the program's ETRecord (graphs, module hierarchy, source lines)")
    parser.add_argument("--debug-buffer", "--debug_buffer", dest="debug_buffer",
                        help="the debug buffer holding intermediate outputs (numeric gap)")
    parser.add_argument("--pte", help="the program's .pte: the Memory tab (its memory plan), an exact pairing check "
                        "of the run against it, and the events of XNNPACK delegates whose ETRecord has no debug map "
                        "(upstream's) placed on their nodes")
    parser.add_argument("--method", default="forward", help="the method shown (default forward)")
    parser.add_argument("--title", default=None, help="the page's title (default: etlab report: RUN)")
    parser.add_argument("--strict", action="store_true",
                        help="refuse (exit 2) a run that is not of the ETRecord's program; by default a warning")
    parser.add_argument("-o", "--output", default="report.html",
                        help="the HTML file to write (default report.html; its folder must exist)")
    parser.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    return parser


def report_main(argv: list[str] | None = None) -> int:
    """Reads the files, builds the dashboard and writes it; returns the exit code (2 on bad input)."""
    parser = report_parser()
    args = parser.parse_args(argv)
    if (args.run is None) == (args.etdump is None):
        parser.error("give the run's .etdp once: as RUN.etdp or as --etdump")
    args.etdump = args.etdump or args.run
    from etlab.errors import FormatError
    from etlab.inspector import Inspector, Progress, error_line, input_file, output_file, warnings_as_lines
    from etlab.visualizer._dashboard import Dashboard
    from etlab.visualizer._memory_view import pte_plan_frame

    try:
        for flag in ("etrecord", "debug_buffer", "pte"):
            input_file("--" + flag.replace("_", "-"), getattr(args, flag))
        output_file("-o", args.output)
        with Progress(_PROG, args.progress) as step:
            step(f"reading {args.etdump}" + (f" with {args.etrecord}" if args.etrecord else ""))
            with warnings_as_lines(_PROG, step):
                ins = Inspector(etdump_path=args.etdump, etrecord=args.etrecord, debug_buffer_path=args.debug_buffer,
                                strict=args.strict, pte=args.pte)
            step("building the dashboard")
            plan = pte_plan_frame(args.pte, args.method) if args.pte else None
            dash = Dashboard(ins, method=args.method, memory_plan=plan)
            step(f"writing {args.output}")
            path = dash.save_html(args.output, title=args.title or f"etlab report: {args.etdump}")
    except (FormatError, OSError, ValueError, TypeError, RuntimeError) as e:
        print(f"{_PROG}: error: {error_line(e)}", file=sys.stderr)
        return 2
    for key, why in dash.missing.items():
        if key == "memory" and not args.pte:
            why = "give the program's .pte (--pte) for its memory plan"
        print(f"{_PROG}: no {key} view: {why}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(report_main())
