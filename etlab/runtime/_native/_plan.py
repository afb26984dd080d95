"""Translating a bound plan (`_binding.BoundPlan`) into a native plan, and running it.

Each instruction becomes a native step when everything it touches is fixed at load time (the
tensor objects, which keep their identity for the life of a method, and non-dynamic scalars);
otherwise it calls back the Python step `_binding` already made for it, so both cores share one
definition of what an instruction does. The quantized_decomposed kernels (quantize, dequantize,
choose_qparams), which are Python steps on the Python core, become calls of their C++ twins
(`quant.cpp`, operators `etlab_native::*`), which compute the same bits. `NativeCore` has the
interface of `_interpreter.PythonCore` (`run`, `run_timed`, `run_traced`) and raises the same
`StepFailed`.

Edge's decomposed LSTM cells (twelve instructions per time step) are then marked in the plan
(`_lstm_cells.add_cells`): an untraced run computes each as one step (`lstm.cpp`), while timed and traced
runs, and any run the fused step declines, run the instructions' own steps, one per instruction, so the
ETDump's events stay per instruction. A method loaded to log intermediate outputs is not fused.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from etlab.runtime._direct_kernels import folded_at_load, view_operator
from etlab.runtime._events import watched_run
from etlab.runtime._interpreter import BoundChain, Goto, Step, StepFailed, StepInfo, step_events
from etlab.runtime._memory_events import step_memory_events
from etlab.runtime._native import _core
from etlab.runtime._native._dynamic_plan import (
    RunTimeInts,
    add_dim_order_copy,
    add_int_step,
    add_view_step,
    declare,
    python_reads,
    run_time_ints,
    view_of,
)
from etlab.runtime._native._lstm_cells import add_cells
from etlab.runtime._prim_kernels import _nothing
from etlab.runtime._values import OPT_TENSOR_LIST, TENSOR, TENSOR_LIST, ValueTable
from etlab.schema import program as P
from etlab.schema.scalar_type import ScalarType, scalar_type_to_dtype

# (chain, index, start, end, python events so far, debug records so far, memory peak, memory kept)
_STEP_FIELDS = 8


def _et_scalar_types() -> list[int]:
    """c10::ScalarType index -> ExecuTorch ScalarType (-1: none); the two enums share numbering."""
    table = [-1] * 64
    for st in ScalarType:
        try:
            scalar_type_to_dtype(int(st))
        except ValueError:
            continue
        table[int(st)] = int(st)
    return table


_ET_SCALAR_TYPES = _et_scalar_types()


def _slot_is_fixed(table: ValueTable, slot: int) -> bool:
    """Can the native core capture this slot's value at load time? Tensors (and lists of them)
    keep their identity while the method runs; other values must not change."""
    kind = table.kinds[slot]
    return kind in (TENSOR, TENSOR_LIST, OPT_TENSOR_LIST) or table.resolver(slot) is None


@dataclass
class KernelCall:
    """A torch kernel the native core calls itself: its operator, arguments (values at load), result tensor,
    the run-time ints patched into its arguments before each call, and the view operator it runs as."""

    name: str
    overload: str
    args: list
    result: object = None
    patches: list = field(default_factory=list)
    view: tuple[str, str] | None = None


def _native_kernel_args(entry, table: ValueTable, slots: list[int], ints: RunTimeInts) -> KernelCall | None:
    """The native call of a torch kernel, or None (its Python step runs it)."""
    from etlab.runtime._kernel_args import checks
    from etlab.runtime._torch_kernels import _resolve, _result_slot

    if entry.origin != "torch":
        return None
    op = _resolve(entry.name)
    schema = getattr(op, "_schema", None)
    if schema is None or len(slots) < len(schema.arguments):
        return None
    params = slots[: len(schema.arguments)]
    patches = ints.patches(schema, params)
    if patches is None:
        return None
    result = _result_slot(schema, table, slots)
    if result is not None and table.kinds[result] != TENSOR:
        return None  # a Python scalar result: the Python step stores it
    view = view_of(entry.name, table, params, bool(patches))
    if patches and view is None and checks(schema.name):
        return None  # its result's size is checked before each call: the Python step does it
    return KernelCall(schema.name, schema.overload_name, [table.values[s] for s in params],
                      None if result is None else table.values[result], patches, view)


def _direct_kernel_calls(entry, table: ValueTable, slots: list[int]):
    """The native form of the two direct kernels of `_direct_kernels` (same conditions, same calls):
    a list of (operator, overload, argument values, result) calls, the second an alternative chosen
    by `choose()` per thread count as the Python step does, or None."""
    from etlab.runtime._direct_kernels import _all_static

    if entry.origin != "builtin" or len(slots) < 10 or not all(_slot_is_fixed(table, s) for s in slots[:10]):
        return None
    v = [table.values[s] for s in slots[:10]]
    if not _all_static(table, slots[:10]):  # dynamic shapes: ATen's kernel as the Python step calls it (checked
        name, _, overload = entry.name.partition(".")  # at load, with every tensor at its upper bound)
        if entry.name in ("aten::_native_batch_norm_legit_no_training.out", "aten::convolution.out"):
            return [(name, overload, v, None), None]
        return None
    if entry.name == "aten::_native_batch_norm_legit_no_training.out":
        x, weight, bias, mean, var, momentum, eps, out, save_mean, save_invstd = v
        return [("aten::native_batch_norm", "out",
                 [x, weight, bias, mean, var, False, momentum, eps, out, save_mean, save_invstd], None), None]
    if entry.name != "aten::convolution.out":
        return None
    import torch

    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, out = v
    generic = ("aten::convolution", "out", v, None)
    select = getattr(torch._C, "_select_conv_backend", None)
    if (select is None or transposed or groups != 1 or x.dim() != 4 or any(d != 1 for d in dilation)
            or not (x.is_contiguous() and weight.is_contiguous() and out.is_contiguous())):
        return [generic, None]
    backend_args = (x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    slow2d = torch._C._ConvBackend.Slow2d
    direct = ("aten::thnn_conv2d", "out", [x, weight, list(weight.shape[2:]), bias, stride, padding, out], None)
    return [generic, (direct, lambda: select(*backend_args) == slow2d)]


native_small_products = True
"""Whether methods loaded from now on compute one-row float addmm/mm (a recurrent cell's matrix-vector
product) with the core's own kernel (`small.cpp`, ~1.5x MKL's speed through ATen there; its sums round a few
ulps apart from MKL's, within float tolerance of eager); tests holding the two cores to the same bits turn it off."""


