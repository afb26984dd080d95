"""Binding: turns a plan's instructions into steps the interpreter runs.

Two passes over the chains. The first finds each KernelCall's kernel (a missing one fails the
load, naming the operator) and learns which slots change while the method runs: scalars the
kernels write, move targets, views of caller memory. The second binds every instruction to a
zero-argument step with its arguments resolved, so the loop itself does no lookups.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from etlab.facts.memory_events import TEMP
from etlab.runtime._delegate import NULL_CONTEXT, LoadedDelegate
from etlab.runtime._errors import LoadError
from etlab.runtime._interpreter import BoundChain, Goto, Step, StepInfo
from etlab.runtime._load_fold import fold_if_constant, plan_writers
from etlab.runtime._lookup import find_kernel, missing_kernel_message
from etlab.runtime._registry import KernelEntry, Site, operator_key
from etlab.runtime._values import TENSOR, ValueTable
from etlab.schema import program as P
from etlab.schema.etdump import DELEGATE_CALL, kernel_event_name


@dataclass
class BoundPlan:
    """A method bound for execution: its chains of ready-to-call steps and, per operator, the kernel chosen for it
    (what `Method.kernels` reports)."""

    chains: list[BoundChain]
    kernels: dict[str, KernelEntry]  # operator name -> the kernel used


def _kernel_for(plan: P.ExecutionPlan, call: P.KernelCall, site: Site, kernels: dict) -> KernelEntry:
    ops = plan.operators or []
    if not 0 <= call.op_index < len(ops):
        raise LoadError(f"{site}: operator index {call.op_index} is outside the operator table ({len(ops)} entries)")
    op = ops[call.op_index]
    name = operator_key(op.name or "", op.overload)
    if name not in kernels:
        entry = find_kernel(name)
        if entry is None:
            raise LoadError(f"{site}: {missing_kernel_message(name)}")
        kernels[name] = entry
    return kernels[name]


def _instructions(plan: P.ExecutionPlan):
    for c, chain in enumerate(plan.chains or []):
        for i, instr in enumerate(chain.instructions or []):
            yield c, i, instr.instr_args


def classify(plan: P.ExecutionPlan, table: ValueTable, what: str) -> dict[str, KernelEntry]:
    """First pass: resolves kernels and marks dynamic and rebound slots in `table`."""
    kernels: dict[str, KernelEntry] = {}
    views: list[tuple[KernelEntry, list[int]]] = []
    for slot in plan.inputs or []:
        table.check_slot(slot, f"{what}: input")
        if table.kinds[slot] != TENSOR:
            table.dynamic.add(slot)
    for c, i, args in _instructions(plan):
        site = Site(table.method, c, i)
        if isinstance(args, P.KernelCall):
            entry = _kernel_for(plan, args, site, kernels)
            slots = list(args.args or [])
            for s in slots:
                table.check_slot(s, str(Site(table.method, c, i, entry.name)))
            result = entry.result_slot(table, slots)
            if result is not None:
                table.dynamic.add(result)
            if entry.rebinds is not None:
                views.append((entry, slots))
        elif isinstance(args, P.MoveCall):
            for s in (args.move_from, args.move_to):
                table.check_slot(s, f"{site}: MoveCall")
            if table.kinds[args.move_to] == TENSOR:
                table.rebound.add(args.move_to)
            else:
                table.dynamic.add(args.move_to)
        elif isinstance(args, P.FreeCall):
            table.check_slot(args.value_index, f"{site}: FreeCall")
            table.rebound.add(args.value_index)
        elif args is None:
            raise LoadError(f"{site}: instruction has no arguments")
    # A view of memory that moves is re-pointed each run too (to a fixpoint: views of views).
    changed = True
    while changed:
        before = len(table.rebound)
        for entry, slots in views:
            if slots and slots[0] in table.rebound:
                table.rebound.update(entry.rebinds(table, slots))
        changed = len(table.rebound) != before
    return kernels


def dynamic_scratch(plan: P.ExecutionPlan, table: ValueTable) -> list[int]:
    """Dynamic-shape tensors each run writes before it reads them (kernel results).

    The method empties them before every run: torch then resizes them to the run's shapes
    silently, instead of warning that it resizes a non-empty output.
    """
    seen: set[int] = set(plan.inputs or [])
    scratch = []
    for _c, _i, args in _instructions(plan):
        slots = list(getattr(args, "args", None) or [])
        if isinstance(args, P.KernelCall) and slots:
            last = slots[-1]
            results = table.list_members.get(last, [last]) if table.kinds[last] != TENSOR else [last]
            for s in results:
                if (s not in seen and table.kinds[s] == TENSOR and s not in table.rebound
                        and table.specs[s].shape_dynamism != P.TensorShapeDynamism.STATIC):
                    scratch.append(s)
        seen.update(slots)
        seen.update(s for s in (getattr(args, "move_from", None), getattr(args, "move_to", None)) if s is not None)
    return list(dict.fromkeys(scratch))


def _resolved_args(table: ValueTable, slots: list[int]):
    static = [table.values[s] for s in slots]
    dynamic = [(k, r) for k, s in enumerate(slots) if (r := table.resolver(s)) is not None]
    return static, dynamic


def _delegate_step(loaded: LoadedDelegate, table: ValueTable, slots: list[int], context) -> Step:
    static, dynamic = _resolved_args(table, slots)
    execute, handle = loaded.backend.execute, loaded.handle
    if not dynamic:
        def call_static() -> None:  # a fresh list: backends may keep or edit it; nothing returned (no Goto)
            execute(handle, list(static), context)

        return call_static

    def step():
        call = list(static)
        for k, get in dynamic:
            call[k] = get()
        execute(handle, call, context)

    return step


def _move_step(table: ValueTable, src: int, dst: int) -> Step:
    values = table.values
    if table.kinds[dst] == TENSOR:
        if table.kinds[src] != TENSOR:
            raise LoadError(f"method {table.method!r}: MoveCall from value {src} ({table.kinds[src]}) "
                            f"into tensor value {dst}")
        return functools.partial(values[dst].set_, values[src])
    get = table.resolver(src)

    def step():
        values[dst] = get() if get is not None else values[src]

    return step


def _jump_step(table: ValueTable, cond: int, destination: int) -> Step:
    values = table.values
    dest = Goto(destination)
    if table.kinds[cond] == TENSOR:
        t = values[cond]
        return lambda: None if bool(t.all()) else dest
    if cond in table.dynamic:
        return lambda: None if values[cond] else dest
    if table.kinds[cond] != "Bool":
        raise LoadError(f"method {table.method!r}: JumpFalseCall condition value {cond} is a {table.kinds[cond]}, "
                        f"expected Bool or a bool tensor")
    return (lambda: None) if values[cond] else (lambda: dest)


def bind(plan: P.ExecutionPlan, table: ValueTable, kernels: dict[str, KernelEntry],
         delegates: list[LoadedDelegate], context=NULL_CONTEXT) -> BoundPlan:
    """Second pass: one step per instruction."""
    chains: list[BoundChain] = []
    writers = plan_writers(plan, table, kernels)  # constant instructions are computed now (`_load_fold`)
    for c, chain in enumerate(plan.chains or []):
        steps, infos, jumps = [], [], False
        n = len(chain.instructions or [])
        for i, instr in enumerate(chain.instructions or []):
            args = instr.instr_args
            site = Site(table.method, c, i)
            if isinstance(args, P.KernelCall):
                entry = _kernel_for(plan, args, site, kernels)
                site = Site(table.method, c, i, entry.name)
                slots = list(args.args or [])
                try:
                    steps.append(fold_if_constant(entry, table, slots, entry.bind(table, slots, site), writers, (c, i)))
                except LoadError:
                    raise
                except Exception as e:
                    raise LoadError(f"{site}: cannot bind kernel: {e}") from e
                if entry.traced_outputs is None:  # primitive operator: OPERATOR_CALL only, nothing logged
                    infos.append(StepInfo("kernel", c, i, None, operator=entry.name))
                else:
                    infos.append(StepInfo("kernel", c, i, kernel_event_name(entry.name),
                                          entry.traced_outputs(table, slots), operator=entry.name))
            elif isinstance(args, P.DelegateCall):
                if not 0 <= args.delegate_index < len(delegates):
                    raise LoadError(f"{site}: delegate index {args.delegate_index} is outside the plan's "
                                    f"{len(delegates)} delegates")
                slots = list(args.args or [])
                for s in slots:
                    table.check_slot(s, f"{site}: DelegateCall")
                steps.append(_delegate_step(delegates[args.delegate_index], table, slots, context))
                loaded = delegates[args.delegate_index]
                infos.append(StepInfo("delegate", c, i, DELEGATE_CALL, tuple(slots),
                                      operator=f"delegate {loaded.backend_id}",
                                      memory_label=loaded.memory_name("execute") or TEMP))
            elif isinstance(args, P.MoveCall):
                steps.append(_move_step(table, args.move_from, args.move_to))
                infos.append(StepInfo("move", c, i, "MOVE_CALL"))
            elif isinstance(args, P.JumpFalseCall):
                table.check_slot(args.cond_value_index, f"{site}: JumpFalseCall")
                if not 0 <= args.destination_instruction <= n:
                    raise LoadError(f"{site}: jump destination {args.destination_instruction} is outside the chain "
                                    f"({n} instructions)")
                if args.destination_instruction <= i:  # a loop: a file could make execute() run forever
                    raise LoadError(f"{site}: jump back to instruction {args.destination_instruction}; programs "
                                    "with loops are not supported (ExecuTorch emits forward jumps only)")
                steps.append(_jump_step(table, args.cond_value_index, args.destination_instruction))
                infos.append(StepInfo("jump", c, i, "JF_CALL"))
                jumps = True
            elif isinstance(args, P.FreeCall):
                if table.kinds[args.value_index] != TENSOR:
                    raise LoadError(f"{site}: FreeCall of value {args.value_index}, a {table.kinds[args.value_index]}")
                steps.append(table.values[args.value_index].set_)
                infos.append(StepInfo("free", c, i, "FREE_CALL"))
            else:
                raise LoadError(f"{site}: unsupported instruction {type(args).__name__}")
        chains.append(BoundChain(steps, infos, jumps))
    return BoundPlan(chains, kernels)
