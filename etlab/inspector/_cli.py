"""Command lines: `python -m etlab.inspector` (upstream's flags) and `etlab inspect` (inspect_main).

Both print one line on stderr and exit with status 2 for bad input (missing or malformed file,
bad argument); nothing else is printed in that case.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import pandas as pd

from etlab.errors import FormatError
from etlab.inspector._events import TimeScale
from etlab.inspector._frames import printable, tsv_text
from etlab.schema import write_atomic

_SCALES = [t.value for t in TimeScale]
_BAD_INPUT = (FormatError, FileNotFoundError, IsADirectoryError, PermissionError, ValueError, TypeError, RuntimeError)


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise _UsageError(message)


def _fail(prog: str, err: BaseException) -> int:
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return 2


def _module_parser() -> _Parser:
    p = _Parser(prog="python -m etlab.inspector", description="Print the Inspector's table for an ETDump.")
    p.add_argument("--etdump_path", required=True, help="the .etdp file")
    p.add_argument("--etrecord_path", help="optional ETRecord of the program")
    p.add_argument("--debug_buffer_path", help="optional debug buffer holding intermediate outputs")
    p.add_argument("--source_time_scale", choices=_SCALES, default="ns", help="unit of the runtime clock")
    p.add_argument("--target_time_scale", choices=_SCALES, default="ms", help="unit of the printed times")
    p.add_argument("--tsv_path", help="also save the table as TSV here")
    p.add_argument("--compare_results", action="store_true",
                   help="compare each Execute block's outputs with the ETRecord's reference outputs")
    return p


def module_main(argv: list[str] | None = None) -> int:
    """`python -m etlab.inspector --etdump_path P [--etrecord_path R] [--debug_buffer_path B] ...`"""
    from etlab.inspector._inspector import Inspector
    from etlab.inspector._numeric import compare_results

    prog = "etlab.inspector"
    try:
        a = _module_parser().parse_args(argv)
        ins = Inspector(etdump_path=a.etdump_path, etrecord=a.etrecord_path, debug_buffer_path=a.debug_buffer_path,
                        source_time_scale=a.source_time_scale, target_time_scale=a.target_time_scale)
        ins.print_data_tabular(file=sys.stdout)
        if a.tsv_path:
            ins.save_data_to_tsv(a.tsv_path)
        if a.compare_results:
            for block in ins.event_blocks:
                if block.name == "Execute" and block.reference_output is not None:
                    for metric, values in compare_results(block.reference_output, block.run_output).items():
                        print(f"{metric}: " + ", ".join("-" if v is None else f"{v:.6g}" for v in values))
    except (_UsageError, *_BAD_INPUT) as e:
        return _fail(prog, e)
    return 0


def _inspect_parser() -> _Parser:
    p = _Parser(prog="etlab inspect", description="Show what an ETDump recorded (with its ETRecord, if given).")
    p.add_argument("etdump", help="the .etdp file")
    p.add_argument("--etrecord", help="ETRecord of the program (adds op types, module paths, source lines)")
    p.add_argument("--debug-buffer", help="debug buffer holding intermediate outputs")
    p.add_argument("--format", choices=("table", "csv", "tsv", "json"), default="table",
                   help="table (default): the printed view; csv/tsv/json: every column")
    p.add_argument("-o", "--output", help="write the table/csv/tsv/json here instead of stdout")
    p.add_argument("--chrome-trace", metavar="OUT.json", help="also write the runtime timeline (Perfetto)")
    p.add_argument("--source-time-scale", choices=_SCALES, default="ns")
    p.add_argument("--target-time-scale", choices=_SCALES, default="ms")
    p.add_argument("--delegate-debug-data", action="store_true", help="add delegate metadata columns")
    p.add_argument("--numeric-gap", action="store_true",
                   help="instead: per-layer gap of the runtime's intermediates against the ETRecord's graph "
                        "(SQNR, MSE, cosine, max-abs; needs --etrecord with representative inputs and --debug-buffer)")
    return p


def inspect_main(argv: list[str] | None = None) -> int:
    """`etlab inspect ETDUMP [--etrecord R] [--debug-buffer B] [--format table|csv|tsv|json]
    [-o OUT] [--chrome-trace OUT.json]`; returns the exit status."""
    from etlab.inspector._inspector import Inspector

    prog = "etlab inspect"
    try:
        a = _inspect_parser().parse_args(argv)
        ins = Inspector(etdump_path=a.etdump, etrecord=a.etrecord, debug_buffer_path=a.debug_buffer,
                        source_time_scale=a.source_time_scale, target_time_scale=a.target_time_scale)
        if a.numeric_gap:
            df = numeric_gap_table(ins)
        else:
            df = ins.to_dataframe(include_delegate_debug_data=a.delegate_debug_data)
        text = render(df, a.format)
        if a.output:
            write_atomic(a.output, text.encode())
        else:
            sys.stdout.write(text)
        if a.chrome_trace:
            ins.to_chrome_trace(a.chrome_trace)
    except (_UsageError, *_BAD_INPUT) as e:
        return _fail(prog, e)
    return 0


def numeric_gap_table(inspector) -> pd.DataFrame:
    """One row per matched intermediate output, in execution order: the runtime's value against
    the recorded graph's (SQNR in dB, MSE, cosine, max-abs) with the ops and the user's source line."""
    from etlab.inspector._numeric import cosine_similarity, mse, snr
    from etlab.inspector._rollups import _source

    if inspector._program is None:
        raise ValueError("--numeric-gap needs --etrecord (the recorded program and its representative inputs)")
    logged = [v for block in inspector.event_blocks for e in block.events for v in (e.debug_data or ())]
    if not any(getattr(getattr(v, "device", None), "type", "meta") != "meta" for v in logged):
        raise ValueError("--numeric-gap needs --debug-buffer (the run's intermediate outputs)")
    gaps = inspector.calculate_numeric_gap("MSE")
    rows = []
    for i, r in enumerate(gaps.itertuples(index=False)):
        aot, run = r.aot_intermediate_output, r.runtime_intermediate_output
        diff = (run.double() - aot.double()).abs() if hasattr(aot, "double") and hasattr(run, "double") else None
        rows.append({"#": i, "aot_ops": ", ".join(r.aot_ops), "runtime_ops": ", ".join(r.runtime_ops),
                     "sqnr_db": snr(aot, run), "mse": mse(aot, run), "cosine": cosine_similarity(aot, run),
                     "max_abs": float(diff.max()) if diff is not None and diff.numel() else 0.0,
                     "source": _source(r.stacktraces if isinstance(r.stacktraces, dict) else {})})
    return pd.DataFrame(rows, columns=["#", "aot_ops", "runtime_ops", "sqnr_db", "mse", "cosine", "max_abs", "source"])


def render(df: pd.DataFrame, fmt: str) -> str:
    """The frame as text: "table" is the printed view; csv/tsv/json keep every column, with
    tensors described by dtype and shape."""
    if fmt == "table":
        from tabulate import tabulate

        shown = printable(df) if "event_name" in df.columns else df
        return tabulate(shown, headers="keys", tablefmt="simple", showindex=False) + "\n"
    plain = df.map(_plain)
    if fmt == "json":
        return json.dumps(plain.to_dict(orient="records"), indent=1, allow_nan=False) + "\n"
    if fmt == "tsv":
        return tsv_text(plain)
    return plain.to_csv(index=False)


def _plain(v):
    """JSON-ready form of a cell: tensors as "float32[4, 64]", NaN as None, numpy as Python."""
    torch = sys.modules.get("torch")  # no tensor exists unless torch was imported
    if torch is not None and isinstance(v, torch.Tensor):
        return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