native_lstm_cells = True
"""Whether methods loaded from now on compute each of Edge's decomposed LSTM cells as one native step in untraced
runs (`_lstm_cells`, `lstm.cpp`; within a few ulps of the decomposed steps); only with `native_small_products`
(whose products it shares) and never in a method that logs intermediate outputs."""


native_quant_kernels = True
"""Whether methods loaded from now on bind quantize/dequantize to quant.cpp's kernels; bench/quant.py
turns it off for its "before" column (the Python kernels, called back)."""


def _quant_kernel_call(entry, table: ValueTable, slots: list[int]):
    """The native form of a quantize/dequantize kernel of `_quant_kernels` (quant.cpp's operators, same
    arithmetic and checks) as (operator, overload, argument values, None), or None."""
    from etlab.runtime._quant_kernels import QUANT_KERNELS, native_call

    if not native_quant_kernels or entry.origin != "builtin" or entry.name not in QUANT_KERNELS:
        return None
    if not all(_slot_is_fixed(table, s) for s in slots):
        return None
    tensors = [s for s in slots if table.kinds[s] == TENSOR]
    static = all(table.is_static_shape(s) for s in tensors)
    call = native_call(entry.name, [table.values[s] for s in slots], static)
    return None if call is None else (*call, None)


def _set_view_copy(native, c: int, entry, table: ValueTable, slots: list[int]) -> None:
    """Makes the kernel just added a small copy (`small.h`) when it is a view-copy out-variant whose views
    can be worked out now: the view operator applied to the source itself, at load (static shapes only;
    the core checks at each run that the source still has the sizes and strides seen here)."""
    view = view_operator(entry.name)
    if view is None:
        return
    op, schema = view
    n = len(schema.arguments)
    params = slots[:n]
    if len(params) < n or any(table.kinds[s] == TENSOR and not table.is_static_shape(s) for s in params):
        return
    values = [table.values[s] for s in params]
    out = values[-1]  # the out argument (a tensor, or a list of them)
    args = [v for a, v in zip(schema.arguments[:-1], values) if not a.kwarg_only]
    kwargs = {a.name: v for a, v in zip(schema.arguments[:-1], values) if a.kwarg_only}
    try:
        views = op(*args, **kwargs)
    except (RuntimeError, IndexError, TypeError, ValueError):
        return  # ATen refuses the call as it stands: the kernel says why when it runs
    views = list(views) if isinstance(views, (list, tuple)) else [views]
    outs = list(out) if isinstance(out, list) else [out]
    try:
        native.set_view_copy(c, values[0], views, outs)
    except (ValueError, TypeError):
        pass  # not a copy the small kernel does (dtype, layout, size): ATen's kernel runs it


