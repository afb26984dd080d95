"""The Inspector: ETDump timings and intermediate outputs, joined with the ETRecord when given.

    from etlab.inspector import Inspector
    ins = Inspector(etdump_path="run.etdp", debug_buffer_path="run.bin")
    ins.print_data_tabular()
    df = ins.to_dataframe()

- `Inspector`, `EventBlock`, `Event`, `PerfData`, `TimeScale`
- `ProgramInfo` / `MethodInfo` / `DelegateInfo` / `OpInfo`: what an ETRecord provides (the
  Inspector's `etrecord=` argument accepts a ProgramInfo, or an object with `program_info()`)
- `compare_results`, distance functions `mse`, `l1`, `snr`, `cosine_similarity`
- `python -m etlab.inspector --etdump_path P [--etrecord_path R] [--debug_buffer_path B]`
"""

from etlab.inspector._events import Event, EventBlock, PerfData, TimeScale
from etlab.inspector._inspector import Inspector
from etlab.inspector._numeric import compare_results, cosine_similarity, l1, mse, snr
from etlab.inspector._program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo, ProgramInfo

__all__ = [
    "DebugHandle", "DelegateInfo", "Event", "EventBlock", "Inspector", "MethodInfo", "OpInfo", "PerfData",
    "ProgramInfo", "TimeScale", "compare_results", "cosine_similarity", "l1", "mse", "snr",
]
