"""Developer tools on top of the compiler, runtime, ETRecord and Inspector (upstream's `executorch.devtools`).

- Delegation: `get_delegation_info(graph_module)` -> `DelegationInfo` (`get_summary()`,
  `get_operator_delegation_dataframe()`), `print_delegation_info`, `format_delegated_graph` /
  `print_delegated_graph` (lowered modules' graphs shown in place).
- Memory: `memory_plan_dataframe(program_manager)`, `planned_tensors`, `live_bytes_per_step`,
  `memory_lower_bound`, `generate_memory_trace(program_manager, path)` (Chrome trace).
- Bundled programs: `MethodTestCase`, `MethodTestSuite`, `BundledProgram`,
  `serialize_from_bundled_program_to_flatbuffer`, `deserialize_from_flatbuffer_to_bundled_program`,
  `method_test_suites_from_schema`.
- Bundled programs at run time (etlab runtime): `load_bundled_program`, `load_bundled_input`,
  `verify_method_outputs`, `verify_bundled_program` -> `BundledVerification` reports.
- `profile(model, inputs)`: export, compile with an ETRecord, run with ETDump and intermediates,
  return the Inspector.

    from etlab.devtools import get_delegation_info, profile
    print(get_delegation_info(edge.exported_program().graph_module).get_summary())
    inspector = profile(model, inputs, iterations=10)
"""

from etlab.devtools._bundled_config import ConfigValue, MethodTestCase, MethodTestSuite
from etlab.devtools._bundled_program import (
    BundledProgram,
    bundled_value,
    check_bundle,
    deserialize_from_flatbuffer_to_bundled_program,
    method_test_suites_from_schema,
    serialize_from_bundled_program_to_flatbuffer,
    tensor_from_bundled,
    value_from_bundled,
)
from etlab.devtools._bundled_runtime import (
    BundledVerification,
    BundledVerificationError,
    OutputCheck,
    bundled_test_case_count,
    load_bundled_input,
    load_bundled_program,
    verify_bundled_program,
    verify_method_outputs,
)
from etlab.devtools._delegation_info import (
    BackendBreakdown,
    DelegationBreakdown,
    DelegationInfo,
    format_delegated_graph,
    get_delegation_info,
    lowered_modules,
    op_type_of,
    print_delegated_graph,
    print_delegation_info,
)
from etlab.devtools._memory_trace import (
    PlannedTensor,
    generate_memory_trace,
    live_bytes_per_step,
    memory_lower_bound,
    memory_plan_dataframe,
    memory_trace_events,
    planned_tensors,
)
from etlab.devtools._profile import profile

__all__ = [
    "BackendBreakdown", "BundledProgram", "BundledVerification", "BundledVerificationError", "ConfigValue",
    "DelegationBreakdown", "DelegationInfo", "MethodTestCase", "MethodTestSuite", "OutputCheck", "PlannedTensor",
    "bundled_test_case_count", "bundled_value", "check_bundle", "deserialize_from_flatbuffer_to_bundled_program",
    "format_delegated_graph", "generate_memory_trace", "get_delegation_info", "live_bytes_per_step",
    "load_bundled_input", "load_bundled_program", "lowered_modules", "memory_lower_bound", "memory_plan_dataframe",
    "memory_trace_events", "method_test_suites_from_schema", "op_type_of", "planned_tensors", "print_delegated_graph",
    "print_delegation_info", "profile", "serialize_from_bundled_program_to_flatbuffer", "tensor_from_bundled",
    "value_from_bundled", "verify_bundled_program", "verify_method_outputs",
]