def _with_context(step: Step, context, info: StepInfo) -> Step:
    """A delegate step that first tells the delegate context which instruction runs (as run_traced does)."""
    chain, instruction = info.chain, info.instruction

    def delegate_step():
        context.chain, context.instruction = chain, instruction
        return step()

    return delegate_step


@dataclass
class NativeCore:
    """A method's plan run by the native core; `python_steps` counts the steps it calls back, by operator."""

    chains: list[BoundChain]
    plan: object  # _core.NativePlan
    python_steps: Counter = field(default_factory=Counter)
    name: str = "native"
    clock: object = _core.clock_ns  # perf_counter_ns's clock, read from the time-stamp counter

    def _failed(self, error: BaseException) -> StepFailed:
        return StepFailed(self.plan.failed_chain, self.plan.failed_index, error)

    def run(self) -> None:
        """One untraced execution in C++; a failure is re-raised as StepFailed with the chain and instruction the
        core reports."""
        try:
            self.plan.run()
        except Exception as e:
            raise self._failed(e) from e

    def run_timed(self) -> tuple[array, int]:
        """The record `_interpreter.run_timed` makes, as an array of int64 (not tracked by the collector),
        and the number of events it stands for."""
        try:
            raw, count = self.plan.run_timed()
        except Exception as e:
            raise self._failed(e) from e
        record = array("q")
        record.frombytes(raw)
        return record, count

    def trace_to(self, log, chains_key: int) -> None:
        """From now on every run is timed into `log` (a `_core.TraceLog`) as one run block, natively; with
        None, runs are plain again."""
        self.plan.set_trace_log(log, chains_key)

    def run_logged(self, bundled_input_index: int) -> None:
        """A run timed into the trace log (`trace_to`) as the run block of a bundled input."""
        try:
            self.plan.run_logged(bundled_input_index)
        except Exception as e:
            raise self._failed(e) from e

    def run_watched(self, tracer, key: int) -> tuple:
        """A run traced with allocation events only (no logged values, no delegate events: the watch started
        on this thread), kept as its step records: a WatchedRun event, expanded when the trace is written
        (building the events as it runs cost ~2% of a MobileNetV2 run)."""
        try:
            raw, _records, _dropped = self.plan.run_traced(tracer.debug_arena, [])
        except Exception as e:
            raise self._failed(e) from e
        steps = array("q")
        steps.frombytes(raw)
        return watched_run(key, steps, watched_count(self.chains, steps))

    def run_traced(self, events: list, tracer, context, watch=None) -> None:
        """`_interpreter.run_traced`: the same events in the same order; tensors are copied into the
        debug buffer natively, and the records become event tuples after the run. With `watch` (started
        on this thread), the native loop reads it around each step, as the Python loop does."""
        python_events: list = []
        if context is not None:
            context.events = python_events
        try:
            raw, records, dropped = self.plan.run_traced(tracer.debug_arena, python_events)
        except Exception as e:
            raise self._failed(e) from e
        if dropped:
            tracer.count_dropped(dropped)
        steps = array("q")
        steps.frombytes(raw)
        python_pos = record_pos = 0
        for k in range(0, len(steps), _STEP_FIELDS):
            c, pc, start, end, python_end, record_end, peak, kept = steps[k : k + _STEP_FIELDS]
            info = self.chains[c].infos[pc]
            events.extend(python_events[python_pos:python_end])
            python_pos = python_end
            for record in records[record_pos:record_end]:
                event = tracer.debug_event_of_record(info.chain, info.instruction, record)
                if event is not None:
                    events.append(event)
            record_pos = record_end
            if watch is not None:
                events.extend(step_memory_events(peak, kept, info.memory_label))
            events.extend(step_events(info, start, end))
        events.extend(python_events[python_pos:])


def watched_count(chains: list[BoundChain], steps) -> int:
    """The number of events a WatchedRun's step records stand for (counted with numpy: this runs per run)."""
    a = np.frombuffer(steps, dtype=np.int64).reshape(-1, _STEP_FIELDS)
    peak, kept = a[:, 6], a[:, 7]
    memory = int(np.count_nonzero(peak - np.maximum(kept, 0) > 0) + np.count_nonzero(kept))  # step_memory_events'
    if not any(chain.jumps for chain in chains):
        return memory + sum(chain.events_per_run for chain in chains)
    return memory + sum(chains[c].infos[pc].event_count for c, pc in a[:, :2].tolist())


def watched_events(chains: list[BoundChain], steps) -> list[tuple]:
    """The events of a WatchedRun: per step its allocation events, then its profile events."""
    events: list[tuple] = []
    for k in range(0, len(steps), _STEP_FIELDS):
        info = chains[steps[k]].infos[steps[k + 1]]
        events.extend(step_memory_events(steps[k + 6], steps[k + 7], info.memory_label))
        events.extend(step_events(info, steps[k + 2], steps[k + 3]))
    return events


