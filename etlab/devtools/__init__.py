"""Developer tools on top of the compiler, runtime, ETRecord and Inspector (upstream's `executorch.devtools`).

- Delegation: `get_delegation_info(graph_module)` -> `DelegationInfo` (`get_summary()`,
  `get_operator_delegation_dataframe()`; the explainer: `get_node_delegation_dataframe()`, one row per
  node with why a node was left out, `refusal_groups()`, `format_refusals()`), `print_delegation_info`,
  `format_delegated_graph` / `print_delegated_graph` (lowered modules' graphs shown in place).
- Memory: `memory_plan_dataframe(program_manager)`, `planned_tensors`, `live_bytes_per_step`,
  `memory_lower_bound`, `generate_memory_trace(program_manager, path)` (Chrome trace).
- Bundled programs: `MethodTestCase`, `MethodTestSuite`, `BundledProgram`,
  `serialize_from_bundled_program_to_flatbuffer`, `deserialize_from_flatbuffer_to_bundled_program`,
  `method_test_suites_from_schema`.
- Bundled programs at run time (etlab runtime): `load_bundled_program`, `load_bundled_input`,
  `verify_method_outputs`, `verify_bundled_program` -> `BundledVerification` reports (tolerance
  `DEFAULT_RTOL` 1e-4 / `DEFAULT_ATOL` 1e-6 unless given; `check_tolerance` validates one).
- Quantization debugging: `quantization_report(float_model, quantized, inputs)` -> `QuantReport`
  (per-layer total and local error, `worst(k)`), `requantize_excluding`, `sensitivity_table`;
  `auto_mixed_precision(model, dataset, budget="top1>=0.99")` -> `MixedPrecisionResult` (the fewest
  float layers that meet an `AccuracyBudget`, explained), `greedy_float_baseline`; over a dataset,
  `quantization_report(..., dataset=iterable)` -> `DatasetQuantReport` (mean / p95 SQNR per layer, the
  shipped program's top-1 agreement, calibration coverage); `quant_main`: `etlab quant report|fix`.
- Upstream's names for the layers below: `Inspector` (etlab.inspector), `ETRecord`, `generate_etrecord`,
  `parse_etrecord` (etlab.etrecord), the `inspector` module; and its module layout for bundled programs:
  `etlab.devtools.bundled_program.config` / `.core` / `.serialize`.
- `profile(model, inputs)`: export, compile with an ETRecord, run with ETDump and intermediates,
  return the Inspector. With inputs per method ({"prefill": ..., "decode": ...}) it profiles an LLM's
  prefill and decode steps in one ETDump and returns a `PhaseProfile` (phases, KV cache, Inspector).
- KV cache: `state_buffers`, `kv_cache_dataframe`, `kv_cache_bytes` (mutable buffers from the plan).

    from etlab.devtools import get_delegation_info, profile
    print(get_delegation_info(edge.exported_program().graph_module).get_summary())
    inspector = profile(model, inputs, iterations=10)
"""

