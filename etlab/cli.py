"""The `etlab` command line.

    etlab info FILE                      what is inside a .pte / .ptd / .bpte / .etdp
    etlab inspect --etdump P [...]       the Inspector's table (table, csv, tsv, json; --chrome-trace)
    etlab report --etdump P [...] -o F   the whole dashboard as one offline HTML file
    etlab compare A B [...]              per-op latency and numeric deltas of run B against run A
    etlab fleet ingest|query|stats|diff  ETDumps of many devices and builds in one store (etlab.fleet)
"""

from __future__ import annotations

import argparse
import sys

from etlab.errors import FormatError


def _info(args) -> int:
    from etlab.schema import load_file
    from etlab.schema.bundled_program import BundledProgram
    from etlab.schema.etdump import ETDump
    from etlab.schema.flat_tensor import PtdFile
    from etlab.schema.program import PteFile

    obj = load_file(args.path)
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
    "inspect": ("etlab.inspector._cli", "inspect_main", "the Inspector's table for an ETDump (+ ETRecord)"),
    "compare": ("etlab.inspector._cli", "compare_main", "per-op latency and numeric deltas of run B against A"),
    "report": ("etlab.visualizer._cli", "report_main", "write the dashboard as an offline HTML report"),
    "fleet": ("etlab.fleet", "fleet_main", "fleet analysis: ingest many ETDumps, query with SQL, diff builds"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _DELEGATED:
        import importlib

        module, func, _ = _DELEGATED[argv[0]]
        return getattr(importlib.import_module(module), func)(argv[1:])
    parser = argparse.ArgumentParser(prog="etlab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="summarize an ExecuTorch file (.pte, .ptd, .bpte, .etdp)")
    info.add_argument("path")
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
