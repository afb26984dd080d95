"""The `etlab` command line.

    etlab info FILE [--etrecord R]       what is inside a .pte / .ptd / .bpte / .etdp / .etrecord; with an
                                         ETRecord (given, or FILE.etrecord beside a .pte), why each node
                                         was left out of delegation, grouped by reason
    etlab inspect RUN.etdp [...]         the Inspector's table (table, csv, tsv, json, parquet; --chrome-trace)
    etlab report --etdump RUN.etdp -o F  the whole dashboard as one offline HTML file
    etlab compare A B [...]              per-op latency and numeric deltas of run B against run A
    etlab fleet ingest|query|stats|diff  ETDumps of many devices and builds in one store (etlab.fleet)
    etlab export-me RUN.etdp --etrecord R -o DIR   graphs + overlays of a run for Model Explorer
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from etlab.errors import FormatError


def _delegation_lines(record, where: str) -> None:
    """Per method of an ETRecord: delegated nodes per backend, then why nodes were left out, by category."""
    from etlab.devtools import get_delegation_info

    for method in record.methods:
        info = get_delegation_info(record.edge_program(method))
        backends = ", ".join(f"{b.backend_id} {b.num_subgraphs} partition(s) {b.num_nodes} node(s)"
                             for b in sorted(info.delegation_by_backend.values(), key=lambda b: b.backend_id))
        print(f"  delegation of {method!r} ({where}): {backends or 'nothing delegated'}")
        for line in info.format_refusals().splitlines():
            print(f"    {line}")


def _record_beside(pte: str, explicit: str | None, plans) -> tuple[object, str] | tuple[None, str]:
    """The ETRecord to explain a .pte's delegation with: --etrecord, else <stem>.etrecord beside the
    file when it records the same methods with the same delegate calls (else none, and why)."""
    from etlab.etrecord import parse_etrecord

    if explicit:
        return parse_etrecord(explicit), explicit
    beside = Path(pte).with_suffix(".etrecord")
    if not beside.is_file():
        return None, ""
    try:
        record = parse_etrecord(str(beside))
        recorded = {m: len(i.delegates) for m, i in record.program_info().methods.items()}
    except FormatError as e:
        return None, f"{beside} not used: {e}"
    if recorded != {str(p.name): len(p.delegates or ()) for p in plans}:
        return None, f"{beside} not used: it records another program"
    return record, str(beside)


def _info(args) -> int:
    from etlab.schema import load_file
    from etlab.schema.bundled_program import BundledProgram
    from etlab.schema.etdump import ETDump
    from etlab.schema.flat_tensor import PtdFile
    from etlab.schema.program import PteFile

    if args.path.endswith(".etrecord"):
        from etlab.etrecord import parse_etrecord

        record = parse_etrecord(args.path)
        print(f"{args.path}: ETRecord, methods {record.methods}")
        _delegation_lines(record, "recorded edge graph")
        return 0
    obj = load_file(args.path)
    if args.etrecord and not isinstance(obj, PteFile):
        raise FormatError(f"--etrecord explains a .pte's delegation; {args.path} is not a .pte")
    if isinstance(obj, PteFile):
        prog = obj.program
        print(f"{args.path}: program version {prog.version}, {len(obj.segments)} segment(s) "
              f"({sum(len(s) for s in obj.segments)} bytes)")
        for plan in prog.execution_plan or ():
            ops = [f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators or ()]
            n_instr = sum(len(c.instructions or ()) for c in plan.chains or ())
            print(f"  method {plan.name!r}: {len(plan.values or ())} values, {n_instr} instructions, "
                  f"{len(plan.delegates or ())} delegate(s), arenas {list(plan.non_const_buffer_sizes or ())[1:]}")
            for op in ops:
                print(f"    {op}")
        record, where = _record_beside(args.path, args.etrecord, prog.execution_plan or ())
        if record is not None:
            _delegation_lines(record, f"from {where}")
        elif where:
            print(f"  delegation: {where}")
    elif isinstance(obj, PtdFile):
        print(f"{args.path}: {len(obj.flat_tensor.named_data or ())} named entries")
        for key, (layout, data) in obj.named().items():
            shape = f" {layout.scalar_type.name} {list(layout.sizes or ())}" if layout else ""
            print(f"  {key}:{shape} {len(data)} bytes")
    elif isinstance(obj, BundledProgram):
        print(f"{args.path}: bundled program v{obj.version}, embedded .pte of {len(obj.program)} bytes")
        for suite in obj.method_test_suites or ():
            print(f"  method {suite.method_name!r}: {len(suite.test_cases or ())} test case(s)")
    elif isinstance(obj, ETDump):
        print(f"{args.path}: etdump version {obj.version}, {len(obj.run_data or ())} run block(s)")
        for run in obj.run_data or ():
            print(f"  {run.name!r}: {len(run.events or ())} events")
    return 0


# Subcommands with their own parsers: the rest of the command line goes to them untouched.
_DELEGATED = {
    "inspect": ("etlab.inspector", "inspect_main", "the Inspector's table for an ETDump (+ ETRecord)"),
    "compare": ("etlab.inspector", "compare_main", "per-op latency and numeric deltas of run B against A"),
    "report": ("etlab.visualizer", "report_main", "write the dashboard as an offline HTML report"),
    "fleet": ("etlab.fleet", "fleet_main", "fleet analysis: ingest many ETDumps, query with SQL, diff builds"),
    "export-me": ("etlab.model_explorer", "export_me_main", "graphs and overlays of a run for Model Explorer"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("etlab")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATED:
        import importlib

        module, func, _ = _DELEGATED[argv[0]]
        return getattr(importlib.import_module(module), func)(argv[1:])
    parser = argparse.ArgumentParser(prog="etlab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"etlab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="summarize an ExecuTorch file (.pte, .ptd, .bpte, .etdp, .etrecord)")
    info.add_argument("path")
    info.add_argument("--etrecord", help="the .pte's ETRecord: why each node was left out of delegation "
                      "(default: the .etrecord of the same name beside the .pte, if it is of the same program)")
    info.set_defaults(run=_info)
    for name, (_, _, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (FormatError, FileNotFoundError) as e:
        print(f"etlab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
