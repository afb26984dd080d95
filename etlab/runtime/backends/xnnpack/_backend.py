"""The object registered under "XnnpackBackend" with the runtime's backend registry."""

from __future__ import annotations

from typing import ClassVar

from etlab.runtime._delegate import BackendInitContext
from etlab.runtime._registry import register_backend  # not `etlab.runtime`: it imports the backends
from etlab.runtime.backends.xnnpack import _native_plan as native_plan
from etlab.runtime.backends.xnnpack._fast import prepare, run_prepared
from etlab.runtime.backends.xnnpack._graph import BACKEND_ID, XnnpackPlan, build_plan, run_plan
from etlab.schema.xnnpack import deserialize_xnnpack


class XnnpackBackendRuntime:
    """init: decode + check + plan the blob (constants may live in the program's named data);
    execute: run the plan. A plan holds no per-call state, so one may run on several threads."""

    takes_init_context = True  # init receives a BackendInitContext (the program's named data)
    # trace_allocations: what init keeps (packed filters, constants) and what a call takes (its values)
    memory_names: ClassVar[dict[str, str]] = {"init": "packed_weights", "execute": "workspace"}

    def init(self, processed: memoryview, compile_specs: list[tuple[str, bytes]],
             context: BackendInitContext | None = None) -> XnnpackPlan:
        """Decodes the XNNPACK payload, checks it and plans its nodes (constants from the payload or the program's
        named data), once at load."""
        what = f"{BACKEND_ID} delegate" if context is None else f"{BACKEND_ID} delegate {context.delegate_index}"
        blob = deserialize_xnnpack(processed, what=what)
        plan = build_plan(blob, context.named_data if context is not None else {}, what)
        plan.steps = prepare(plan)
        plan.native, plan.native_timed = native_plan.build(plan), native_plan.build(plan, fuse=False)
        return plan

    def execute(self, handle: XnnpackPlan, args: list, context=None) -> None:
        """Untraced: the native loop, else the prepared steps (`_fast`); traced without values: the timed native
        loop, one event per node; traced with values (or arguments the loops do not take): node by node in Python,
        one event and value each."""
        if context is None or not getattr(context, "enabled", True):
            if handle.native is None or handle.native.run(args) is None:
                run_prepared(handle, handle.steps, args)
            return
        if (not getattr(context, "logs_values", True) and handle.native_timed is not None
                and hasattr(context, "log_profiling_delegate")):  # a context of spans timed by the backend
            times = handle.native_timed.run(args, True)
            if times is not None:
                native_plan.profile_events(handle, times, context)
                return
        run_plan(handle, args, context)


XNNPACK_BACKEND = XnnpackBackendRuntime()
register_backend(BACKEND_ID, XNNPACK_BACKEND)
