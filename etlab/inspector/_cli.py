"""Command lines: `python -m etlab.inspector` (upstream's flags) `etlab inspect` (inspect_main)
and `etlab compare` (compare_main).

Both print one line on stderr and exit with status 2 for bad input (missing or malformed file,
bad argument); nothing else is printed in that case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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


def error_line(err: BaseException) -> str:
    """An error as the one line a command prints: an OSError as "PATH: reason", not "[Errno 2] ...: 'PATH'"."""
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        msg = f"{err.filename}: {err.strerror}"
    return msg


def _fail(prog: str, err: BaseException) -> int:
    print(f"{prog}: error: {error_line(err)}", file=sys.stderr)
    return 2


# -- what every etlab command shares: file arguments checked before any work, progress, a closed pipe -----


def input_file(flag: str, path) -> Path | None:
    """A file argument that must name an existing file (None passes): checked before the command reads
    anything, so a typo is one line naming the argument, not a raw [Errno] or a traceback seconds later."""
    if path is None:
        return None
    p, named = Path(path), f"{flag} {path}" if flag else str(path)  # flag "": a positional argument
    if p.is_dir():
        raise IsADirectoryError(f"{named}: is a directory, not a file")
    if not p.exists():
        raise FileNotFoundError(f"{named}: no such file")
    return p


def output_file(flag: str, path) -> Path | None:
    """A file argument the command writes (None passes): its folder must exist (commands never create
    folders: a mistyped folder is an error, not a new tree) and it must not be a folder itself."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{flag} {path}: is a directory; give the file to write")
    if not p.parent.is_dir():
        what = "is not a directory" if p.parent.exists() else "does not exist"
        raise FileNotFoundError(f"{flag} {path}: the folder {p.parent} {what} (etlab does not create folders)")
    return p


