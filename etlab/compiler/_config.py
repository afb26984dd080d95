"""Options for the two compile stages: to_edge (EdgeCompileConfig) and to_executorch (ExecutorchBackendConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EdgeCompileConfig:
    """How `to_edge` lowers an exported program to the Edge dialect.

    _check_ir_validity: verify every op is core ATen (or allowed below) with runtime-supported dtypes.
    _core_aten_ops_exception_list: non-core aten ops accepted as-is (the runtime must have kernels).
    _preserve_ops: ops kept undecomposed even when a core decomposition exists.
    _preserve_node: None, or a predicate node -> bool (a partitioner's `ops_to_not_decompose` filter):
    a node of a `_preserve_ops` op is then kept whole only where it holds and decomposed elsewhere.
    _skip_dim_order: keep aten.clone/_to_copy instead of the dim_order_ops variants.
    """

    _check_ir_validity: bool = True
    _core_aten_ops_exception_list: list[Any] = field(default_factory=list)
    _preserve_ops: list[Any] = field(default_factory=list)
    _preserve_node: Any = None
    _skip_dim_order: bool = False


def _default_memory_planning_pass():
    from etlab.compiler._memory_planning import MemoryPlanningPass

    return MemoryPlanningPass()


@dataclass
class ExecutorchBackendConfig:
    """How `to_executorch` plans memory and lays out the .pte.

    constant_tensor_alignment / delegate_alignment: byte alignment of each constant inside the
    constant segment and of each delegate blob (None: 16 and the segment alignment).
    external_constants: store weights in a .ptd (see ExecutorchProgramManager.write_tensor_data_to_file)
    instead of the .pte (True for all constants, or a callable node -> bool to pick).
    emit_stacktrace: record each instruction's user stack trace in the chain.
    emit_mutable_buffer_names: record each mutable buffer's module path on its tensor
    (extra_tensor_info.fully_qualified_name), as upstream does with the same option.
    """

    memory_planning_pass: Any = field(default_factory=_default_memory_planning_pass)
    extract_delegate_segments: bool = True
    constant_tensor_alignment: int | None = None
    delegate_alignment: int | None = None
    external_constants: Any = False
    segment_alignment: int = 4096
    emit_stacktrace: bool = False
    emit_mutable_buffer_names: bool = False

    def __post_init__(self):
        for name in ("constant_tensor_alignment", "delegate_alignment", "segment_alignment"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0 or value & (value - 1)):
                raise ValueError(f"ExecutorchBackendConfig.{name} must be a power of two, got {value!r}")
