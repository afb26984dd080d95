"""The etlab compiler: torch.export program -> Edge dialect -> (delegation) -> planned, emitted .pte.

    from etlab.compiler import to_edge
    et = to_edge(torch.export.export(model, inputs)).to_executorch()
    et.write_to_file("model.pte")

Names mirror upstream ExecuTorch's `executorch.exir`, so its docs translate by changing the import root.
"""

from etlab.compiler._config import EdgeCompileConfig, ExecutorchBackendConfig
from etlab.compiler._errors import CompileError
from etlab.compiler._manager import (
    EdgeProgramManager,
    ETRecordSources,
    ExecutorchProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)
from etlab.compiler._memory_planning import MemoryPlan, MemoryPlanningPass
from etlab.compiler._tensor_spec import TensorSpec

__all__ = [
    "CompileError", "ETRecordSources", "EdgeCompileConfig", "EdgeProgramManager", "ExecutorchBackendConfig",
    "ExecutorchProgramManager", "MemoryPlan", "MemoryPlanningPass", "TensorSpec", "to_edge",
    "to_edge_transform_and_lower",
]
