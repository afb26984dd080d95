"""The etlab compiler: torch.export program -> Edge dialect -> (delegation) -> planned, emitted .pte.

    from etlab.compiler import to_edge
    et = to_edge(torch.export.export(model, inputs)).to_executorch()
    et.write_to_file("model.pte")

Names mirror upstream ExecuTorch's `executorch.exir`, so its docs translate by changing the import root.

Backend authors: `Partitioner`, `PartitionResult`, `DelegationSpec`, `BackendDetails`,
`PreprocessResult`, `CompileSpec`, `to_backend`, `DelegateMappingBuilder`, `LoweredBackendModule`,
`executorch_call_delegate` (upstream's `executorch.exir.backend.*`), all importable from here;
`NamedDataStore` for the keyed data a backend's payload refers to (`PreprocessResult.data_store_output`),
and `delegate_external_constants_pass_unlifted` to send a delegate's weights to a .ptd.
"""

from typing import TYPE_CHECKING

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
from etlab.compiler._external_constants import delegate_external_constants_pass_unlifted
from etlab.compiler._manager import (
    EdgeProgramManager,
    ETRecordSources,
    ExecutorchProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)
from etlab.compiler._memory_planning import MemoryPlan, MemoryPlanningPass, linearize, live_bytes, specs_of
from etlab.compiler._named_data import DataEntry, NamedDataStore, NamedDataStoreOutput
from etlab.compiler._shapes import dim_order_of
from etlab.compiler._tensor_spec import ALIGNMENT, TensorSpec, align
from etlab.facts.lowered import CompileSpec, LoweredBackendModule, executorch_call_delegate

# PT2E quantization (imports torchao): loaded on first use, so `import etlab.compiler` stays light; a type
# checker sees the names through the TYPE_CHECKING import (tests/test_lazy_exports.py keeps the two equal).
if TYPE_CHECKING:
    from etlab.compiler._quantizer import (
        ACTIVATION_DTYPES,
        ACTIVATION_OBSERVERS,
        EtlabQuantizer,
        PercentileObserver,
        activation_observer,
        int8_dynamic_config,
        int8_static_config,
        weight_spec,
    )

_QUANTIZER = ("EtlabQuantizer", "int8_dynamic_config", "int8_static_config", "ACTIVATION_DTYPES",
              "ACTIVATION_OBSERVERS", "PercentileObserver", "activation_observer", "weight_spec")


def __getattr__(name: str):
    if name in _QUANTIZER:
        import etlab.compiler._quantizer as quantizer

        value = getattr(quantizer, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTIVATION_DTYPES",
    "ACTIVATION_OBSERVERS",
    "ALIGNMENT",
    "BackendDetails",
    "CompileError",
    "CompileSpec",
    "DataEntry",
    "DelegateMappingBuilder",
    "DelegationError",
    "DelegationSpec",
    "ETRecordSources",
    "EdgeCompileConfig",
    "EdgeProgramManager",
    "EtlabQuantizer",
    "ExecutorchBackendConfig",
    "ExecutorchProgramManager",
    "LoweredBackendModule",
    "MemoryPlan",
    "MemoryPlanningPass",
    "NamedDataStore",
    "NamedDataStoreOutput",
    "PartitionResult",
    "Partitioner",
    "PercentileObserver",
    "PreprocessResult",
    "TensorSpec",
    "activation_observer",
    "align",
    "delegate_external_constants_pass_unlifted",
    "dim_order_of",
    "executorch_call_delegate",
    "get_backend",
    "int8_dynamic_config",
    "int8_static_config",
    "linearize",
    "live_bytes",
    "registered_backend_ids",
    "specs_of",
    "tensor_bytes",
    "to_backend",
    "to_edge",
    "to_edge_transform_and_lower",
    "weight_spec",
]
