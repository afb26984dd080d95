"""Profiling and debugging in one call: export, compile with an ETRecord, run with an ETDump
that keeps every intermediate output, and hand back the Inspector that joins them."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm


def _as_inputs(inputs) -> tuple:
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if not isinstance(inputs, Sequence) or isinstance(inputs, (str, bytes)):
        raise TypeError(f"inputs must be a tuple or list of the model's inputs, got {type(inputs).__name__}")
    return tuple(inputs)


def profile(model, inputs, *, iterations: int = 10, debug: bool = True, method_name: str = "forward",
            partitioner=None, workdir: str | os.PathLike | None = None, debug_buffer_size: int | None = None,
            progress: bool = True, decode_steps: int = 8):
    """Exports `model` on `inputs`, compiles it with an ETRecord, runs it `iterations` times with
    ETDump on, and returns an `etlab.inspector.Inspector` over the result.

    debug: also record every intermediate output (the debug buffer), for `calculate_numeric_gap`
    and the events' debug_data. partitioner: a partitioner or list of them (delegation with
    `to_edge_transform_and_lower`). workdir: where model.pte, model.etrecord, run.etdp and
    run.bin go (default: a new temporary directory, left in place for the Inspector to read).
    debug_buffer_size: bytes for intermediates (default: the runtime sizes the buffer from the
    method's plan, growing it with the runs; values that do not fit are counted and reported).
    method_name: the method of an exported program to run (a module exports as "forward").
    inputs per method ({"prefill": ..., "decode": ...}): an LLM's phases, `iterations` generations of
    one prefill and `decode_steps` decode steps in one ETDump (see `_phase_profile`); returns a PhaseProfile.

    >>> import tempfile, torch
    >>> class AddMul(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return x * y + x
    >>> with tempfile.TemporaryDirectory() as workdir:
    ...     inspector = profile(AddMul(), (torch.ones(2, 2), torch.full((2, 2), 3.0)), iterations=3,
    ...                         progress=False, workdir=workdir)
    ...     ops = sorted(e for e in inspector.to_dataframe()["event_name"] if e.startswith("native_call_"))
    ...     gap = inspector.calculate_numeric_gap()
    >>> ops  # the kernels the runtime ran, timed over the 3 runs
    ['native_call_add.out', 'native_call_mul.out']
    >>> [(ops, [float(x) for x in g]) for ops, g in zip(gap["aot_ops"], gap["gap"])]  # eager vs runtime, per op
    [(['mul'], [0.0]), (['add'], [0.0])]
    """
    if isinstance(inputs, Mapping):
        from etlab.devtools._phase_profile import profile_phases

        return profile_phases(model, inputs, iterations=iterations, decode_steps=decode_steps, debug=debug,
                              workdir=workdir, progress=progress, debug_buffer_size=debug_buffer_size)
    from etlab.compiler import to_edge, to_edge_transform_and_lower
    from etlab.etrecord import ETRecord
    from etlab.inspector import Inspector
    from etlab.runtime import DebugLevel, Runtime

    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
        raise ValueError(f"iterations must be a positive int, got {iterations!r}")
    if debug_buffer_size is not None and (not isinstance(debug_buffer_size, int) or debug_buffer_size < 0):
        raise ValueError(f"debug_buffer_size must be a non-negative int or None, got {debug_buffer_size!r}")
    args = _as_inputs(inputs)
    if isinstance(model, torch.export.ExportedProgram):
        exported = model
    elif isinstance(model, torch.nn.Module):
        exported = torch.export.export(model, args)
    else:
        raise TypeError(f"model must be a torch.nn.Module or an ExportedProgram, got {type(model).__name__}")

    if partitioner is None:
        edge = to_edge(exported, generate_etrecord=True)
    else:
        edge = to_edge_transform_and_lower(exported, partitioner=partitioner, generate_etrecord=True)
    et = edge.to_executorch()
    if method_name not in et.methods:
        raise ValueError(f"method_name {method_name!r} is not a method of the program; "
                         f"methods are {sorted(et.methods)}")

    out = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="etlab-profile-"))
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"workdir {os.fspath(out)!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    pte_path, etrecord_path = out / "model.pte", out / "model.etrecord"
    etdump_path, debug_path = out / "run.etdp", out / "run.bin"
    et.write_to_file(pte_path)
    # The run's inputs are the representative inputs: the numeric gap re-runs the graph on them. The file is
    # for later sessions; the Inspector gets the record in memory (its graphs live, nothing parsed back).
    record = ETRecord.from_sources(et.get_etrecord(), representative_inputs=list(args))
    record.save(etrecord_path)

    level = DebugLevel.INTERMEDIATE_OUTPUTS if debug else DebugLevel.NO_LOGGING
    program = Runtime.get().load_program(et.buffer, enable_etdump=True, etdump_debug_level=level,
                                         debug_buffer_size=debug_buffer_size if debug else 0)
    method = program.load_method(method_name)
    for _ in tqdm(range(iterations), desc=f"profile {method_name}", unit="run", disable=not progress):
        method.execute(list(args))
    program.write_etdump_result_to_file(etdump_path, debug_path if debug else None)
    return Inspector(etdump_path=etdump_path, etrecord=record, debug_buffer_path=debug_path if debug else None)
