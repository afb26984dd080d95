"""Whether a run (.etdp) is of a program (.pte or ETRecord): the check behind the Inspector's
warning (or error, strict) and the JupyterLab extension's pairing of runs with programs.

A program's signature says, per method, which instructions call a kernel (K) and which a delegate
(D). A run matches when every call it logged sits on an instruction of the same kind, and, where the
program says which operator an instruction runs, the kernel the run logged there is that operator:
exactly for a .pte (its operator table), for an ETRecord by the operators of the graph nodes behind
the instruction's debug handles (most kernel calls must agree: a few kernels, such as a mutable
buffer's `copy_`, run under another op's handle).

Everything here reads the run's columns (`etlab.etdump.read_etdump`) and the program's facts; no
torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from etlab.errors import Error
from etlab.facts.program_info import MethodInfo, ProgramInfo
from etlab.schema.etdump import DELEGATE_CALL, OPERATOR_CALL, kernel_of_event
from etlab.schema.program import DelegateCall, KernelCall, PteFile

# Signature kinds: a kernel call and a delegate call, as the runtime logs them (OPERATOR_CALL / DELEGATE_CALL).
KERNEL, DELEGATE = "K", "D"
# An ETRecord's operators disagree with the run's kernels on more than this share of kernel calls: another program.
MAX_DISAGREEING_KERNELS = 0.25
_SMALL = 4096


class PairingError(Error, ValueError):
    """A run and a program that are not of the same program (the message says where they differ)."""


@dataclass
class RunCall:
    """A call a run logged: its block, chain, instruction, kind and, for kernels, the kernel's event name."""

    block: str
    chain: int
    instruction: int
    kind: str
    kernel: str | None = None


def op_label(op) -> str:
    """'aten::add.out' for a .pte's Operator entry (the name the runtime profiles it under, minus 'native_call_')."""
    return f"{op.name}.{op.overload}" if op.overload else str(op.name)


def pte_signature(pte: PteFile) -> dict[str, list[list]]:
    """Per method: [chain, instruction, K|D] of every kernel and delegate call (the join keys of a run)."""
    sig = {}
    for plan in pte.program.execution_plan or ():
        rows = []
        for c, chain in enumerate(plan.chains or ()):
            for i, ins in enumerate(chain.instructions or ()):
                if isinstance(ins.instr_args, KernelCall):
                    rows.append([c, i, KERNEL])
                elif isinstance(ins.instr_args, DelegateCall):
                    rows.append([c, i, DELEGATE])
        sig[str(plan.name)] = rows
    return sig


def program_signature(info: ProgramInfo) -> dict[str, list[list]]:
    """The signature of an ETRecord's program: its instruction -> debug handle map says which
    instructions call something, its delegate map which call a delegate."""
    sig = {}
    for method, m in info.methods.items():
        delegates = set(m.delegates)
        keys = set(m.instruction_debug_handles) | delegates
        sig[method] = [[c, i, DELEGATE if (c, i) in delegates else KERNEL] for c, i in sorted(keys)]
    return sig


def run_calls(cols) -> list[RunCall]:
    """Every distinct OPERATOR_CALL / DELEGATE_CALL a run logged (from `etlab.etdump.read_etdump`
    columns), in the order first logged, with the kernel event logged just before each OPERATOR_CALL."""
    codes = {c: i for i, c in enumerate(cols.strings)}
    op_code, del_code = codes.get(OPERATOR_CALL, -2), codes.get(DELEGATE_CALL, -2)
    rows = np.flatnonzero(cols.has_profile & (cols.chain_index >= 0)
                          & ((cols.name_code == op_code) | (cols.name_code == del_code)))
    if not len(rows):
        return []
    blocks = [r.name or "" for r in cols.runs]
    block_ids = {b: i for i, b in enumerate(dict.fromkeys(blocks))}
    block_of_run = np.array([block_ids[b] for b in blocks], dtype=np.int64)
    cols_ = (block_of_run[cols.run[rows]], cols.chain_index[rows], cols.instruction_id[rows],
             cols.name_code[rows] == op_code)
    # runs repeat the same calls: one row per call, in the order first logged
    if len(rows) < _SMALL:  # a dict beats numpy's row-wise unique on few calls
        seen: dict = {}
        for i, key in zip(rows.tolist(), zip(*(c.tolist() for c in cols_))):
            seen.setdefault(key, i)
        unique_rows = list(seen.values())
    else:
        keys = np.stack([c.astype(np.int64) for c in cols_], axis=1)
        _, first = np.unique(keys, axis=0, return_index=True)
        unique_rows = rows[np.sort(first)].tolist()
    u = np.asarray(unique_rows, dtype=np.int64)
    prev = np.maximum(u - 1, 0)
    kernel_code = np.where((u > 0) & (cols.run[prev] == cols.run[u]), cols.name_code[prev], -1).tolist()
    out = []
    for name, run, chain, ins, before in zip(cols.name_code[u].tolist(), cols.run[u].tolist(),
                                              cols.chain_index[u].tolist(), cols.instruction_id[u].tolist(),
                                              kernel_code):
        kind = KERNEL if name == op_code else DELEGATE
        kernel = kernel_of_event(cols.strings[before]) if kind == KERNEL and before >= 0 else None
        out.append(RunCall(blocks[run], chain, ins, kind, kernel))
    return out


