"""A loaded method: its own memory, value table and bound steps, run by `execute`.

Threads: a Method serves one thread at a time (a second thread calling `execute` while it runs
gets an ExecutionError); load one Method per thread. Methods of one Program share nothing
writable (constants are read-only views), so they may run in parallel; torch kernels release
the GIL. The exception is a program's shared state (`share_mutable_buffers`): the methods using it
take its lock while they run, so they run one at a time.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from etlab.runtime._binding import BoundPlan
from etlab.runtime._delegate import LoadedDelegate
from etlab.runtime._errors import ExecutionError
from etlab.runtime._event_tracer import PROGRAM_OUTPUT_CHAIN, UNSET_CHAIN, UNSET_INSTRUCTION, EventTracer
from etlab.runtime._events import profile_event, timed_run
from etlab.runtime._interpreter import PythonCore, StepFailed
from etlab.runtime._memory import Arenas, dim_order_strides, reshape_in_place
from etlab.runtime._memory_events import new_watch, process_events, process_memory
from etlab.runtime._meta import MethodMeta, ScalarInfo, ValueInfo
from etlab.runtime._values import ValueTable

# Dynamic shapes: torch resizes a planned output in place (within its fixed memory) and warns
# each time the shape changes; that is the intended behaviour here, so the warning is silenced
# for calls made by the interpreter loop only.
warnings.filterwarnings("ignore", message="An output with one or more elements was resized",
                        category=UserWarning, module=r"etlab\.runtime\._interpreter")

_SCALAR_TYPES = {"Int": (int,), "Double": (float, int), "Bool": (bool,), "String": (str,)}


def describe(value: Any) -> str:
    """A short description of a value for error messages: dtype and shape for a tensor, the type name otherwise."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')} {list(value.shape)}"
    return type(value).__name__


def _input_error(info: ValueInfo, value: Any) -> str | None:
    """Why `value` cannot be this input, or None."""
    if isinstance(info, ScalarInfo):
        if info.kind == "Null":
            return None if value is None else "expected None"
        ok = _SCALAR_TYPES.get(info.kind, (object,))
        if not isinstance(value, ok) or (info.kind != "Bool" and isinstance(value, bool)):
            return f"expected {info.kind}"
        return None
    if not isinstance(value, torch.Tensor):
        return "expected a tensor"
    if value.dtype != info.dtype:
        return "dtype differs"
    if value.dim() != len(info.sizes):
        return f"rank differs ({value.dim()} instead of {len(info.sizes)})"
    if info.dynamism == info.dynamism.DYNAMIC_UNBOUND:
        return None
    if not info.is_dynamic:
        return None if tuple(value.shape) == info.sizes else "shape differs"
    over = [d for d, (got, bound) in enumerate(zip(value.shape, info.sizes)) if got > bound]
    if over:
        return f"dimension {over[0]} exceeds its upper bound {info.sizes[over[0]]}"
    return None


def _laid_out(value: torch.Tensor, dim_order: tuple[int, ...]) -> torch.Tensor:
    """`value` itself if its memory already follows `dim_order`, else a copy that does."""
    if list(dim_order) == sorted(dim_order):
        return value.contiguous()
    strides = dim_order_strides(list(value.shape), list(dim_order))
    if list(value.stride()) == strides:
        return value
    return torch.empty_strided(value.shape, strides, dtype=value.dtype).copy_(value)


def _input_setter(table: ValueTable, slot: int, info: ValueInfo) -> Callable[[Any], None]:
    values = table.values
    if isinstance(info, ScalarInfo):
        return lambda v: values.__setitem__(slot, v)
    dst = values[slot]
    if slot in table.planned:
        if not info.is_dynamic:
            return dst.copy_

        def set_dynamic(v: torch.Tensor) -> None:
            reshape_in_place(dst, v.shape, info.dim_order or None)
            dst.copy_(v)

        return set_dynamic
    # Not planned: the tensor points at the caller's memory, as upstream does.
    return lambda v: dst.set_(_laid_out(v, info.dim_order))


