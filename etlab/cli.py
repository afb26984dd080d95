"""The `etlab` command line.

    etlab info FILE [--etrecord R]       what is inside a .pte / .ptd / .bpte / .etdp / .etrecord; with an
                                         ETRecord (given, or FILE.etrecord beside a .pte), why each node
                                         was left out of delegation, grouped by reason
    etlab run MODEL.pte [--etdump OUT]  run a method (--runs, --threads: 1 by default), write its ETDump
    etlab inspect RUN.etdp [...]         the Inspector's table (table, csv, tsv, json, parquet; --chrome-trace)
    etlab report RUN.etdp [-o F]         the whole dashboard as one offline HTML file
    etlab compare A B [...]              per-op latency and numeric deltas of run B against run A
    etlab fleet ingest|query|stats|diff  ETDumps of many devices and builds in one store (etlab.fleet)
    etlab export-me RUN.etdp --etrecord R -o DIR   graphs + overlays of a run for Model Explorer
    etlab quant report|fix MODEL [...]   quantization over a dataset: per-layer p95 SQNR on the shipped
                                         program, calibration coverage; fix: meet an accuracy budget

`etlab COMMAND --help` describes a command's options. Errors are one line on stderr (exit status 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from etlab.errors import Error, FormatError


def _delegation_lines(record, where: str) -> None:
    """Per method of an ETRecord: delegated nodes per backend, then why nodes were left out, by category."""
    from etlab.devtools import get_delegation_info

    for method in record.methods:
        info = get_delegation_info(record.edge_program(method))
        backends = ", ".join(f"{b.backend_id} {b.num_subgraphs} partition(s) {b.num_nodes} node(s)"
                             for b in sorted(info.delegation_by_backend.values(), key=lambda b: b.backend_id))
        print(_fit(f"  delegation of {method!r} ({where}): {backends or 'nothing delegated'}"))
        for line in info.format_refusals().splitlines():
            print(_fit(f"    {line}"))


def _fit(line: str) -> str:
    """A line wrapped to the terminal's width (120 columns when not a terminal), continuation lines
    indented two more than the line."""
    import textwrap

    from etlab.inspector import terminal_width

    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.fill(line, terminal_width(), subsequent_indent=indent, break_on_hyphens=False,
                         drop_whitespace=True, replace_whitespace=False)


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

    if args.etrecord:  # checked before anything is printed
        from etlab.inspector import input_file

        input_file("--etrecord", args.etrecord)
    if args.path.endswith(".etrecord"):
        from etlab.etrecord import parse_etrecord

        record = parse_etrecord(args.path)
        print(_fit(f"{args.path}: ETRecord, methods {record.methods}"))
        _delegation_lines(record, "recorded edge graph")
        return 0
    obj = load_file(args.path)
    if args.etrecord and not isinstance(obj, PteFile):
        raise FormatError(f"--etrecord explains a .pte's delegation; {args.path} is not a .pte")
    if isinstance(obj, PteFile):
        prog = obj.program
        print(_fit(f"{args.path}: program version {prog.version}, {len(obj.segments)} segment(s) "
                   f"({sum(len(s) for s in obj.segments)} bytes)"))
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
        print(_fit(f"{args.path}: {len(obj.flat_tensor.named_data or ())} named entries"))
        for key, (layout, data) in obj.named().items():
            shape = f" {layout.scalar_type.name} {list(layout.sizes or ())}" if layout else ""
            print(f"  {key}:{shape} {len(data)} bytes")
    elif isinstance(obj, BundledProgram):
        print(_fit(f"{args.path}: bundled program v{obj.version}, embedded .pte of {len(obj.program)} bytes"))
        for suite in obj.method_test_suites or ():
            print(f"  method {suite.method_name!r}: {len(suite.test_cases or ())} test case(s)")
    elif isinstance(obj, ETDump):
        print(_fit(f"{args.path}: etdump version {obj.version}, {len(obj.run_data or ())} run block(s)"))
        for run in obj.run_data or ():
            print(f"  {run.name!r}: {len(run.events or ())} events")
    return 0


def _inputs(method, kind: str, case: int, seed: int) -> list:
    """The inputs of one run: a bundled test case's (a .bpte), or tensors of each input's declared
    dtype and (upper-bound) sizes filled with ones (upstream's executor_runner's default), zeros or
    seeded random values."""
    import torch

    if kind == "bundled":
        from etlab.devtools import bundled_test_case_count, load_bundled_input

        if getattr(method.program, "bundled", None) is None:
            raise ValueError("--inputs bundled needs a bundled program (.bpte)")
        n = bundled_test_case_count(method)
        if not 0 <= case < n:
            raise ValueError(f"--case {case}: method {method.name!r} has {n} bundled test case(s)")
        return load_bundled_input(method, case)
    meta, gen = method.metadata, torch.Generator().manual_seed(seed)
    out = []
    for k, info in enumerate(meta.inputs):
        if not hasattr(info, "sizes"):
            raise ValueError(f"input {k} of {method.name!r} is a {info.describe()}: give a .bpte with its values")
        if kind == "random" and info.dtype.is_floating_point:
            out.append(torch.randn(info.sizes, generator=gen).to(info.dtype))
        elif kind == "random":
            high = 2 if info.dtype == torch.bool else 10
            out.append(torch.randint(0, high, info.sizes, generator=gen).to(info.dtype))
        else:
            out.append((torch.ones if kind == "ones" else torch.zeros)(info.sizes, dtype=info.dtype))
    return out


def _run(args) -> int:
    """`etlab run`: loads a program, runs one method --runs times with --threads intra-op threads, prints
    the latencies, and writes the ETDump (and debug buffer) when asked: a profile from the command line."""
    import statistics
    import time

    from etlab.inspector import input_file, output_file
    from etlab.runtime import DebugLevel, Runtime

    input_file("", args.program)
    for path in args.data or ():
        input_file("--data", path)
    output_file("--etdump", args.etdump)
    output_file("--debug-buffer", args.debug_buffer)
    if args.debug_buffer and not args.etdump:
        raise ValueError("--debug-buffer is written with the ETDump: give --etdump too")
    if args.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {args.runs}")
    threads = None if args.threads == 0 else args.threads
    level = DebugLevel.INTERMEDIATE_OUTPUTS if args.debug_buffer else None
    program = Runtime.get().load_program(args.program, enable_etdump=bool(args.etdump), data_files=args.data or (),
                                         etdump_debug_level=level, threads=threads)
    if args.method not in program.method_names:
        raise ValueError(f"{args.program}: no method {args.method!r}; methods are {sorted(program.method_names)}")
    method = program.load_method(args.method)
    kind = args.inputs or ("bundled" if getattr(program, "bundled", None) is not None else "ones")
    times, outputs = [], []
    for _ in range(args.runs):
        inputs = _inputs(method, kind, args.case, args.seed)
        t0 = time.perf_counter()
        outputs = method.execute(inputs)
        times.append((time.perf_counter() - t0) * 1e3)
    print(_fit(f"{args.program}: method {args.method!r} on the {method.core} core, "
               f"{'torch default' if threads is None else threads} thread(s), inputs: {kind}"))
    print(f"  {args.runs} run(s): p50 {statistics.median(times):.4g} ms, min {min(times):.4g} ms, "
          f"max {max(times):.4g} ms")
    for k, v in enumerate(outputs):
        shape = f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}" if hasattr(v, "shape") else repr(v)
        print(f"  output {k}: {shape}")
    if args.etdump:
        program.write_etdump_result_to_file(args.etdump, args.debug_buffer)
        print(_fit(f"  wrote {args.etdump}" + (f" and {args.debug_buffer}" if args.debug_buffer else "")))
    return 0


def _run_parser(sub) -> None:
    run = sub.add_parser("run", help="run a program's method (a profile: latencies, --etdump)",
                         description="Run one method of a .pte or .bpte: the latency of each run, the outputs' "
                         "shapes and, with --etdump, the run's ETDump for `etlab inspect`.")
    run.add_argument("program", help="the .pte (or .bpte: its bundled inputs are used)")
    run.add_argument("--method", default="forward", help="the method to run (default forward)")
    run.add_argument("--runs", type=int, default=1, help="how many times to run it (default 1)")
    run.add_argument("--threads", type=int, default=1,
                     help="intra-op threads of the kernels (default 1, as upstream's portable runtime: a profile "
                     "on a busy machine without spikes; 0: torch's own setting); recorded in the ETDump")
    run.add_argument("--inputs", choices=("ones", "zeros", "random", "bundled"), default=None,
                     help="the inputs: ones (default for a .pte, as upstream's executor_runner), zeros, random "
                     "(--seed), or bundled (default for a .bpte: test case --case)")
    run.add_argument("--case", type=int, default=0, help="the bundled test case (default 0)")
    run.add_argument("--seed", type=int, default=0, help="seed of --inputs random (default 0)")
    run.add_argument("--data", action="append", metavar="F.ptd", help="a .ptd file of tensors the program keeps "
                     "outside (repeatable)")
    run.add_argument("--etdump", metavar="OUT.etdp", help="write the runs' ETDump here (its folder must exist)")
    run.add_argument("--debug-buffer", metavar="OUT.bin",
                     help="also log every intermediate output and write the debug buffer here (with --etdump)")
    run.set_defaults(run=_run)


# Subcommands with their own parsers: the rest of the command line goes to them untouched.
_DELEGATED = {
    "inspect": ("etlab.inspector", "inspect_main", "the Inspector's table for an ETDump (+ ETRecord)"),
    "compare": ("etlab.inspector", "compare_main", "per-op latency and numeric deltas of run B against A"),
    "report": ("etlab.visualizer", "report_main", "write the dashboard as an offline HTML report"),
    "fleet": ("etlab.fleet", "fleet_main", "fleet analysis: ingest many ETDumps, query with SQL, diff builds"),
    "export-me": ("etlab.model_explorer", "export_me_main", "graphs and overlays of a run for Model Explorer"),
    "quant": ("etlab.devtools", "quant_main", "quantization over a dataset: report (per-layer p95 SQNR), fix (budget)"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("etlab")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """`etlab COMMAND ...`; returns the exit status. A reader that goes away (`etlab ... | head`) ends the
    command quietly, as other tools in a pipeline end."""
    try:
        try:
            status = _main(sys.argv[1:] if argv is None else list(argv))
        finally:  # also after --help (a SystemExit): what is buffered reaches the reader or meets its absence here
            sys.stdout.flush()
    except BrokenPipeError:
        from etlab.inspector import stdout_closed

        return stdout_closed()
    return status


def build_parser() -> argparse.ArgumentParser:
    """`etlab`'s parser: info and run here; the delegated commands listed (their parsers are their own)."""
    parser = argparse.ArgumentParser(prog="etlab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"etlab {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="summarize an ExecuTorch file (.pte, .ptd, .bpte, .etdp, .etrecord)",
                          description="Summarize an ExecuTorch file (.pte, .ptd, .bpte, .etdp, .etrecord).")
    info.add_argument("path", help="the file")
    info.add_argument("--etrecord", help="the .pte's ETRecord: why each node was left out of delegation "
                      "(default: the .etrecord of the same name beside the .pte, if it is of the same program)")
    info.set_defaults(run=_info)
    _run_parser(sub)
    for name, (_, _, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _main(argv: list[str]) -> int:
    if argv and argv[0] in _DELEGATED:
        import importlib

        module, func, _ = _DELEGATED[argv[0]]
        return getattr(importlib.import_module(module), func)(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:
        raise  # main(): the reader went away
    except (Error, ValueError, OSError) as e:  # FormatError is both; OSError: a file that went away mid-way
        from etlab.inspector import error_line

        print(f"etlab: error: {error_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
