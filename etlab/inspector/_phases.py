"""LLM-shaped profiles: the runs of a prefill method and of a decode method in one ETDump, as phases.

The runtime names every execution block "Execute" (upstream's ETDumpGen convention), so which method
a block ran is recovered from the program: a block's events carry instruction ids and kernel names
(`native_call_<op>.<overload>`), which must all agree with that method's instruction list in the
`.pte`. A block no method explains, or that several explain (structurally identical methods), is
left unattributed unless the caller names its method.

Per run, the latency is the block's `Method::execute` event. Tokens per run are the last dimension
of the method's first integer input (the token ids: 8 for a (1, 8) prompt, 1 for a decode step),
or what the caller says. A method is the prefill phase when its name says "prefill", decode when it
says "decode"; any other method is a phase of its own name.

`phase_runs` gives one row per run, `phases` one row per method: runs, tokens per run, latency
p50/p90/p99/mean, per-token latency p50/p90/p99 (latency / tokens), tokens/s (tokens over total
time): for decode the per-token distribution and throughput, for prefill the latency per prompt token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from etlab.inspector._events import TimeScale
from etlab.schema import program as P
from etlab.schema.etdump import METHOD_EXECUTE, kernel_event_name, kernel_of_event

EXECUTE = METHOD_EXECUTE
_INTEGER_TYPES = frozenset({P.ScalarType.LONG, P.ScalarType.INT, P.ScalarType.SHORT, P.ScalarType.CHAR,
                            P.ScalarType.BYTE})
RUN_COLUMNS = ["method", "phase", "block", "run", "tokens", "latency", "latency_per_token"]
PHASE_COLUMNS = ["method", "phase", "runs", "tokens_per_run", "latency_p50", "latency_p90", "latency_p99",
                 "latency_mean", "per_token_p50", "per_token_p90", "per_token_p99", "tokens_per_s"]


def phase_of(method: str) -> str:
    """"prefill" or "decode" when the method's name says so, else the method's name."""
    lowered = method.lower()
    for phase in ("prefill", "decode"):
        if phase in lowered:
            return phase
    return method


def _program(program) -> P.Program:
    """A schema Program from a Program, a .pte path or bytes, or a program manager (`executorch_program`)."""
    if isinstance(program, P.Program):
        return program
    inner = getattr(program, "executorch_program", None)
    if isinstance(inner, P.Program):
        return inner
    if isinstance(program, (str, os.PathLike, bytes, bytearray, memoryview)):
        from etlab.schema import load_pte

        return load_pte(program).program
    raise TypeError(f"program must be a .pte path or bytes, a schema Program or a compiled program manager, "
                    f"got {type(program).__name__}")


def _instruction_kernels(plan: P.ExecutionPlan) -> list[str | None]:
    """Per instruction of the method's first chain: the kernel event name it logs, None for others."""
    out: list[str | None] = []
    for ins in (plan.chains[0].instructions or []) if plan.chains else []:
        args = ins.instr_args
        if isinstance(args, P.KernelCall) and 0 <= args.op_index < len(plan.operators or []):
            op = plan.operators[args.op_index]
            out.append(kernel_event_name(f"{op.name}.{op.overload}" if op.overload else str(op.name)))
        else:
            out.append(None)
    return out


def _explains(kernels: list[str | None], block) -> bool:
    """Every kernel event of the block is the kernel the method runs at that instruction."""
    seen = False
    for e in block.events:
        name = str(e.name)
        if kernel_of_event(name) is None or e.instruction_id is None:
            continue
        seen = True
        if not 0 <= e.instruction_id < len(kernels) or kernels[e.instruction_id] != name:
            return False
    return seen