def _method_for(block: str, methods: list[str]) -> str | None:
    """The method an event block ran (ProgramInfo.method_for_block's rule: its name, else forward, else
    the only one)."""
    if block in methods:
        return block
    if "forward" in methods:
        return "forward"
    return methods[0] if len(methods) == 1 else None


@functools.lru_cache(maxsize=4096)
def _op_base(name: str) -> str:
    """'convolution' for 'aten.convolution.default', 'aten::convolution.out' or 'convolution.out'."""
    name = name.split("::")[-1]
    parts = name.split(".")
    return parts[1] if len(parts) >= 3 else parts[0]


def _kernel_disagreement(calls: list[RunCall], methods: dict[str, MethodInfo], run_name: str,
                         program_name: str) -> str | None:
    """Where the run's kernels are not the ETRecord's operators (on more than MAX_DISAGREEING_KERNELS
    of the kernel calls whose instruction has recorded operators), the evidence; else None."""
    names = list(methods)
    compared, wrong = 0, []
    recorded: dict[tuple, set[str]] = {}  # (method, handles) -> their operators: once per handle set
    for call in calls:
        method = _method_for(call.block, names)
        if call.kernel is None or method is None:
            continue
        info = methods[method]
        handles = tuple(info.instruction_debug_handles.get((call.chain, call.instruction), ()))
        key = (method, handles)
        ops = recorded.get(key)
        if ops is None:
            ops = recorded[key] = {_op_base(op.op_type) for h in handles for op in info.ops.get(h, ())}
        if not ops:
            continue
        compared += 1
        if _op_base(call.kernel) not in ops:
            wrong.append((call, method, sorted(ops)))
    if not wrong or len(wrong) <= MAX_DISAGREEING_KERNELS * compared:
        return None
    call, method, ops = wrong[0]
    return (f"{run_name} does not match {program_name}: {len(wrong)} of {compared} kernel calls ran another "
            f"operator than the program records there, e.g. instruction {call.instruction} of {method!r} "
            f"records {', '.join(ops)} but the run called {call.kernel}; the run is of another program")


def _call_mismatch(call: RunCall, method: str, kinds: dict, plans: dict, run_name: str,
                   program_name: str) -> str | None:
    """Why `call` cannot be a call of `method` (None when it can)."""
    have = kinds[method].get((call.chain, call.instruction))
    if have is None:
        return (f"{run_name} does not match {program_name}: the run called instruction {call.instruction} "
                f"(chain {call.chain}) of {method!r}, which has no such call; the run is of another program")
    if have != call.kind:
        what = {KERNEL: "a kernel call", DELEGATE: "a delegate call"}
        return (f"{run_name} does not match {program_name}: instruction {call.instruction} of {method!r} is "
                f"{what[have]} in the program but the run logged {what[call.kind]} there; "
                "the run is of another program")
    if call.kernel and method in plans:
        plan = plans[method]
        ins = plan.chains[call.chain].instructions[call.instruction].instr_args
        ops = plan.operators or ()
        if isinstance(ins, KernelCall) and 0 <= ins.op_index < len(ops):
            want = op_label(ops[ins.op_index]).split("::")[-1]
            if want != call.kernel:
                return (f"{run_name} does not match {program_name}: instruction {call.instruction} of "
                        f"{method!r} runs {want} in the program but {call.kernel} in the run")
    return None


def run_mismatch(etdump, sig: dict[str, list[list]], *, run_name: str, program_name: str,
                 pte: PteFile | None = None, program: ProgramInfo | None = None) -> str | None:
    """Why a run (`read_etdump` columns) is not of the program with signature `sig` (None when it
    is). With the program's `pte`, each kernel call is checked against its operator table; with its
    ETRecord's `program` (a ProgramInfo), against the operators behind each instruction.

    A block named after a method (or the program's only method, or forward) is checked against that
    method; a block its name does not place (upstream's runtime and etlab's name every run "Execute")
    in a program of several methods must fit one of them."""
    calls = run_calls(etdump)
    if not calls:
        return None
    methods = list(sig)
    kinds = {m: {(c, i): k for c, i, k in rows} for m, rows in sig.items()}
    plans = {str(p.name): p for p in (pte.program.execution_plan or ())} if pte is not None else {}
    blocks: dict[str, list[RunCall]] = {}
    for call in calls:
        blocks.setdefault(call.block, []).append(call)
    for block, block_calls in blocks.items():
        method = _method_for(block, methods)
        candidates = [method] if method is not None else methods
        errors = []
        for candidate in candidates:
            error = next((e for c in block_calls
                          if (e := _call_mismatch(c, candidate, kinds, plans, run_name, program_name))), None)
            if error is None:
                break
            errors.append(error)
        else:
            if method is None:
                return (f"{run_name} does not match {program_name}: run block {block!r} fits none of its "
                        f"methods {methods}" + (f" (e.g. {errors[0].split(': ', 1)[-1]})" if errors else ""))
            return errors[0]
    if program is not None:
        return _kernel_disagreement(calls, dict(program.methods), run_name, program_name)
    return None
