"""Where the views find their graphs: a program manager, an exported program, an Inspector with an
ETRecord, or the ETRecord itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.export import ExportedProgram
from torch.fx import GraphModule

# Names a recorded graph may have in ProgramInfo.graphs / an ETRecord's graph map, per kind.
GRAPH_KEYS = {
    "aten": ("exported_program", "aten_dialect_program", "base", "aten"),
    "edge": ("edge_dialect_exported_program", "edge_dialect_program", "edge"),
    "runtime": ("et_dialect_graph_module", "et_dialect_program", "executorch_program", "runtime"),
}


@dataclass
class ProgramSources:
    """The graphs of one method at each stage (None where not available), and what gave them."""

    method: str = "forward"
    aten: ExportedProgram | GraphModule | None = None
    edge: ExportedProgram | GraphModule | None = None
    runtime: ExportedProgram | GraphModule | None = None
    manager: Any = None  # ExecutorchProgramManager
    inspector: Any = None  # etlab.inspector.Inspector

    def available(self) -> list[str]:
        """The graph kinds present, in pipeline order ('aten', 'edge', 'runtime'): what a GraphView can show."""
        return [k for k in ("aten", "edge", "runtime") if getattr(self, k) is not None]

    def graph(self, kind: str):
        """The graph of one kind; a ValueError that lists the kinds present and says what would provide the missing one
        (an ETRecord, to_executorch())."""
        g = getattr(self, kind, None) if kind in ("aten", "edge", "runtime") else None
        if g is None:
            have = self.available()
            raise ValueError(f"no {kind!r} graph here; available: {have or 'none'}. The ATen graph needs "
                             "to_edge(..., generate_etrecord=True); the runtime graph an ExecutorchProgramManager "
                             "(to_executorch()) or an ETRecord that records it")
        return g

    def instruction_handles(self) -> dict[int, tuple[int, ...]]:
        """Instruction id -> debug handles, from the program manager when there is one."""
        if self.manager is None:
            return {}
        table = (getattr(self.manager, "debug_handle_map", None) or {}).get(self.method, {})
        return {int(k): tuple(int(h) for h in v) for k, v in table.items()}


def _is_inspector(obj) -> bool:
    return hasattr(obj, "event_blocks") and hasattr(obj, "to_dataframe")


def _is_et_manager(obj) -> bool:
    return callable(getattr(obj, "exported_program", None)) and hasattr(obj, "memory_plans")


def _is_edge_manager(obj) -> bool:
    return callable(getattr(obj, "exported_program", None)) and callable(getattr(obj, "to_executorch", None))


def _pick(mapping, method: str, keys) -> Any:
    if not mapping:
        return None
    for key in keys:
        for k in (f"{key}/{method}", key):
            v = mapping.get(k)
            if isinstance(v, dict):
                v = v.get(method)
            if v is not None:
                return v
    return None


def _from_recorded(obj, method: str, out: ProgramSources) -> None:
    """Graphs of an ETRecord-like object (attributes or a graph map) or a ProgramInfo (.graphs)."""
    graphs = getattr(obj, "graphs", None) or getattr(obj, "graph_map", None) or {}
    for kind, keys in GRAPH_KEYS.items():
        g = _pick(graphs, method, keys)
        if g is None:
            for attr in keys:
                v = getattr(obj, attr, None)
                v = v.get(method) if isinstance(v, dict) else v
                if isinstance(v, (ExportedProgram, GraphModule)):
                    g = v
                    break
        if g is not None and getattr(out, kind) is None:
            setattr(out, kind, g)


def resolve_sources(obj, method: str = "forward", inspector=None) -> ProgramSources:
    """ProgramSources of `obj`: an ExecutorchProgramManager, EdgeProgramManager, ExportedProgram,
    GraphModule, Inspector (its ETRecord's graphs), ETRecord or ProgramInfo."""
    out = ProgramSources(method=method, inspector=inspector)
    if _is_inspector(obj):
        out.inspector = obj
        program = obj.program_info  # from its ETRecord (None without one)
        if program is not None:
            _from_recorded(program, method, out)
        if out.edge is None and callable(getattr(obj, "get_exported_program", None)):
            out.edge = obj.get_exported_program()
        if out.edge is None and out.aten is None and out.runtime is None:
            raise ValueError("this Inspector has no graphs: create it with an etrecord (or pass the program "
                             "manager and inspector=...)")
        return out
    if _is_et_manager(obj):
        out.manager = obj
        if method not in obj.methods:
            raise ValueError(f"no method {method!r}; methods are {sorted(obj.methods)}")
        out.runtime = obj.exported_program(method)
        edge_mgr = obj.edge_program_manager  # the EdgeProgramManager it was compiled from
        out.edge = edge_mgr.exported_program(method)
        out.aten = edge_mgr.aten_programs.get(method)
        return out
    if _is_edge_manager(obj):
        out.edge = obj.exported_program(method)
        out.aten = obj.aten_programs.get(method)
        return out
    if isinstance(obj, (ExportedProgram, GraphModule)):
        out.edge = out.aten = obj  # one graph, shown as whichever kind is asked for
        return out
    _from_recorded(obj, method, out)
    if out.available():
        return out
    raise TypeError("expected an ExecutorchProgramManager, EdgeProgramManager, ExportedProgram, GraphModule, "
                    f"Inspector or ETRecord; got {type(obj).__name__}")
