"""The KV cache of a compiled LLM: its mutable buffers, from the memory plan.

An on-device LLM keeps its key/value cache as buffers the program writes in place (`k_cache[:, :,
input_pos] = k`): the compiler turns each into a BUFFER_MUTATION and plans it in an arena for the
whole method (`node.meta["mutable_buffer"]` on its placeholder in the planned graph). Every mutable
buffer is listed; those whose name says cache (`cache`, `past_key`, `past_value`) are the KV cache,
the others are other state (a position counter, a running statistic).

A program compiled with `share_mutable_buffers=True` (what `profile()` does for several methods) plans
each buffer once for all methods, in memory id 2 (`shared`): prefill and decode then hold one cache,
counted once in `program_kv_cache_bytes`; otherwise every method plans its own copy.

A model that passes its cache in and out as tensors (transformers' DynamicCache flattened, like the
corpus' llama_kv) has no mutable buffers: its cache is user inputs and outputs, and is not counted.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

import pandas as pd

KV_CACHE_NAME = re.compile(r"cache|past_key|past_value", re.IGNORECASE)


@dataclass
class StateBuffer:
    """One mutable buffer of one method, where the plan put it."""

    method: str
    buffer: str  # the module's buffer name (state_dict key)
    tensor: str  # the planned graph's placeholder (the `tensor` of memory_plan_dataframe)
    role: str  # "kv_cache" or "state"
    bytes: int
    mem_id: int | None
    offset: int | None
    dtype: str
    shape: tuple[int, ...]
    shared: bool = False  # one copy for all methods of the program (memory id 2 of a shared-state plan)


SHARED_MEM_ID, SHARED_PLAN_ARENAS = 2, 3  # upstream's share_mutable_buffers layout: [0, activations, state]


def _plans_shared_state(program_manager, method: str) -> bool:
    plan = getattr(program_manager, "memory_plans", {}).get(method)
    return plan is not None and len(plan.buffer_sizes) == SHARED_PLAN_ARENAS


def state_buffers(program_manager, method: str | None = None) -> list[StateBuffer]:
    """The mutable buffers of every method (or of `method`) of an ExecutorchProgramManager, in
    placeholder order."""
    methods = sorted(program_manager.methods) if method is None else [method]
    out = []
    for name in methods:
        if name not in program_manager.methods:
            raise ValueError(f"method {name!r} is not a method of the program; methods are "
                             f"{sorted(program_manager.methods)}")
        gm = program_manager.exported_program(name).graph_module
        shared_plan = _plans_shared_state(program_manager, name)
        for node in gm.graph.nodes:
            target = node.meta.get("mutable_buffer") if node.op == "placeholder" else None
            spec = node.meta.get("spec")
            if not target or spec is None:
                continue
            out.append(StateBuffer(
                method=name, buffer=str(target), tensor=node.name,
                role="kv_cache" if KV_CACHE_NAME.search(str(target)) else "state", bytes=int(spec.nbytes),
                mem_id=None if spec.mem_id is None else int(spec.mem_id),
                offset=None if spec.mem_offset is None else int(spec.mem_offset),
                dtype=str(spec.dtype).replace("torch.", ""), shape=tuple(int(d) for d in spec.shape),
                shared=shared_plan and spec.mem_id == SHARED_MEM_ID))
    return out


def kv_cache_dataframe(program_manager, method: str | None = None) -> pd.DataFrame:
    """`state_buffers` as a table; `df.attrs["kv_cache_bytes"]` per method (the KV cache each method
    sees) and `df.attrs["program_kv_cache_bytes"]` (the program's KV cache: a shared buffer once)."""
    rows = state_buffers(program_manager, method)
    df = pd.DataFrame([asdict(r) for r in rows], columns=[f.name for f in fields(StateBuffer)])
    df.attrs["kv_cache_bytes"] = {m: int(df[(df["method"] == m) & (df["role"] == "kv_cache")]["bytes"].sum())
                                  for m in (sorted(program_manager.methods) if method is None else [method])}
    kv = [r for r in rows if r.role == "kv_cache"]
    once = {r.buffer: r.bytes for r in kv if r.shared}
    df.attrs["program_kv_cache_bytes"] = sum(once.values()) + sum(r.bytes for r in kv if not r.shared)
    return df


def kv_cache_bytes(program_manager, method: str) -> int:
    """Bytes of the KV cache one method plans (0 when its cache is not mutable buffers)."""
    return sum(b.bytes for b in state_buffers(program_manager, method) if b.role == "kv_cache")


def with_kv_cache(plan: pd.DataFrame, program_manager, method: str) -> pd.DataFrame:
    """A memory_plan_dataframe() table with the method's KV-cache tensors named in its attrs
    (`kv_cache`: tensor names, `kv_cache_bytes`), for the memory view's KV-cache band. A program
    manager without a planned graph (a recorded one) leaves the table as it is."""
    try:
        buffers = [b for b in state_buffers(program_manager, method) if b.role == "kv_cache"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return plan
    plan.attrs["kv_cache"] = [b.tensor for b in buffers]
    plan.attrs["kv_cache_bytes"] = sum(b.bytes for b in buffers)
    return plan
