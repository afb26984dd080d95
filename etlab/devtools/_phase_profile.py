"""Profiling an LLM's prefill and decode in one call: `profile(model, {"prefill": ..., "decode": ...})`.

Exports each method, compiles them into one program with an ETRecord, then runs `iterations`
generations, each one prefill and `decode_steps` decode steps, with one ETDump over all of them,
and returns a `PhaseProfile`: the Inspector, the phases table (`etlab.inspector.phases`: per-token
latency p50/p90/p99 and tokens/s of decode, latency per prompt token of prefill), the KV cache the
program plans (`kv_cache_dataframe`) and the compiled program (for `show()`).

The methods share their mutable buffers (`MemoryPlanningPass(share_mutable_buffers=True)`, as
upstream's LLM exports do): decode reads the KV cache prefill wrote, so the values are a real
generation's, not only the timings; `share_mutable_buffers=False` gives each method its own copy.

A method's inputs are a tuple (the same every run) or a callable `step -> tuple` (step: the run's index
among that method's runs in its generation, from 0), so a decode step can advance its position:
`lambda i: (token, torch.tensor([8 + i]))`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm


@dataclass
class PhaseProfile:
    """What `profile()` returns for a model profiled per method (see module doc)."""

    inspector: object  # etlab.inspector.Inspector over the run
    phases: pd.DataFrame  # etlab.inspector.phases(inspector, program)
    kv_cache: pd.DataFrame  # etlab.devtools.kv_cache_dataframe(program)
    program: object  # the ExecutorchProgramManager
    workdir: Path  # model.pte, model.etrecord, run.etdp (and run.bin with debug=True)

    def show(self, method: str | None = None):
        """The dashboard of the run (its Phases tab shows this profile)."""
        return self.inspector.show(self.program, method=method or next(iter(sorted(self.program.methods))))

    def _repr_html_(self) -> str:
        return self.phases.to_html(index=False)


def _exported(model, method_inputs: Mapping[str, object]) -> dict[str, torch.export.ExportedProgram]:
    """One ExportedProgram per method, exported on that method's first inputs."""
    from etlab.models.corpus import MethodAsForward

    if isinstance(model, Mapping):
        missing = sorted(set(method_inputs) - set(model))
        if missing or not all(isinstance(ep, torch.export.ExportedProgram) for ep in model.values()):
            raise TypeError(f"model: a dict must map every method {sorted(method_inputs)} to an ExportedProgram"
                            + (f" (missing {missing})" if missing else ""))
        return {m: model[m] for m in method_inputs}
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module or a dict of ExportedPrograms, got {type(model).__name__}")
    out = {}
    with torch.no_grad():
        for method in method_inputs:
            if not callable(getattr(model, method, None)):
                raise ValueError(f"model {type(model).__name__} has no method {method!r}")
            target = model if method == "forward" else MethodAsForward(model, method)
            out[method] = torch.export.export(target, _inputs_at(method_inputs[method], method, 0))
    return out


def _inputs_at(spec, method: str, step: int) -> tuple:
    value = spec(step) if callable(spec) else spec
    if isinstance(value, torch.Tensor):
        return (value,)
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"inputs of {method!r} must be a tuple of the method's inputs or a callable step -> tuple, "
                        f"got {type(value).__name__}")
    return tuple(value)


def _schedule(methods: list[str], iterations: int, decode_steps: int) -> list[tuple[str, int]]:
    """The runs of one profile as (method, step within its generation): per generation, every
    non-decode method once (prefill first), then `decode_steps` decode steps."""
    decode = [m for m in methods if "decode" in m.lower()]
    others = sorted((m for m in methods if m not in decode), key=lambda m: "prefill" not in m.lower())
    one = [(m, 0) for m in others] + [(d, i) for i in range(decode_steps) for d in decode]
    return one * iterations


def profile_phases(model, method_inputs: Mapping[str, tuple | Callable[[int], tuple]], *, iterations: int = 1,
                   decode_steps: int = 8, debug: bool = False, workdir: str | os.PathLike | None = None,
                   progress: bool = True, tokens: Mapping[str, int] | None = None,
                   debug_buffer_size: int | None = None, share_mutable_buffers: bool = True) -> PhaseProfile:
    """See the module doc. tokens: tokens per run by method when the token-id input does not say.
    debug_buffer_size: bytes for intermediates with debug=True (default: the runtime sizes the buffer
    from the methods' plans and grows it with the runs; values that do not fit are counted)."""
    from etlab.compiler import ExecutorchBackendConfig, MemoryPlanningPass, to_edge
    from etlab.devtools._kv_cache import kv_cache_dataframe
    from etlab.inspector import Inspector, phases
    from etlab.runtime import DebugLevel, Runtime

    if not method_inputs:
        raise ValueError("inputs: give at least one method's inputs")
    for name, value in (("iterations", iterations), ("decode_steps", decode_steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    config = ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=share_mutable_buffers),
        emit_mutable_buffer_names=share_mutable_buffers)
    et = to_edge(_exported(model, method_inputs), generate_etrecord=True).to_executorch(config)
    out = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="etlab-profile-"))
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"workdir {os.fspath(out)!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    pte, etdump, debug_path = out / "model.pte", out / "run.etdp", out / "run.bin"
    et.write_to_file(pte)
    record = et.get_etrecord()  # saved for later sessions, given to the Inspector in memory
    record.save(out / "model.etrecord")
    runs = _schedule(list(method_inputs), iterations, decode_steps)
    level = DebugLevel.INTERMEDIATE_OUTPUTS if debug else DebugLevel.NO_LOGGING
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, etdump_debug_level=level,
                                         debug_buffer_size=debug_buffer_size if debug else 0)
    loaded = {m: program.load_method(m) for m in method_inputs}
    for m, step in tqdm(runs, desc="profile " + "+".join(method_inputs), unit="run", disable=not progress):
        loaded[m].execute(list(_inputs_at(method_inputs[m], m, step)))
    program.write_etdump_result_to_file(etdump, debug_path if debug else None)
    inspector = Inspector(etdump_path=etdump, etrecord=record, debug_buffer_path=debug_path if debug else None)
    return PhaseProfile(inspector, phases(inspector, et, tokens=tokens), kv_cache_dataframe(et), et, out)