class Method:
    """One loaded method of a Program. Call `execute(inputs)`; see the module notes on threads."""

    def __init__(self, program, meta: MethodMeta, table: ValueTable, plan_inputs: list[int],
                 plan_outputs: list[int], bound: BoundPlan, arenas: Arenas, delegates: list[LoadedDelegate],
                 tracer: EventTracer | None, context, scratch: list[int] = (), core=None,
                 state_lock: threading.Lock | None = None):
        self.program = program
        self.name = meta.name
        self._meta = meta
        self._table = table
        self._inputs = list(plan_inputs)
        self._outputs = list(plan_outputs)
        self._bound = bound
        # The loop that runs the bound chains: the native core, or the Python reference.
        self._core = core if core is not None else PythonCore(bound.chains, table.values)
        self._arenas = arenas
        self._tracer = tracer
        self._chains_key = tracer.register_chains(bound.chains) if tracer is not None else -1
        self._context = context
        # Timings only on the native core: the whole run block is recorded natively (no Python per run).
        self._native_log = None
        if (tracer is not None and context is None and not tracer.logs_outputs and not tracer.trace_allocations
                and hasattr(self._core, "trace_to")):
            self._native_log = tracer.native_log
            self._core.trace_to(self._native_log, self._chains_key)
        # trace_allocations: the watch on the allocator's traffic while this method runs (None: not measured)
        self._watch = new_watch() if tracer is not None and tracer.trace_allocations else None
        self._busy = threading.Lock()
        self.threads = program.threads  # intra-op threads each execute sets (None: torch's setting)
        self._state_lock = state_lock  # the program's shared state, held while running
        self._closed = False
        self._scratch = [table.values[s] for s in scratch]
        self._setters = [_input_setter(table, s, info) for s, info in zip(plan_inputs, meta.inputs)]
        self._delegates = delegates
        self._finalizer = weakref.finalize(self, _destroy, delegates)

    @property
    def metadata(self) -> MethodMeta:
        """The method's inputs, outputs and planned buffer sizes (upstream's MethodMeta)."""
        return self._meta

    @property
    def core(self) -> str:
        """Which core runs this method: "native" or "python"."""
        return self._core.name

    @property
    def operators(self) -> list[str]:
        """The operators this method calls, each bound to a kernel at load time."""
        return list(self._bound.kernels)

    def execute(self, inputs: Sequence[Any], *, bundled_input_index: int = -1) -> list:
        """Runs the method; returns its outputs (fresh tensors: nothing aliases the method's memory).

        Raises ExecutionError for inputs that do not fit the method (before anything runs) and for
        kernels that fail (naming the instruction and operator).
        """
        if not self._busy.acquire(blocking=False):
            raise ExecutionError(f"method {self.name!r} is already running in another thread; a Method serves "
                                 "one thread at a time (load one Method per thread)")
        threads = self.threads
        before = threads if threads is None else torch.get_num_threads()
        try:
            if self._closed:
                raise ExecutionError(f"method {self.name!r} was closed")
            if before != threads:
                torch.set_num_threads(threads)  # restored below: see etlab.runtime._threads
            if self._state_lock is None:
                return self._execute(inputs, bundled_input_index)
            with self._state_lock:
                return self._execute(inputs, bundled_input_index)
        finally:
            if before != threads:
                torch.set_num_threads(before)
            self._busy.release()

    __call__ = execute

    def _check_inputs(self, inputs: Sequence[Any]) -> list:
        if isinstance(inputs, torch.Tensor) or not isinstance(inputs, Sequence):
            raise ExecutionError(f"method {self.name!r}: inputs must be a list or tuple, got {type(inputs).__name__}")
        inputs = list(inputs)
        expected = self._meta.inputs
        if len(inputs) != len(expected):
            raise ExecutionError(f"method {self.name!r}: expected {len(expected)} inputs, got {len(inputs)}")
        for k, (info, value) in enumerate(zip(expected, inputs)):
            why = _input_error(info, value)
            if why is not None:
                raise ExecutionError(f"method {self.name!r}: input {k}: {why}: expected {info.describe()}, "
                                     f"got {describe(value)}")
        return inputs

    def _set_inputs(self, inputs: list) -> None:
        for k, (setter, value) in enumerate(zip(self._setters, inputs)):
            try:
                setter(value.detach() if isinstance(value, torch.Tensor) else value)
            except RuntimeError as e:  # e.g. larger than the planned memory of an unbounded input
                raise ExecutionError(f"method {self.name!r}: input {k}: cannot take {describe(value)}: {e}") from e

    def _execute(self, inputs: Sequence[Any], bundled_input_index: int) -> list:
        inputs = self._check_inputs(inputs)
        if self.program._mapped:
            self.program.check_files()  # a truncated memory-mapped file: FormatError, not SIGBUS
        tracer = self._tracer
        native_log = self._native_log
        clock = self._core.clock
        logging = tracer is not None and native_log is None
        memory = process_memory() if logging and tracer.trace_allocations else None
        start = clock() if logging else 0
        dropped_before = tracer.dropped_debug_values if logging else 0
        events: list[tuple] = []
        try:
            # Inputs are detached and nothing the runtime owns requires grad: no autograd to switch off.
            for t in self._scratch:
                t.resize_(0)
            self._set_inputs(inputs)
            core = self._core
            if tracer is None or (native_log is not None and bundled_input_index < 0):
                core.run()  # with a native log, this run's block is recorded natively
            elif native_log is not None:
                core.run_logged(bundled_input_index)
            elif self._context is None and not tracer.logs_intermediates and memory is None:
                record, count = core.run_timed()
                events.append(timed_run(self._chains_key, record, count))
            elif memory is not None:
                self._run_watched(events, tracer)
            else:
                core.run_traced(events, tracer, self._context)
            outputs = [_copy_out(self._table.values[s]) for s in self._outputs]
        except StepFailed as failed:
            raise self._step_error(failed) from failed.error
        if logging:
            end = clock()
            if memory is not None:  # the run's RSS deltas belong to its Method::execute event
                events.extend(process_events(memory, process_memory()))
            self._finish_trace(tracer, events, start, end, bundled_input_index, outputs, dropped_before)
        return outputs

    def _run_watched(self, events: list, tracer: EventTracer) -> None:
        """A traced run that also records each step's allocations (trace_allocations), with the watch on
        this thread for the run (not started when torch's profiler is on: its memory reports win)."""
        watch = self._watch
        started = watch is not None and watch.start()
        try:
            if started and self._context is None and not tracer.logs_intermediates and hasattr(self._core,
                                                                                              "run_watched"):
                events.append(self._core.run_watched(tracer, self._chains_key))  # expanded when written
            else:
                self._core.run_traced(events, tracer, self._context, watch if started else None)
        finally:
            if started:
                watch.stop()

    def _step_error(self, failed: StepFailed) -> ExecutionError:
        """The error of a failed step, naming the method, chain, instruction, operator and debug handle
        (the runtime's debug handle of an instruction is its index: its ETDump events' instruction_id,
        which the ETRecord maps to graph nodes)."""
        info = self._bound.chains[failed.chain].infos[failed.index] if failed.index >= 0 else None
        where = (f"chain {failed.chain}, instruction {info.instruction} ({info.operator}, debug handle "
                 f"{info.instruction})" if info else "a step")
        return ExecutionError(f"method {self.name!r}: {where} failed: {type(failed.error).__name__}: {failed.error}")

    def _finish_trace(self, tracer: EventTracer, events: list, start: int, end: int, bundled_input_index: int,
                      outputs: list, dropped_before: int) -> None:
        events.append(profile_event("Method::execute", UNSET_CHAIN, UNSET_INSTRUCTION, start, end))
        if tracer.logs_outputs:
            for value in outputs:
                event = tracer.debug_event(PROGRAM_OUTPUT_CHAIN, UNSET_INSTRUCTION, value, is_output=True)
                if event is not None:
                    events.append(event)
        # Values this run could not log (runs of other methods sharing the tracer at the same time
        # may be counted here too; the total is exact).
        dropped = tracer.dropped_debug_values - dropped_before
        if dropped > 0:
            events.append(tracer.dropped_values_event(dropped, end))
        tracer.add_run_block(events, bundled_input_index)

    def close(self) -> None:
        """Releases the method's delegates (backend.destroy); the method cannot run afterwards."""
        self._closed = True
        self._finalizer()


def _copy_out(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_copy_out(v) for v in value]
    return value


def _destroy(delegates: list[LoadedDelegate]) -> None:
    for d in delegates:
        d.destroy()