def stdout_closed() -> int:
    """What a command does when its reader has gone (`etlab inspect run.etdp | head`): nothing more
    reaches stdout (Python would otherwise fail again flushing it at exit), no traceback; the exit
    status of a process ended by SIGPIPE, as other tools in a pipeline report it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + 13


def _exit_status(prog: str, command: Callable[[], object]) -> int:
    """Runs `command()` (a command's work: parsing its arguments, reading, printing) and returns the
    command's exit status: 0, 2 after one error line for a usage error or bad input, or a closed reader's
    (stdout_closed)."""
    try:
        command()
        sys.stdout.flush()
    except BrokenPipeError:
        return stdout_closed()
    except (_UsageError, *_BAD_INPUT) as e:
        return _fail(prog, e)
    return 0


class Progress:
    """The stage a slow command is at, on stderr only (stdout may be piped JSON or CSV): on a terminal,
    one line rewritten in place once the command has run a second, erased at the end; with `forced`
    (--progress), one line per stage, terminal or not. Otherwise silent."""

    DELAY = 1.0

    def __init__(self, prog: str, forced: bool = False, stream=None):
        self.prog, self.stream = prog, stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.forced = forced
        self.t0 = time.monotonic()
        self.stage = ""
        self.shown = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None
        if self.tty and not forced:
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def __call__(self, stage: str) -> None:
        with self._lock:
            self.stage = stage
            if self.forced:
                print(f"{self.prog}: {stage} ({time.monotonic() - self.t0:.1f} s)", file=self.stream, flush=True)
            elif self.shown:
                self._draw()

    def _draw(self) -> None:
        line = f"{self.prog}: {self.stage} ({time.monotonic() - self.t0:.0f} s)"
        self.stream.write("\r\033[K" + line[: max(20, shutil.get_terminal_size().columns - 1)])
        self.stream.flush()
        self.shown = True

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                if self.stage and time.monotonic() - self.t0 >= self.DELAY:
                    self._draw()

    def clear(self) -> None:
        """Erases the progress line (before another line goes to stderr); the next tick draws it again."""
        with self._lock:
            if self.shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self.shown = False

    def close(self) -> None:
        """Stops the progress line and clears it from the terminal."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def warnings_as_lines(prog: str, progress: Progress | None = None):
    """Warnings raised inside (a run that is not of its ETRecord's program, dropped debug values)
    printed as one `prog: warning: ...` line each on stderr, instead of Python's two-line form (below
    the progress line, if one is shown)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            if caught and progress is not None:
                progress.clear()
            for w in caught:
                print(f"{prog}: warning: {w.message}", file=sys.stderr)


PROGRESS_HELP = ("say on stderr what the command is doing, one line per stage (on a terminal the stage is "
                 "shown in place anyway once it takes over a second; never on stdout)")
_STRICT_HELP = "refuse (exit 2) a run that is not of the ETRecord's program; by default a warning with the evidence"


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
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    return p


def module_main(argv: list[str] | None = None) -> int:
    """`python -m etlab.inspector --etdump_path P [--etrecord_path R] [--debug_buffer_path B] ...`
    (or `python -m etlab.inspector compare A B ...`, see compare_main)"""
    from etlab.inspector._inspector import Inspector
    from etlab.inspector._numeric import compare_results

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:], prog="python -m etlab.inspector compare")
    prog = "etlab.inspector"

    def run() -> None:
        a = _module_parser().parse_args(argv)
        input_file("--etrecord_path", a.etrecord_path)
        input_file("--debug_buffer_path", a.debug_buffer_path)
        output_file("--tsv_path", a.tsv_path)
        with warnings_as_lines(prog):
            ins = Inspector(etdump_path=a.etdump_path, etrecord=a.etrecord_path,
                            debug_buffer_path=a.debug_buffer_path, source_time_scale=a.source_time_scale,
                            target_time_scale=a.target_time_scale, strict=a.strict)
        ins.print_data_tabular(file=sys.stdout)
        if a.tsv_path:
            ins.save_data_to_tsv(a.tsv_path)
        if a.compare_results:
            for block in ins.event_blocks:
                if block.name == "Execute" and block.reference_output is not None:
                    for metric, values in compare_results(block.reference_output, block.run_output).items():
                        print(f"{metric}: " + ", ".join("-" if v is None else f"{v:.6g}" for v in values))

    return _exit_status(prog, run)


def _inspect_parser() -> _Parser:
    p = _Parser(prog="etlab inspect", description="Show what an ETDump recorded (with its ETRecord, if given).")
    p.add_argument("etdump", help="the .etdp file")
    p.add_argument("--etrecord", help="ETRecord of the program (adds op types, module paths, source lines)")
    p.add_argument("--debug-buffer", help="debug buffer holding intermediate outputs")
    p.add_argument("--format", choices=("table", "csv", "tsv", "json", "parquet"), default="table",
                   help="table (default): the printed view; csv/tsv/json: every column (JSON: NaN/inf as null); "
                   "parquet (needs -o): every column, tensors as {dtype, shape, data}")
    p.add_argument("-o", "--output", help="write the table/csv/tsv/json here instead of stdout")
    p.add_argument("--top", type=int, default=30,
                   help="table: the slowest events shown, by average time (default 30; --all: every event)")
    p.add_argument("--all", action="store_true", help="table: every event, not only the slowest")
    p.add_argument("--wide", action="store_true",
                   help="table: every printable column, cells uncut (wider than a terminal)")
    p.add_argument("--chrome-trace", metavar="OUT.json", help="also write the runtime timeline (Perfetto)")
    p.add_argument("--source-time-scale", choices=_SCALES, default="ns", help="unit of the runtime's clock (ns)")
    p.add_argument("--target-time-scale", choices=_SCALES, default="ms", help="unit of the printed times (ms)")
    p.add_argument("--delegate-debug-data", action="store_true", help="add delegate metadata columns")
    p.add_argument("--pte", help="the program's .pte (exact pairing check; places the events of XNNPACK "
                   "delegates whose ETRecord has no debug map, e.g. upstream's, on their nodes)")
    p.add_argument("--numeric-gap", action="store_true",
                   help="instead: per-layer gap of the runtime's intermediates against the ETRecord's graph "
                        "(SQNR, MSE, cosine, max-abs; needs --etrecord with representative inputs and --debug-buffer)")
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    return p


def inspect_main(argv: list[str] | None = None) -> int:
    """`etlab inspect ETDUMP [--etrecord R] [--debug-buffer B] [--format table|csv|tsv|json]
    [-o OUT] [--chrome-trace OUT.json]`; returns the exit status."""
    from etlab.inspector._inspector import Inspector

    prog = "etlab inspect"

    def run() -> None:
        a = _inspect_parser().parse_args(argv)
        for flag in ("etrecord", "debug_buffer", "pte"):
            input_file("--" + flag.replace("_", "-"), getattr(a, flag))
        output_file("-o", a.output)
        output_file("--chrome-trace", a.chrome_trace)
        with warnings_as_lines(prog):
            ins = Inspector(etdump_path=a.etdump, etrecord=a.etrecord, debug_buffer_path=a.debug_buffer,
                            source_time_scale=a.source_time_scale, target_time_scale=a.target_time_scale,
                            strict=a.strict, pte=a.pte)
        if a.numeric_gap:
            df = numeric_gap_table(ins)
        else:
            df = ins.to_dataframe(include_delegate_debug_data=a.delegate_debug_data)
        if a.format == "parquet":
            if not a.output:
                raise ValueError("--format parquet writes a binary file: give -o OUT.parquet")
            write_atomic(a.output, parquet_bytes(df))
        else:
            text = _table(df, a) if a.format == "table" else render(df, a.format)
            if a.output:
                write_atomic(a.output, text.encode())
            else:
                sys.stdout.write(text)
        if a.chrome_trace:
            ins.to_chrome_trace(a.chrome_trace)

    return _exit_status(prog, run)


def _table(df: pd.DataFrame, a) -> str:
    """The default text table: fits the terminal (etlab.inspector._terminal) unless --wide; the
    numeric gap's frame (no event columns) is printed whole."""
    from etlab.inspector._terminal import compact_table, terminal_width

    if a.top < 0:
        raise ValueError(f"--top must be >= 0, got {a.top}")
    if a.wide or "event_name" not in df.columns:
        return render(df, "table")
    return compact_table(df, terminal_width(), None if a.all else a.top)


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


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """The frame as a Parquet file's bytes, tensors as {dtype, shape, data} (etlab.inspector._export)."""
    import io

    from etlab.inspector._export import parquet_ready

    buf = io.BytesIO()
    parquet_ready(df).to_parquet(buf, index=False)
    return buf.getvalue()


def render(df: pd.DataFrame, fmt: str) -> str:
    """The frame as text: "table" is the printed view; csv/tsv/json keep every column, with
    tensors described by dtype and shape. JSON is strict: a missing or non-finite number (NaN,
    inf; e.g. the timing columns of events without timings) is null."""
    if fmt == "table":  # every column whole, cells as every etlab table writes them (cell_text)
        from etlab.inspector._terminal import fit_frame

        shown = printable(df) if "event_name" in df.columns else df
        return "\n".join(fit_frame(shown, 0, wide=True)[0]) + "\n"
    if fmt == "json":  # per record: a column map would turn None back into NaN in float columns
        rows = [{str(k): _plain(v) for k, v in row.items()} for row in df.to_dict(orient="records")]
        return json.dumps(rows, indent=1, allow_nan=False) + "\n"
    plain = df.map(_plain)
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


# -- etlab compare ---------------------------------------------------------------------------------------


@dataclass
class RunFiles:
    """The files of one side of `etlab compare`: an ETDump and, optionally, its ETRecord and debug buffer."""

    etdump: Path
    etrecord: Path | None = None
    debug_buffer: Path | None = None
    found_etrecord: bool = False  # picked up from the run's folder, not named on the command line
    pte: Path | None = None       # the program's .pte: places XNNPACK delegate events on their nodes


def _only(folder: Path, pattern: str, what: str, prefer: str | None = None) -> Path | None:
    """The one file matching pattern in folder (the one named `prefer` when several do)."""
    found = sorted(p for p in folder.glob(pattern) if p.is_file())
    if prefer is not None and (folder / prefer).is_file() and len(found) > 1:
        return folder / prefer
    if len(found) > 1:
        raise ValueError(f"{folder}: holds {len(found)} {what} files ({', '.join(p.name for p in found[:4])}); "
                         "give the file instead of the folder")
    return found[0] if found else None


def run_files(path: str, etrecord: str | None, debug_buffer: str | None, side: str, pte: str | None = None) -> RunFiles:
    """A side given as an .etdp file, or as a folder holding one .etdp (with an .etrecord, the run's
    .bin and the program's .pte beside it, picked up when present; a .pte only when it is the only
    one); explicit --etrecord/--debug-buffer/--pte win."""
    p = Path(path)
    if p.is_dir():
        etdp = _only(p, "*.etdp", ".etdp")
        if etdp is None:
            raise FileNotFoundError(f"{side}: {p} holds no .etdp file")
        rec = _only(p, "*.etrecord", ".etrecord")
        buf = _only(p, "*.bin", ".bin", prefer=etdp.stem + ".bin")
        ptes = sorted(q for q in p.glob("*.pte") if q.is_file())
        files = RunFiles(etdp, rec, buf, found_etrecord=rec is not None, pte=ptes[0] if len(ptes) == 1 else None)
    elif p.exists():
        files = RunFiles(p)
    else:
        raise FileNotFoundError(f"{side}: {p} does not exist")
    if etrecord:
        files.etrecord, files.found_etrecord = Path(etrecord), False
    if debug_buffer:
        files.debug_buffer = Path(debug_buffer)
    if pte:
        files.pte = Path(pte)
    return files


def _compare_parser(prog: str) -> _Parser:
    p = _Parser(prog=prog, description="Per-op latency and numeric deltas of run B against run A.")
    for side in ("a", "b"):
        p.add_argument(side, metavar=side.upper(), help=f"run {side.upper()}: an .etdp, or a folder holding one "
                       "(and its .etrecord and debug buffer .bin)")
    for side in ("a", "b"):
        p.add_argument(f"--etrecord-{side}", help=f"ETRecord of run {side.upper()}'s program")
        p.add_argument(f"--debug-buffer-{side}", help=f"debug buffer of run {side.upper()}")
        p.add_argument(f"--pte-{side}", help=f"the .pte of run {side.upper()}'s program (places the events of "
                       "XNNPACK delegates whose ETRecord has no debug map, e.g. upstream's, on their nodes)")
    p.add_argument("--by", choices=("debug_handle", "module", "instruction"), default="debug_handle",
                   help="join events by debug handle (default; by module path + op where the builds' handles do "
                   "not line up, e.g. float vs quantized; by event name without an ETRecord), always by module "
                   "+ op, or by instruction")
    p.add_argument("--top", type=int, default=20, help="rows printed, largest |latency delta| first (default 20)")
    p.add_argument("--csv", metavar="OUT.csv", help="write every row as CSV")
    p.add_argument("--json", metavar="OUT.json", help="write the summary and every row as JSON")
    p.add_argument("--parquet", metavar="OUT.parquet", help="write every row as Parquet")
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML report (table, chart, graph)")
    p.add_argument("--target-time-scale", choices=_SCALES, default="ms", help="unit of the printed times (ms)")
    p.add_argument("--strict", action="store_true", help=_STRICT_HELP)
    p.add_argument("--progress", action="store_true", help=PROGRESS_HELP)
    return p


def compare_table(comparison, top: int, width: int | None = None) -> str:
    """The summary and the `top` rows that moved most (then the rows only one run has), as text
    within `width` characters (the terminal's by default): row keys and ops cut, sentences wrapped."""
    import textwrap

    from etlab.inspector._terminal import fit_table, terminal_width

    width = width or terminal_width()
    fmt = lambda v, f="{:.4g}": "" if v is None else f.format(v)
    moved = comparison.top(top, "latency")
    one_sided = [r for r in comparison.rows if r.present != "both"][: max(0, top - len(moved))]
    unit = comparison.unit
    rows = [[r.key, r.label, r.present, r.join, fmt(r.latency_a), fmt(r.latency_b), fmt(r.delta, "{:+.4g}"),
             fmt(r.ratio, "{:.3f}"), fmt(r.max_abs, "{:.3g}"), fmt(r.sqnr, "{:.1f}"), fmt(r.added_error, "{:+.3g}")]
            for r in moved + one_sided]
    wrap = lambda text, indent="": textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False)
    head = [wrap(f"A: {comparison.name_a}", "   "), wrap(f"B: {comparison.name_b}", "   "),
            wrap(f"joined by {comparison.by}; {comparison.summary.text(unit)}", "  ")]
    heads = ["row", "ops", "in", "joined by", f"A ({unit})", f"B ({unit})", f"B-A ({unit})", "B/A", "max|B-A|",
             "SQNR dB", "+rel.err"]
    shown = [k for k in range(len(heads)) if k < 4 or any(r[k] for r in rows)]  # no all-empty number columns
    table = fit_table([[r[k] for k in shown] for r in rows], [heads[k] for k in shown], (0, 1), width,
                      tuple("left" if k < 4 else "right" for k in shown))
    notes = [wrap(f"  {r.key}: {r.join_note}", "    ") for r in moved + one_sided if r.join_note]
    added = [r for r in comparison.top(3, "added") if r.added_error > 0]
    starts = ("\n" + wrap("numeric differences start at (relative error added over the inputs'): "
                          + ", ".join(f"{r.key} (+{r.added_error:.3g})" for r in added)) + "\n") if added else ""
    return ("\n".join(head) + "\n\n" + "\n".join(table) + "\n" + starts
            + ("\nnotes:\n" + "\n".join(notes) + "\n" if notes else ""))


