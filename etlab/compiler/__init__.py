"""The etlab compiler: torch.export program -> Edge dialect -> (delegation) -> planned, emitted .pte.

    from etlab.compiler import to_edge
    et = to_edge(torch.export.export(model, inputs)).to_executorch()
    et.write_to_file("model.pte")

Names mirror upstream ExecuTorch's `executorch.exir`, so its docs translate by changing the import root.

Backend authors: `Partitioner`, `PartitionResult`, `DelegationSpec`, `BackendDetails`,
`PreprocessResult`, `CompileSpec`, `to_backend`, `DelegateMappingBuilder`, `LoweredBackendModule`,
`executorch_call_delegate` (upstream's `executorch.exir.backend.*`), all importable from here.
"""

from etlab.compiler._config import EdgeCompileConfig, ExecutorchBackendConfig
from etlab.compiler._constants import tensor_bytes
from etlab.compiler._delegation import (
    BackendDetails,
    DelegateMappingBuilder,
    DelegationSpec,
    Partitioner,
    PartitionResult,
    PreprocessResult,
    get_backend,
    registered_backend_ids,
    to_backend,
)
from etlab.compiler._delegation_lowering import DelegationError
from etlab.compiler._errors import CompileError
from etlab.compiler._manager import (
    EdgeProgramManager,
    ETRecordSources,
    ExecutorchProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)
from etlab.compiler._memory_planning import MemoryPlan, MemoryPlanningPass, linearize, live_bytes, specs_of
from etlab.compiler._shapes import dim_order_of
from etlab.compiler._tensor_spec import ALIGNMENT, TensorSpec, align
from etlab.facts.lowered import CompileSpec, LoweredBackendModule, executorch_call_delegate

__all__ = [
    "ALIGNMENT",
    "BackendDetails",
    "CompileError",
    "CompileSpec",
    "DelegateMappingBuilder",
    "DelegationError",
    "DelegationSpec",
    "ETRecordSources",
    "EdgeCompileConfig",
    "EdgeProgramManager",
    "ExecutorchBackendConfig",
    "ExecutorchProgramManager",
    "LoweredBackendModule",
    "MemoryPlan",
    "MemoryPlanningPass",
    "PartitionResult",
    "Partitioner",
    "PreprocessResult",
    "TensorSpec",
    "align",
    "dim_order_of",
    "executorch_call_delegate",
    "get_backend",
    "linearize",
    "live_bytes",
    "registered_backend_ids",
    "specs_of",
    "tensor_bytes",
    "to_backend",
    "to_edge",
    "to_edge_transform_and_lower",
]
