"""The Inspector: what ran (ETDump, debug buffer) joined with what was compiled (ETRecord)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import pandas as pd

from etlab.etdump import DebugBuffer, debug_rows_of, debug_value, load_debug_buffer, read_etdump
from etlab.facts import display
from etlab.inspector import _frames
from etlab.inspector._events import (
    Event,
    EventBlock,
    PerfData,
    TimeScale,
    time_scale,
    time_scale_factor,
)
from etlab.inspector._grouping import BlockTable, group_events
from etlab.inspector._pairing import PairingError, program_signature, pte_signature, run_mismatch
from etlab.inspector._program_info import JoinedColumns, ProgramInfo, in_module, join_block, resolve_program_info
from etlab.schema import write_atomic
from etlab.schema.etdump import DROPPED_DEBUG_VALUES, FRAMEWORK_EVENT_NAMES, OPERATOR_CALL, kernel_of_event


class Inspector:
    """Profiling and debugging data of a program run, from its ETDump (and optionally its ETRecord).

    Events are read into columns and grouped once; `to_dataframe()` works on those columns, and
    `event_blocks` (Event objects) are built on first access. Works with an ETDump alone (names,
    timings, intermediate outputs) and with files written by upstream ExecuTorch.

    >>> import os, tempfile, torch
    >>> from etlab.compiler import to_edge
    >>> from etlab.etrecord import generate_etrecord
    >>> from etlab.runtime import Runtime
    >>> class AddMul(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return x * y + x
    >>> exported = torch.export.export(AddMul(), (torch.ones(2, 2), torch.ones(2, 2)))
    >>> edge = to_edge(exported)
    >>> et = edge.to_executorch()
    >>> d = tempfile.TemporaryDirectory()
    >>> generate_etrecord(os.path.join(d.name, "model.etrecord"), edge, et, exported)
    >>> program = Runtime.get().load_program(et.buffer, enable_etdump=True)
    >>> method = program.load_method("forward")
    >>> for _ in range(3):
    ...     _ = method.execute((torch.ones(2, 2), torch.full((2, 2), 3.0)))
    >>> program.write_etdump_result_to_file(os.path.join(d.name, "run.etdp"))
    >>> inspector = Inspector(etdump_path=os.path.join(d.name, "run.etdp"),
    ...                       etrecord=os.path.join(d.name, "model.etrecord"))
    >>> df = inspector.to_dataframe()
    >>> kernels = df[df["event_name"].str.startswith("native_call_")]
    >>> [(name, len(raw), ops) for name, raw, ops in zip(kernels["event_name"], kernels["raw"], kernels["op_types"])]
    [('native_call_mul.out', 3, ['aten.mul.Tensor']), ('native_call_add.out', 3, ['aten.add.Tensor'])]
    >>> d.cleanup()
    """

    def __init__(
        self,
        etdump_path: str | os.PathLike | None = None,
        etdump_data: bytes | memoryview | None = None,
        etrecord: Any = None,
        source_time_scale: TimeScale | str = TimeScale.NS,
        target_time_scale: TimeScale | str = TimeScale.MS,
        debug_buffer_path: str | os.PathLike | bytes | None = None,
        delegate_metadata_parser: Callable[[list[bytes]], Any] | None = None,
        delegate_time_scale_converter: Callable[[int | str, int | float], int | float] | None = None,
        enable_module_hierarchy: bool = False,
        strict: bool = False,
        pte: str | os.PathLike | bytes | Any = None,
    ) -> None:
        """
        Args:
            etdump_path / etdump_data: the .etdp file, by path or as bytes (exactly one).
            etrecord: a path to an ETRecord, a `ProgramInfo`, or an object with `program_info()`.
            source_time_scale: unit of the runtime's clock (the default clock counts ns).
            target_time_scale: unit of perf_data and the dataframe's timing columns.
            debug_buffer_path: file holding the intermediate tensors the ETDump points into.
            delegate_metadata_parser: turns an event's per-run delegate metadata (bytes) into a
                dict or list shown by `to_dataframe(include_delegate_debug_data=True)`.
            delegate_time_scale_converter: (event name, delegate clock value) -> target units,
                for delegates whose clock differs from the runtime's.
            enable_module_hierarchy: accepted for compatibility; module hierarchy is attached
                whenever the ETRecord provides it.
            strict: a run that is not of the ETRecord's program (calls on instructions the program
                does not have, or of another kind, or other operators) raises `PairingError`;
                by default it is a RuntimeWarning with the evidence (also in `pairing_mismatch`).
            pte: the program's .pte (path, bytes or `etlab.schema.PteFile`), optional: its operator
                table makes the pairing check exact, and the XNNPACK delegates' node lists place each
                event of a delegate whose ETRecord has no debug map (upstream's XNNPACK) on the nodes
                it ran (etlab.inspector._delegate_nodes).
        """
        if (etdump_path is None) == (etdump_data is None):
            raise ValueError("Inspector: give exactly one of etdump_path and etdump_data")
        self._source_time_scale = time_scale(source_time_scale, "source_time_scale")
        self._target_time_scale = time_scale(target_time_scale, "target_time_scale")
        if (self._source_time_scale == TimeScale.CYCLES) != (self._target_time_scale == TimeScale.CYCLES):
            raise ValueError("Inspector: cycles can only be converted to cycles; make both time scales CYCLES")
        self._columns = read_etdump(etdump_path if etdump_path is not None else etdump_data)
        # with the ETDump: a buffer written with another run is refused (etdump.check_pair)
        self._buffer: DebugBuffer | None = (None if debug_buffer_path is None else
                                            load_debug_buffer(debug_buffer_path, etdump=self._columns))
        self._delegate_metadata_parser = delegate_metadata_parser
        self._delegate_time_scale_converter = delegate_time_scale_converter
        self._enable_module_hierarchy = enable_module_hierarchy
        self._scale = time_scale_factor(self._source_time_scale, self._target_time_scale)
        self._tables: list[BlockTable] = group_events(self._columns, self._scale, delegate_time_scale_converter)
        self._debug_row = debug_rows_of(self._columns)
        self._debug_values: dict[int, Any] = {}
        self._program: ProgramInfo | None = resolve_program_info(etrecord)
        self._pte = None
        self._node_handles: dict = {}
        if pte is not None:
            from etlab.inspector._delegate_nodes import delegate_node_handles, read_pte

            self._pte = read_pte(pte)
            if self._program is not None:
                self._node_handles = delegate_node_handles(self._pte, self._program)
        self.pairing_mismatch = _pairing_mismatch(self._columns, self._program, etrecord, self._pte)
        if self.pairing_mismatch and strict:
            raise PairingError(self.pairing_mismatch)
        if self.pairing_mismatch:
            warnings.warn(f"{self.pairing_mismatch} (its op types, modules and source lines are not this run's; "
                          "strict=True or --strict refuses such a pair)", RuntimeWarning, stacklevel=2)
        self._joins: list[JoinedColumns | None] = [self._join(t) for t in self._tables]
        self._event_blocks: list[EventBlock] | None = None
        self.dropped_debug_values = _dropped_debug_values(self._columns)
        if self.dropped_debug_values:
            warnings.warn(f"{self._columns.what}: {self.dropped_debug_values} logged values were dropped at run time "
                          "(debug buffer full): debug data and the numeric gap lack them; run without "
                          "debug_buffer_size (sized from the plan) or with a larger one", RuntimeWarning, stacklevel=2)

    # -- ETRecord join ---------------------------------------------------------------------------

    def _join(self, t: BlockTable) -> JoinedColumns | None:
        method = self._program.method_for_block(t.name) if self._program is not None else None
        if method is None:
            return None
        return join_block(method, t.names, t.chain_index, t.instruction_id, t.delegate_id, t.is_delegated,
                          self._node_handles.get(id(method)))

    def _reference_output(self, t: BlockTable):
        method = self._program.method_for_block(t.name) if self._program is not None else None
        refs = method.reference_outputs if method is not None else None
        if refs is None or t.bundled_input_index < 0 or t.bundled_input_index >= len(refs):
            return None
        return refs[t.bundled_input_index]

    # -- event objects -------------------------------------------------------------------------

    @property
    def event_blocks(self) -> list[EventBlock]:
        """The event blocks, as Event objects (built on first access)."""
        if self._event_blocks is None:
            self._event_blocks = [self._make_block(t, j) for t, j in zip(self._tables, self._joins)]
        return self._event_blocks

    def _debug_data(self, rows) -> list:
        out = []
        for r in rows.tolist():
            v = self._debug_values.get(r, self)
            if v is self:  # several events (a kernel and its OPERATOR_CALL) share one debug event
                v = self._debug_values[r] = debug_value(self._columns, int(self._debug_row[r]), self._buffer)
            out.append(v)
        return out

    def _make_block(self, t: BlockTable, join: JoinedColumns | None) -> EventBlock:
        c = self._columns
        raw = t.durations.T.tolist()
        starts = c.start_time[t.rows].T.tolist()
        meta_any = (c.metadata_len[t.rows] > 0).any(axis=0) & t.has_perf
        events = []
        for j in range(len(t)):
            perf = t.has_perf[j]
            metas = [c.metadata(int(r)) or b"" for r in t.rows[:, j]] if meta_any[j] else []
            e = Event(
                name=t.names[j], perf_data=PerfData(raw[j]) if perf else None,
                delegate_debug_identifier=t.delegate_id[j], is_delegated_op=bool(t.is_delegated[j]),
                debug_data=self._debug_data(t.debug_rows[j]), instruction_id=int(t.instruction_id[j]),
                chain_index=int(t.chain_index[j]), start_time=starts[j] if perf else None,
                raw_delegate_debug_metadatas=metas, delegate_metadata_parser=self._delegate_metadata_parser,
            )
            if join is not None:
                e.debug_handles, e.num_outputs = join.debug_handles[j], join.num_outputs[j]
                e.op_types, e.stack_traces = join.op_types[j], join.stack_traces[j]
                e.module_hierarchy, e.delegate_backend_name = join.module_hierarchy[j], join.backend_names[j]
            events.append(e)
        return EventBlock(
            name=t.name or "", events=events, source_time_scale=self._source_time_scale,
            target_time_scale=self._target_time_scale, bundled_input_index=t.bundled_input_index,
            run_output=self._debug_data(t.output_rows), reference_output=self._reference_output(t),
            num_runs=len(t.runs),
        )

    # -- tables ----------------------------------------------------------------------------------

    def to_dataframe(self, include_units: bool = True, include_delegate_debug_data: bool = False) -> pd.DataFrame:
        """One row per event of every block (columns: see etlab.inspector._frames)."""
        c = self._columns
        cols: dict[str, list] = {k: [] for k in (
            "event_block_name", "event_name", "raw", "op_types", "delegate_debug_identifier", "stack_traces",
            "module_hierarchy", "is_delegated_op", "delegate_backend_name", "debug_data", "start_time")}
        stats, metadatas = [], []
        for t, join in zip(self._tables, self._joins):
            m, perf = len(t), t.has_perf
            cols["event_block_name"] += [t.name or ""] * m
            cols["event_name"] += t.names
            raw = t.durations.T.tolist()
            starts = c.start_time[t.rows].T.tolist()
            if perf.all():
                cols["raw"] += raw
                cols["start_time"] += starts
            else:
                cols["raw"] += [r if p else None for r, p in zip(raw, perf.tolist())]
                cols["start_time"] += [s if p else None for s, p in zip(starts, perf.tolist())]
            stats.append(_frames.perf_stats(t.durations))
            cols["delegate_debug_identifier"] += t.delegate_id
            cols["is_delegated_op"] += t.is_delegated.tolist()
            cols["debug_data"] += [self._debug_data(rows) if len(rows) else [] for rows in t.debug_rows]
            if join is None:
                cols["op_types"] += [[] for _ in range(m)]
                cols["stack_traces"] += [{} for _ in range(m)]
                cols["module_hierarchy"] += [{} for _ in range(m)]
                cols["delegate_backend_name"] += [None] * m
            else:
                traces, hierarchy = join.frame_dicts()
                cols["op_types"] += join.op_types
                cols["stack_traces"] += traces
                cols["module_hierarchy"] += hierarchy
                cols["delegate_backend_name"] += join.backend_names
            if include_delegate_debug_data:
                metadatas += self._block_metadatas(t)
        cols["stats"] = np.hstack(stats) if stats else np.zeros((6, 0))
        df = _frames.frame_from_columns(cols, include_units, self._target_time_scale.value, keyed=True)
        if include_delegate_debug_data:
            df = _frames.add_delegate_columns(df, metadatas)
        return df

    def _block_metadatas(self, t: BlockTable) -> list:
        c = self._columns
        has = (c.metadata_len[t.rows] > 0).any(axis=0) & t.has_perf
        out: list = [[] for _ in range(len(t))]
        for j in np.flatnonzero(has).tolist():
            metas = [c.metadata(int(r)) or b"" for r in t.rows[:, j]]
            parser = self._delegate_metadata_parser
            out[j] = parser(metas) if parser is not None and t.is_delegated[j] else metas
        return out

    def _prepare_dataframe(self, include_units: bool = True, include_delegate_debug_data: bool = False):
        return _frames.printable(self.to_dataframe(include_units, include_delegate_debug_data))

    def print_data_tabular(self, file: IO[str] | None = None, include_units: bool = True,
                           include_delegate_debug_data: bool = False) -> None:
        """Prints the events (OPERATOR_CALL rows and bulky columns left out): an HTML table in a
        notebook, a text grid elsewhere or when `file` is given."""
        _frames.display_or_print(self._prepare_dataframe(include_units, include_delegate_debug_data), file)

    def save_data_to_tsv(self, file: str | os.PathLike | IO[str], include_units: bool = True,
                         include_delegate_debug_data: bool = False) -> None:
        """Writes the printed table as TSV, to a path (atomically) or an open text file."""
        text = _frames.tsv_text(self._prepare_dataframe(include_units, include_delegate_debug_data))
        if isinstance(file, (str, os.PathLike)):
            write_atomic(file, text.encode())
        else:
            file.write(text)

    # -- queries --------------------------------------------------------------------------------

    def find_total_for_module(self, module_name: str) -> float:
        """Sum of the average time of every event (OPERATOR_CALL excluded) running an op of the
        module `module_name` (an nn_module_stack key or module path, e.g. "layers.0"). Needs an ETRecord."""
        if self._program is None:
            raise ValueError("find_total_for_module needs the module hierarchy: create the Inspector with an etrecord")
        total = 0.0
        for t, join in zip(self._tables, self._joins):
            if join is None:
                continue
            avg = t.durations.mean(axis=0) if len(t.runs) else np.full(len(t), np.nan)
            for j, hier in enumerate(join.module_hierarchy):
                if t.names[j] == OPERATOR_CALL or not t.has_perf[j]:
                    continue
                if any(in_module(h, module_name) for h in hier.values()):
                    total += float(avg[j])
        return total

    def get_op_list(self, event_block: str | None = None, show_delegated_ops: bool = True) -> dict[str, list[Event]]:
        """op type -> events running it, over one block (by name) or all. Without an ETRecord the
        op type is read from the kernel event's name ("native_call_addmm.out" -> "addmm.out")."""
        ops: dict[str, list[Event]] = {}
        for block in self.event_blocks:
            if event_block is not None and block.name != event_block:
                continue
            for e in block.events:
                if e.name == OPERATOR_CALL or e.name in FRAMEWORK_EVENT_NAMES:
                    continue
                if e.is_delegated_op and not show_delegated_ops:
                    continue
                types = e.op_types or [k for k in (kernel_of_event(e.name),) if k]
                for op in dict.fromkeys(types):
                    ops.setdefault(op, []).append(e)
        return ops

    def get_exported_program(self, graph: str | None = None):
        """A graph recorded in the ETRecord (default: the edge-dialect program); None without one."""
        if self._program is None:
            return None
        key = graph or "edge_dialect_exported_program"
        return self._program.graphs.get(key)

    @property
    def allocations(self) -> pd.DataFrame:
        """Memory allocation events: run index, run name, allocator (id and name), size in bytes."""
        f = self.memory_dataframe()
        return pd.DataFrame({"run": f["block"].astype(np.int32), "run_name": f["block_name"],
                             "allocator_id": f["allocator_id"].astype(np.int32), "allocator_name": f["allocator"],
                             "allocation_size": f["size"].astype(np.uint64)})

    def memory_dataframe(self) -> pd.DataFrame:
        """One row per allocation event (allocator x instruction x run): load or run, the allocator and its
        owner, the instruction it belongs to, its signed bytes (etlab.inspector._memory.memory_frame)."""
        from etlab.inspector._memory import memory_frame

        return memory_frame(self._columns)

    def memory_summary(self, pte=None, method: str | None = None):
        """Peak bytes by owner (planned arenas, method allocator, temporaries, each delegate, unplanned), load
        against run, tracked bytes per instruction and run, RSS growth; with the program's plan (`pte`: a
        path, bytes, PteFile or program manager, else the Inspector's own `pte=`) planned against observed.
        A `MemorySummary`."""
        from etlab.inspector._delegate_nodes import read_pte
        from etlab.inspector._memory import memory_summary

        plan = read_pte(getattr(pte, "buffer", pte)) if pte is not None else self._pte  # a program manager: its bytes
        return memory_summary(self._columns, plan, method)

    # -- timeline and numerics -----------------------------------------------------------------

    def to_chrome_trace(self, path: str | os.PathLike | None = None) -> dict:
        """The runtime timeline as Chrome trace JSON (open in Perfetto or chrome://tracing): one
        track per run, each profile event a complete ("X") event, delegate events nested in
        their DELEGATE_CALL. Written atomically to `path` when given; returned either way."""
        from etlab.inspector._chrome_trace import chrome_trace, write_chrome_trace

        trace = chrome_trace(self._columns, self._source_time_scale, self._target_time_scale,
                             self._delegate_time_scale_converter)
        if path is not None:
            write_chrome_trace(trace, path)
        return trace

    def calculate_numeric_gap(self, distance: str | Callable = "MSE") -> pd.DataFrame:
        """Per matched intermediate output: AOT ops, runtime ops, both values and their gap.

        Runtime intermediates come from the debug buffer; AOT intermediates from the ETRecord
        (`MethodInfo.aot_intermediate_outputs`). They are matched by debug handle, many-to-one
        where a delegate or fused op covers several graph nodes. `distance` is "MSE", "L1",
        "SNR" or a function (aot, runtime) -> float.
        """
        from etlab.inspector._numeric import numeric_gap

        return numeric_gap(self, distance)

    def compare(self, other: Inspector, *, by: str = "debug_handle", name_a: str = "A", name_b: str = "B"):
        """This run (A) against `other` (B), per op: latency medians, delta and ratio, and where both
        logged an op's output, max-abs / relative difference, SQNR and cosine similarity.

        Rows are joined by debug handle (a delegate event meets the kernels of the nodes it covers);
        where the two builds' handles do not line up (float vs quantized), or with `by="module"`, by
        module path + operator + order, q/dq ops attached to the op they wrap; by event name where a
        side has no ETRecord, or by instruction with `by="instruction"`. `CompareRow.join` says which.
        Returns an `etlab.inspector.Comparison`; `.show()` draws it, `.to_dataframe()` tabulates it.
        """
        from etlab.inspector._compare import compare

        return compare(self, other, by=by, name_a=name_a, name_b=name_b)

    def show(self, program=None, *, method: str = "forward", engine: str = "etlab", **options):
        """The notebook dashboard of this run (graph, memory, delegation, numeric gap, profile);
        pass the ExecutorchProgramManager as `program` for the runtime graph and memory plan.
        `.save_html(path)` on the result writes it as one offline file.

        `engine="model-explorer"` opens the run in Google's Model Explorer instead (its Jupyter
        embedding, `pip install 'etlab[model-explorer]'`): the ETRecord's graphs with an overlay
        (`overlay="latency_p50"`, see `etlab.model_explorer.OVERLAY_KEYS`); `.stop()` ends its server."""
        if engine != "etlab":  # the engine's package registers it (etlab.facts.display.ENGINES)
            return display.show(self, engine=engine, method=None if method == "forward" else method, **options)
        return display.show(self, program, method=method)  # the views register it (etlab.facts.display)

    def to_model_explorer(self, out_dir: str | os.PathLike, **options) -> dict:
        """Writes this run for Google's Model Explorer into the existing folder `out_dir`: the
        ETRecord's graphs (`graphs.json`) and one node-data file per overlay with values (latency
        p50/p90, share of the run, numeric gap, output bytes), keyed to the graphs' node ids. Returns
        {name: path}; `etlab.model_explorer.open_command(result)` is the command that opens them."""
        return display.export(self, out_dir, engine="model-explorer", **options)

    pairing_mismatch: str | None
    """Why the run is not of the ETRecord's program (the evidence), or None: it is, or no ETRecord."""

    dropped_debug_values: int
    """Values the runtime could not log (its debug buffer was full), over all runs; 0 for upstream's files."""

    @property
    def program_info(self) -> ProgramInfo | None:
        """What the ETRecord says about the program (op names, modules, source lines, graphs), or None."""
        return self._program

    def _repr_html_(self) -> str | None:
        return display.html(self)

    def __repr__(self) -> str:
        n = sum(len(t) for t in self._tables)
        return (f"Inspector({self._columns.what!r}: {len(self._tables)} event blocks, {n} events, "
                f"{'with' if self._program else 'without'} ETRecord)")


def _pairing_mismatch(columns, program: ProgramInfo | None, etrecord, pte) -> str | None:
    """Why the run is not of the recorded program (or of the .pte), or None (see etlab.inspector._pairing)."""
    found = None
    if pte is not None:
        found = run_mismatch(columns, pte_signature(pte), run_name=columns.what, program_name="the .pte", pte=pte)
    if found is None and program is not None:
        name = str(etrecord) if isinstance(etrecord, (str, os.PathLike)) else "the ETRecord"
        found = run_mismatch(columns, program_signature(program), run_name=columns.what, program_name=name,
                             program=program)
    return found


def _dropped_debug_values(columns) -> int:
    """The counts of etlab's `etlab::dropped_debug_values` events (ASCII digits; a malformed count
    counts as one drop)."""
    if DROPPED_DEBUG_VALUES not in columns.strings:
        return 0
    code = columns.strings.index(DROPPED_DEBUG_VALUES)
    total = 0
    for row in np.flatnonzero(columns.has_profile & (columns.name_code == code)):
        meta = columns.metadata(int(row)) or b""
        total += int(meta) if meta.isdigit() and len(meta) <= 18 else 1
    return total