def _csv_text(comparison) -> str:
    df = comparison.to_dataframe()
    return df.map(lambda v: " ".join(map(str, v)) if isinstance(v, (list, tuple)) else v).to_csv(index=False)


def _record(files: RunFiles, prog: str, progress: Progress | None = None):
    """The side's ETRecord: a named one must load; one found beside the run that does not (an
    upstream ETRecord, say) is left out with a warning, and the run is compared without it."""
    if files.etrecord is None or not files.found_etrecord:
        return None if files.etrecord is None else str(files.etrecord)
    from etlab.etrecord import parse_etrecord

    try:
        return parse_etrecord(files.etrecord)
    except (FormatError, ValueError, OSError) as e:
        if progress is not None:
            progress.clear()
        print(f"{prog}: warning: {str(e).splitlines()[0]}; comparing {files.etdump.name} without it", file=sys.stderr)
        return None


def compare_main(argv: list[str] | None = None, prog: str = "etlab compare") -> int:
    """`etlab compare A B [--etrecord-a R] [--debug-buffer-a B] [... -b] [--by ...] [--top N]
    [--csv OUT] [--json OUT] [--html OUT] [--progress]`; returns the exit status."""
    from etlab.inspector._inspector import Inspector

    def run() -> None:
        a = _compare_parser(prog).parse_args(argv)
        if a.top < 0:
            raise ValueError(f"--top must be >= 0, got {a.top}")
        for side in ("a", "b"):
            for flag in ("etrecord", "debug_buffer", "pte"):
                input_file(f"--{flag.replace('_', '-')}-{side}", getattr(a, f"{flag}_{side}"))
        for flag in ("csv", "json", "parquet", "html"):
            output_file(f"--{flag}", getattr(a, flag))
        sides = [run_files(a.a, a.etrecord_a, a.debug_buffer_a, "A", a.pte_a),
                 run_files(a.b, a.etrecord_b, a.debug_buffer_b, "B", a.pte_b)]
        with Progress(prog, a.progress) as step:
            ins = []
            with warnings_as_lines(prog, step):
                for name, f in zip("AB", sides):
                    step(f"reading {name}: {f.etdump}" + (f" with {f.etrecord.name}" if f.etrecord else ""))
                    record = _record(f, prog, step)
                    ins.append(Inspector(etdump_path=f.etdump, etrecord=record, debug_buffer_path=f.debug_buffer,
                                         target_time_scale=a.target_time_scale, strict=a.strict, pte=f.pte))
            step(f"joining A and B by {a.by}")
            comparison = ins[0].compare(ins[1], by=a.by, name_a=str(sides[0].etdump), name_b=str(sides[1].etdump))
            outputs = [(a.csv, lambda p: write_atomic(p, _csv_text(comparison).encode())),
                       (a.json, lambda p: write_atomic(p, (json.dumps(comparison.to_dict(), indent=1, allow_nan=False)
                                                           + "\n").encode())),
                       (a.parquet, lambda p: write_atomic(p, parquet_bytes(comparison.to_dataframe()))),
                       (a.html, comparison.save_html)]
            for path, write in outputs:
                if path:
                    step(f"writing {path}")
                    write(path)
        sys.stdout.write(compare_table(comparison, a.top))

    return _exit_status(prog, run)
