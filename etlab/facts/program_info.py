"""What the Inspector takes from an ETRecord: per method, the runtime -> debug handle maps and the
graph nodes behind each debug handle.

Defined here, below the Inspector, so that `ETRecord.program_info()` can build it without
importing `etlab.inspector` (a lower layer never imports a higher one).

Runtime events carry (chain index, instruction id) and, inside delegates, a delegate debug
identifier; a `MethodInfo` maps those to debug handles, and debug handles to the graph nodes (op
type, stack trace, module hierarchy) they came from. The compiler emits every method as one chain
(torch.cond branches are inlined into it), so chain index is 0 for programs compiled by etlab.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DebugHandle = tuple[int, ...]


@dataclass
class OpInfo:
    """A node of the recorded (edge-dialect) graph that carries a debug handle."""

    name: str                          # node name, e.g. "aten_linear_default"
    op_type: str                       # operator, e.g. "aten.linear.default"
    stack_trace: str | None = None     # where the user's code created it
    # torch.export's nn_module_stack: key -> (module path, module type), outermost first
    module_hierarchy: dict[str, tuple[str, str]] | None = None


@dataclass
class DelegateInfo:
    """A lowered module called by one instruction: its backend and its own debug map."""

    backend_name: str
    # delegate debug identifier (int or str, as the backend logs it) -> debug handles it covers
    debug_handles: Mapping[int | str, DebugHandle] = field(default_factory=dict)


@dataclass
class MethodInfo:
    """One method of the program."""

    # (chain index, instruction id) -> debug handles of the graph nodes the instruction runs
    instruction_debug_handles: Mapping[tuple[int, int], DebugHandle] = field(default_factory=dict)
    # (chain index, instruction id) -> its debug handles as recorded, a handle repeated once per node of
    # it the instruction runs (upstream's Inspector lists an op type per occurrence); optional
    instruction_handle_occurrences: Mapping[tuple[int, int], DebugHandle] = field(default_factory=dict)
    # (chain index, instruction id) -> number of outputs (delegate calls may have several)
    instruction_num_outputs: Mapping[tuple[int, int], int] = field(default_factory=dict)
    # (chain index, instruction id) of each delegate call -> that delegate
    delegates: Mapping[tuple[int, int], DelegateInfo] = field(default_factory=dict)
    # debug handle -> graph nodes carrying it
    ops: Mapping[int, list[OpInfo]] = field(default_factory=dict)
    # expected outputs per bundled input index (for EventBlock.reference_output)
    reference_outputs: list[list] | None = None
    # intermediate outputs of the recorded graph on the recorded inputs, keyed by debug handle;
    # a callable is called (once) only when calculate_numeric_gap needs them
    aot_intermediate_outputs: Mapping[DebugHandle, Any] | Callable[[], Mapping[DebugHandle, Any]] | None = None


@dataclass
class ProgramInfo:
    """Everything the Inspector takes from an ETRecord, per method name."""

    methods: dict[str, MethodInfo] = field(default_factory=dict)
    # named graphs (e.g. "edge_dialect_exported_program") for Inspector.get_exported_program;
    # an ETRecord read from a file rebuilds a graph only when it is looked up
    graphs: Mapping[str, Any] = field(default_factory=dict)

    def method_for_block(self, block_name: str) -> MethodInfo | None:
        """The method an event block ran: its name if that is a method, else "forward", else the only one."""
        if block_name in self.methods:
            return self.methods[block_name]
        if "forward" in self.methods:
            return self.methods["forward"]
        return next(iter(self.methods.values())) if len(self.methods) == 1 else None