# ruff: noqa: F401  (the imports under TYPE_CHECKING re-export what __getattr__ loads lazily)
import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it; loaded on first use, so that importing one analysis
# (e.g. DelegationInfo for the views) does not import the compiler and runtime that profile() needs.
_WHERE = {
    "AccuracyBudget": "_amp_budget",
    "BackendBreakdown": "_delegation_info",
    "OCCURRENCES_IN_DELEGATED_GRAPHS": "_delegation_info",
    "OCCURRENCES_IN_NON_DELEGATED_GRAPHS": "_delegation_info",
    "BundledProgram": "_bundled_program",
    "BundledVerification": "_bundled_runtime",
    "BundledVerificationError": "_bundled_runtime",
    "DEFAULT_ATOL": "_bundled_runtime",
    "DEFAULT_RTOL": "_bundled_runtime",
    "ConfigValue": "_bundled_config",
    "DelegationBreakdown": "_delegation_info",
    "DelegationInfo": "_delegation_info",
    "MethodTestCase": "_bundled_config",
    "NODE_COLUMNS": "_delegation_info",
    "NodeDelegation": "_delegation_info",
    "MethodTestSuite": "_bundled_config",
    "OutputCheck": "_bundled_runtime",
    "PlannedTensor": "_memory_trace",
    "StateBuffer": "_kv_cache",
    "bundled_test_case_count": "_bundled_runtime",
    "check_tolerance": "_bundled_runtime",
    "bundled_value": "_bundled_program",
    "check_bundle": "_bundled_program",
    "deserialize_from_flatbuffer_to_bundled_program": "_bundled_program",
    "format_delegated_graph": "_delegation_info",
    "generate_memory_trace": "_memory_trace",
    "get_delegation_info": "_delegation_info",
    "kv_cache_bytes": "_kv_cache",
    "kv_cache_dataframe": "_kv_cache",
    "auto_mixed_precision": "_auto_mixed_precision",
    "greedy_float_baseline": "_auto_mixed_precision",
    "MixedPrecisionResult": "_auto_mixed_precision",
    "live_bytes_per_step": "_memory_trace",
    "load_bundled_input": "_bundled_runtime",
    "load_bundled_program": "_bundled_runtime",
    "lowered_modules": "_delegation_info",
    "memory_lower_bound": "_memory_trace",
    "memory_plan_dataframe": "_memory_trace",
    "memory_trace_events": "_memory_trace",
    "method_test_suites_from_schema": "_bundled_program",
    "op_type_of": "_delegation_info",
    "planned_tensors": "_memory_trace",
    "print_delegated_graph": "_delegation_info",
    "print_delegation_info": "_delegation_info",
    "profile": "_profile",
    "QuantReport": "_quant_debug",
    "DatasetQuantReport": "_quant_dataset_report",
    "dataset_report": "_quant_dataset",
    "quant_main": "_quant_cli",
    "RefusalGroup": "_delegation_info",
    "quantization_report": "_quant_dataset",  # one input -> _quant_debug's; dataset=... -> dataset_report
    "requantize_excluding": "_quant_debug_fix",
    "sensitivity_table": "_quant_debug_fix",
    "serialize_from_bundled_program_to_flatbuffer": "_bundled_program",
    "state_buffers": "_kv_cache",
    "tensor_from_bundled": "_bundled_program",
    "value_from_bundled": "_bundled_program",
    "verify_bundled_program": "_bundled_runtime",
    "verify_method_outputs": "_bundled_runtime",
    "with_kv_cache": "_kv_cache",
}

# upstream's `executorch.devtools` names for what lower layers define (devtools may import them: layer 6)
_LOWER = {
    "ETRecord": "etlab.etrecord",
    "Inspector": "etlab.inspector",
    "generate_etrecord": "etlab.etrecord",
    "parse_etrecord": "etlab.etrecord",
}

if TYPE_CHECKING:  # the names as a type checker sees them: what _WHERE and _LOWER load at run time
    # (tests/test_lazy_exports.py checks the two agree)
    from etlab import inspector
    from etlab.devtools._amp_budget import AccuracyBudget
    from etlab.devtools._auto_mixed_precision import MixedPrecisionResult, auto_mixed_precision, greedy_float_baseline
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
        DEFAULT_ATOL,
        DEFAULT_RTOL,
        BundledVerification,
        BundledVerificationError,
        OutputCheck,
        bundled_test_case_count,
        check_tolerance,
        load_bundled_input,
        load_bundled_program,
        verify_bundled_program,
        verify_method_outputs,
    )
    from etlab.devtools._delegation_info import (
        NODE_COLUMNS,
        OCCURRENCES_IN_DELEGATED_GRAPHS,
        OCCURRENCES_IN_NON_DELEGATED_GRAPHS,
        BackendBreakdown,
        DelegationBreakdown,
        DelegationInfo,
        NodeDelegation,
        RefusalGroup,
        format_delegated_graph,
        get_delegation_info,
        lowered_modules,
        op_type_of,
        print_delegated_graph,
        print_delegation_info,
    )
    from etlab.devtools._kv_cache import StateBuffer, kv_cache_bytes, kv_cache_dataframe, state_buffers, with_kv_cache
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
    from etlab.devtools._quant_cli import quant_main
    from etlab.devtools._quant_dataset import dataset_report, quantization_report
    from etlab.devtools._quant_dataset_report import DatasetQuantReport
    from etlab.devtools._quant_debug import QuantReport
    from etlab.devtools._quant_debug_fix import requantize_excluding, sensitivity_table
    from etlab.etrecord import ETRecord, generate_etrecord, parse_etrecord
    from etlab.inspector import Inspector

__all__ = sorted([*_WHERE, *_LOWER, "bundled_program", "inspector"])


def __getattr__(name: str):
    if name in ("inspector", "bundled_program"):  # modules: upstream exports `inspector`, has `bundled_program`
        value = importlib.import_module("etlab.inspector" if name == "inspector" else f"{__name__}.{name}")
    elif name in _LOWER:
        value = getattr(importlib.import_module(_LOWER[name]), name)
    elif name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
