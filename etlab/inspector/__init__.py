"""The Inspector: ETDump timings and intermediate outputs, joined with the ETRecord when given.

    from etlab.inspector import Inspector
    ins = Inspector(etdump_path="run.etdp", debug_buffer_path="run.bin")
    ins.print_data_tabular()
    df = ins.to_dataframe()

- `Inspector`, `EventBlock`, `Event`, `PerfData`, `TimeScale`
- `ProgramInfo` / `MethodInfo` / `DelegateInfo` / `OpInfo`: what an ETRecord provides (the
  Inspector's `etrecord=` argument accepts a ProgramInfo, or an object with `program_info()`)
- rollups for views and reports: `op_timings` (`OpTiming` per timed event: percentiles, handles,
  ops, module, the user's source line), `execute_timings`, `timings_counted_once`, `numeric_gaps`
  (`GapRow`), `time_unit`
- LLM-shaped runs: `phases(inspector, program)` (prefill / decode per method: latency and per-token
  p50/p90/p99, tokens/s), `phase_runs` (one row per run), `block_methods`, `phase_of`
- `Inspector.compare(other)` -> `Comparison` (`CompareRow`, `CompareSummary`): two runs or builds
  per op (latency and numeric deltas joined by debug handle, or by module + op where the builds'
  graphs differ, e.g. float vs quantized); `etlab compare A B` on the command line
- memory as it ran: `Inspector.memory_dataframe()` / `.memory_summary()` -> `MemorySummary` (peak by owner,
  load vs run, tracked bytes per instruction, planned vs observed); `memory_frame(columns)` /
  `memory_summary(columns)` over a read ETDump (`etlab.etdump.read_etdump`)
- `compare_results`, distance functions `mse`, `l1`, `snr`, `cosine_similarity`
- a run and its program: `run_mismatch` (why a run is not of a program: the Inspector warns with it, or
  raises `PairingError` with `strict=True`), `program_signature` / `pte_signature`, `run_calls`
- `python -m etlab.inspector --etdump_path P [--etrecord_path R] [--debug_buffer_path B]`
- `inspect_main(argv)` / `compare_main(argv)`: `etlab inspect` / `etlab compare` (the CLI calls them); what
  every etlab command shares: `input_file` / `output_file` (file arguments checked before any work),
  `error_line`, `Progress` (stages on stderr), `stdout_closed` (a reader that went away: no traceback),
  `terminal_width`, `cut` (text cut with "…"), `fit_table` (a table within a width), `fit_frame` (a
  DataFrame within a width, the columns that do not fit named), `compact_table` (the
  events' table `etlab inspect` prints), `cell_text` (a table cell as text: one rule for the terminal's
  tables and the views' plain HTML ones)
"""

from etlab.inspector._cli import (
    PROGRESS_HELP,
    Progress,
    compare_main,
    error_line,
    input_file,
    inspect_main,
    output_file,
    stdout_closed,
    warnings_as_lines,
)
from etlab.inspector._compare import CompareRow, CompareSummary, Comparison, compare
from etlab.inspector._events import Event, EventBlock, PerfData, TimeScale
from etlab.inspector._inspector import Inspector
from etlab.inspector._memory import MemorySummary, memory_frame, memory_summary
from etlab.inspector._numeric import compare_results, cosine_similarity, l1, mse, snr
from etlab.inspector._pairing import (
    DELEGATE,
    KERNEL,
    PairingError,
    RunCall,
    op_label,
    program_signature,
    pte_signature,
    run_calls,
    run_mismatch,
)
from etlab.inspector._phases import block_methods, phase_of, phase_runs, phases
from etlab.inspector._program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo
from etlab.inspector._rollups import (
    GapRow,
    OpTiming,
    event_label,
    execute_timings,
    numeric_gaps,
    op_timings,
    ops_without_outputs,
    time_unit,
    timings_counted_once,
)
from etlab.inspector._terminal import cell_text, compact_table, cut, fit_frame, fit_table, terminal_width
from etlab.schema.etdump import DELEGATE_CALL, FRAMEWORK_EVENT_NAMES, OPERATOR_CALL

__all__ = [
    "DELEGATE",
    "DELEGATE_CALL",
    "FRAMEWORK_EVENT_NAMES",
    "KERNEL",
    "OPERATOR_CALL",
    "PROGRESS_HELP",
    "CompareRow",
    "CompareSummary",
    "Comparison",
    "DebugHandle",
    "DelegateInfo",
    "Event",
    "EventBlock",
    "GapRow",
    "Inspector",
    "MemorySummary",
    "MethodInfo",
    "OpInfo",
    "OpTiming",
    "PairingError",
    "PerfData",
    "ProgramInfo",
    "Progress",
    "RunCall",
    "TimeScale",
    "block_methods",
    "cell_text",
    "compact_table",
    "compare",
    "compare_main",
    "compare_results",
    "cosine_similarity",
    "cut",
    "error_line",
    "event_label",
    "execute_timings",
    "fit_frame",
    "fit_table",
    "input_file",
    "inspect_main",
    "l1",
    "memory_frame",
    "memory_summary",
    "mse",
    "numeric_gaps",
    "op_label",
    "op_timings",
    "ops_without_outputs",
    "output_file",
    "phase_of",
    "phase_runs",
    "phases",
    "program_signature",
    "pte_signature",
    "run_calls",
    "run_mismatch",
    "snr",
    "stdout_closed",
    "terminal_width",
    "time_unit",
    "timings_counted_once",
    "warnings_as_lines",
]
