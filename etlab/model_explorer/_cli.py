"""`etlab export-me`: graphs and overlays for Model Explorer from the shell."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from etlab.errors import FormatError
from etlab.model_explorer._node_data import OVERLAY_KEYS

USAGE = """\
etlab export-me RUN.etdp --etrecord MODEL.etrecord -o DIR   graphs + the run's overlays
etlab export-me MODEL.etrecord -o DIR                      graphs of a record (no run)
etlab export-me MODEL.pte -o DIR                           instruction graphs of a program"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="etlab export-me", usage=USAGE,
        description="Write Model Explorer's graph JSON (graphs.json) and node-data overlays of a run (latency "
                    "p50/p90, share of the run, numeric gap, output bytes) into a folder, and print the command "
                    "that opens them. Model Explorer opens .pte/.etrecord files directly too: "
                    "model-explorer FILE --extensions=etlab.model_explorer")
    p.add_argument("path", help="an ETDump (.etdp, with --etrecord), an .etrecord or a .pte")
    p.add_argument("--etrecord", help="the run's ETRecord (required with an .etdp)")
    p.add_argument("--debug-buffer", help="the run's debug buffer (.bin), for the numeric gap overlay")
    p.add_argument("-o", "--output", required=True,
                   help="output folder, which must exist (graphs.json and the overlays in it are replaced)")
    p.add_argument("--graph", action="append", choices=("aten", "edge", "runtime"),
                   help="graph kinds to write (repeatable; default: every kind the record holds)")
    p.add_argument("--method", help="one method (default: all)")
    p.add_argument("--overlay", choices=OVERLAY_KEYS, default="latency_p50",
                   help="the overlay the printed command opens (default: latency_p50)")
    return p


def _existing(path: str, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} {path}: no such file")
    if not p.is_file():
        raise IsADirectoryError(f"{what} {path}: is a folder, not a file")
    return p


def _source(args):
    path = _existing(args.path, "input")
    if path.suffix.lower() in (".pte", ".etrecord"):
        if args.etrecord or args.debug_buffer:
            raise ValueError(f"--etrecord and --debug-buffer go with a run (.etdp), not with {path.name}")
        return str(path)
    if not args.etrecord:
        raise ValueError(f"{path.name} is a run: give its ETRecord with --etrecord")
    from etlab.inspector import Inspector

    record = _existing(args.etrecord, "--etrecord")
    buf = str(_existing(args.debug_buffer, "--debug-buffer")) if args.debug_buffer else None
    return Inspector(etdump_path=str(path), etrecord=str(record), debug_buffer_path=buf)


def _output(path: str) -> Path:
    """The output folder: it must exist (no etlab command creates folders)."""
    out = Path(path)
    if out.is_dir():
        return out
    if out.exists():
        raise NotADirectoryError(f"-o {path}: is a file, not a folder")
    raise FileNotFoundError(f"-o {path}: no such folder (create it first)")


def export_me_main(argv: list[str] | None = None) -> int:
    """The `etlab export-me` command (exit 0 written, 2 bad arguments or files)."""
    from etlab.model_explorer._export import export, open_command

    args = _parser().parse_args(argv)
    try:
        source = _source(args)
        written = export(source, _output(args.output), kinds=args.graph, method=args.method)
    except (OSError, ValueError, FormatError) as e:  # FormatError is a ValueError; named for the reader
        print(f"etlab export-me: error: {e}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name:>13}: {path}")
    print("open with:\n" + shell_lines(open_command(written, args.overlay)))
    return 0


def shell_lines(cmd: list[str], indent: str = "  ") -> str:
    """`cmd` as a shell command, one argument a line joined by backslash continuations: copy-pastable,
    and as narrow as its longest path (one line of graph path and overlay path was 200+ columns)."""
    return indent + f" \\\n{indent}    ".join(shlex.quote(a) for a in cmd)