def build_native_core(plan: P.ExecutionPlan, table: ValueTable, chains: list[BoundChain], kernels: dict,
                      context, tracer) -> NativeCore:
    """The native plan of a bound method (`chains` and `kernels` from `_binding.bind`)."""
    native = _core.NativePlan(Goto, table.values, _ET_SCALAR_TYPES)
    native.small_products = native_small_products
    core = NativeCore(chains, native)
    ints = run_time_ints(plan, table, kernels, chains)
    declare(native, ints)
    log = tracer is not None and tracer.logs_intermediates
    logged: set[int] = set()
    for c, (chain, bound) in enumerate(zip(plan.chains or [], chains)):
        native.add_chain(bound.jumps)
        for i, (instr, step, info) in enumerate(zip(chain.instructions or [], bound.steps, bound.infos)):
            if not _add_step(native, table, c, instr.instr_args, step, info, kernels, ints):
                _add_python_step(native, core, table, c, instr.instr_args, step, info, context, ints)
            if log:
                for slot in info.log_slots:
                    native.add_log(c, i, table.values[slot], slot)
                logged.update(info.log_slots)
        native.set_event_counts(c, [info.event_count for info in bound.infos])
    if native_lstm_cells and native_small_products and not log:  # logged runs keep every instruction's values
        add_cells(native, plan, table, chains, kernels)
    native.set_exported_ints(sorted(s for s in ints.kinds if s in logged or s in set(plan.outputs or [])))
    return core


def _add_kernel(native, c: int, call: KernelCall, entry, table: ValueTable, slots: list[int]) -> bool:
    """Adds a torch kernel's native call; False when the core cannot represent an argument (nothing added)."""
    try:
        native.add_kernel(c, call.name, call.overload, call.args, call.result)
    except (ValueError, TypeError, RuntimeError):
        return False
    if call.patches:
        native.set_int_patches(c, call.patches)
    if call.view is not None:
        native.set_view_of(c, *call.view)
    elif not call.patches:
        _set_view_copy(native, c, entry, table, slots)
    return True


def _add_step(native, table: ValueTable, c: int, args, step: Step, info: StepInfo, kernels: dict,
              ints: RunTimeInts) -> bool:
    """Adds the native step of an instruction; False when it runs as a Python step."""
    values = table.values
    if isinstance(args, P.KernelCall) and step in (folded_at_load, _nothing):  # computed at load: nothing to do
        native.add_nop(c, info.operator)
        return True
    if isinstance(args, P.KernelCall):
        entry, slots = kernels[info.operator], list(args.args or [])
        if (add_int_step(native, c, entry, slots, ints) or add_view_step(native, c, entry, slots, ints)
                or add_dim_order_copy(native, c, entry, slots, table)):
            return True
        call = _native_kernel_args(entry, table, slots, ints)
        if call is not None:
            return _add_kernel(native, c, call, entry, table, slots)
        call = _quant_kernel_call(entry, table, slots)
        calls = [call, None] if call is not None else _direct_kernel_calls(entry, table, slots)
        if calls is not None:
            try:
                native.add_kernel(c, *calls[0])
            except (ValueError, TypeError, RuntimeError):
                return False  # an argument the native core cannot represent: the Python step runs it
            if calls[1] is not None:
                (name, overload, values_, _), choose = calls[1]
                native.set_alternative(c, name, overload, values_, choose)
            return True
        return False
    if isinstance(args, P.MoveCall) and table.kinds[args.move_to] == TENSOR:
        native.add_move(c, values[args.move_to], values[args.move_from])
        return True
    if isinstance(args, P.FreeCall):
        native.add_free(c, values[args.value_index])
        return True
    if isinstance(args, P.JumpFalseCall) and table.kinds[args.cond_value_index] == TENSOR:
        native.add_jump(c, values[args.cond_value_index], args.destination_instruction)
        return True
    return False


def _add_python_step(native, core: NativeCore, table: ValueTable, c: int, args, step: Step, info: StepInfo,
                     context, ints: RunTimeInts) -> None:
    """The instruction's Python step, called back; the run-time ints it reads are published to it first."""
    if isinstance(args, P.DelegateCall) and context is not None:
        step = _with_context(step, context, info)
    core.python_steps[info.operator] += 1
    native.add_python(c, info.operator, step)
    reads = sorted(s for s in python_reads(args, table) if s in ints.kinds)
    if reads:
        native.set_sync(c, reads)
