"""`etlab report RUN.etdp [--etrecord R] [--debug-buffer B] [--strict] -o report.html` (or `--etdump
RUN.etdp`): the full dashboard as one offline HTML file."""

from __future__ import annotations

import argparse
import sys


def report_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="etlab report", description="Write the run's dashboard (profile, graph, numeric gap, delegation) "
        "as one offline HTML file.")
    parser.add_argument("run", nargs="?", metavar="RUN.etdp", help="the run's .etdp file (or --etdump)")
    parser.add_argument("--etdump", help="the run's .etdp file (as `etlab inspect`'s positional argument)")
    parser.add_argument("--etrecord", help="the program's ETRecord (graphs, module hierarchy, source lines)")
    parser.add_argument("--debug-buffer", "--debug_buffer", dest="debug_buffer",
                        help="the debug buffer holding intermediate outputs (numeric gap)")
    parser.add_argument("--method", default="forward", help="the method shown (default forward)")
    parser.add_argument("--title", default=None, help="the page's title (default: etlab report: RUN)")
    parser.add_argument("--strict", action="store_true",
                        help="refuse (exit 2) a run that is not of the ETRecord's program; by default a warning")
    parser.add_argument("-o", "--output", default="report.html", help="where to write the HTML (default report.html)")
    return parser


def report_main(argv: list[str] | None = None) -> int:
    """Reads the files, builds the dashboard and writes it; returns the exit code (2 on bad input)."""
    parser = report_parser()
    args = parser.parse_args(argv)
    if (args.run is None) == (args.etdump is None):
        parser.error("give the run's .etdp once: as RUN.etdp or as --etdump")
    args.etdump = args.etdump or args.run
    from etlab.errors import FormatError
    from etlab.inspector import Inspector, warnings_as_lines
    from etlab.visualizer._dashboard import Dashboard

    try:
        with warnings_as_lines("etlab report"):
            ins = Inspector(etdump_path=args.etdump, etrecord=args.etrecord, debug_buffer_path=args.debug_buffer,
                            strict=args.strict)
        dash = Dashboard(ins, method=args.method)
        path = dash.save_html(args.output, title=args.title or f"etlab report: {args.etdump}")
    except (FormatError, FileNotFoundError, ValueError, TypeError, RuntimeError) as e:
        print(f"etlab report: error: {e}", file=sys.stderr)
        return 2
    for key, why in dash.missing.items():
        print(f"etlab report: no {key} view: {why}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(report_main())