def block_methods(inspector, program, methods: Mapping[int, str] | Sequence[str] | None = None) -> list[str | None]:
    """The method each event block ran (None for the load block and for blocks no single method explains).

    methods: the caller's answer for some blocks, by block index (a mapping) or for every execution
    block in order (a sequence); it wins over the program's evidence.
    """
    plans = {p.name: _instruction_kernels(p) for p in _program(program).execution_plan or []}
    blocks = inspector.event_blocks
    exec_idx = [i for i, b in enumerate(blocks) if any(str(e.name) == EXECUTE for e in b.events)]
    given: dict[int, str] = {}
    if isinstance(methods, Mapping):
        given = {int(k): str(v) for k, v in methods.items()}
    elif methods is not None:
        if isinstance(methods, str) or len(methods) != len(exec_idx):
            raise ValueError(f"methods: expected one method name per execution block ({len(exec_idx)}), got "
                             f"{methods!r}")
        given = dict(zip(exec_idx, map(str, methods)))
    unknown = sorted(set(given.values()) - set(plans))
    if unknown:
        raise ValueError(f"methods: {unknown} are not methods of the program; methods are {sorted(plans)}")
    out: list[str | None] = []
    for i, block in enumerate(blocks):
        if i in given:
            out.append(given[i])
            continue
        if i not in exec_idx:
            out.append(None)
            continue
        matches = [m for m, kernels in plans.items() if _explains(kernels, block)]
        out.append(matches[0] if len(matches) == 1 else None)
    return out


def _tokens_per_run(plan: P.ExecutionPlan) -> int:
    """The last dimension of the method's first integer tensor input (token ids), 1 without one."""
    for idx in plan.inputs or []:
        value = plan.values[idx].val if 0 <= idx < len(plan.values or []) else None
        if isinstance(value, P.Tensor) and value.scalar_type in _INTEGER_TYPES and value.sizes:
            return max(int(value.sizes[-1]), 1)
    return 1


def phase_runs(inspector, program, *, tokens: Mapping[str, int] | None = None,
               methods: Mapping[int, str] | Sequence[str] | None = None) -> pd.DataFrame:
    """One row per execution run: method, phase, block index, run index in its block, tokens, latency
    and latency per token (in the Inspector's time unit, `df.attrs["unit"]`).

    tokens: tokens per run by method (default: from the method's token-id input, see module doc).
    methods: the method of some or all execution blocks (see `block_methods`)."""
    prog = _program(program)
    per_method_tokens = {p.name: _tokens_per_run(p) for p in prog.execution_plan or []}
    for name, n in (tokens or {}).items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"tokens[{name!r}] must be a positive int, got {n!r}")
        per_method_tokens[name] = n
    rows = []
    unit = None
    for b, (block, method) in enumerate(zip(inspector.event_blocks, block_methods(inspector, prog, methods))):
        if method is None:
            continue
        execute = next((e for e in block.events if str(e.name) == EXECUTE and e.perf_data is not None), None)
        if execute is None:
            continue
        if unit is None:
            unit = block.target_time_scale
        n = per_method_tokens.get(method, 1)
        for r, latency in enumerate(execute.perf_data.raw):  # already in the Inspector's time unit
            rows.append((method, phase_of(method), b, r, n, float(latency), float(latency) / n))
    df = pd.DataFrame(rows, columns=RUN_COLUMNS)
    df.attrs["unit"] = (unit or TimeScale.MS).value
    return df


_TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def phases(inspector, program, *, tokens: Mapping[str, int] | None = None,
           methods: Mapping[int, str] | Sequence[str] | None = None) -> pd.DataFrame:
    """One row per method (see module doc): runs, tokens per run, latency and per-token latency
    percentiles in the Inspector's time unit (`df.attrs["unit"]`), tokens/s (NaN when the unit is
    cycles). `df.attrs["runs"]` holds the `phase_runs` table it was computed from."""
    runs = phase_runs(inspector, program, tokens=tokens, methods=methods)
    unit = runs.attrs["unit"]
    to_s = _TO_SECONDS.get(unit)
    rows = []
    for method, group in runs.groupby("method", sort=False):
        lat = group["latency"].to_numpy(dtype=float)
        per = group["latency_per_token"].to_numpy(dtype=float)
        total = float(lat.sum())
        tps = float(group["tokens"].sum()) / (total * to_s) if to_s and total > 0 else float("nan")
        rows.append((method, phase_of(method), len(group), int(group["tokens"].iloc[0]),
                     *np.percentile(lat, [50, 90, 99]).tolist(), float(lat.mean()),
                     *np.percentile(per, [50, 90, 99]).tolist(), tps))
    df = pd.DataFrame(rows, columns=PHASE_COLUMNS)
    df.attrs["unit"] = unit
    df.attrs["runs"] = runs
    return df
