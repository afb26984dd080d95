"""Edge methods -> planned ExecuTorch graphs -> one Program (+ segments, + optional .ptd)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from etlab.compiler._config import ExecutorchBackendConfig
from etlab.compiler._constants import ConstantStore, DelegateStore
from etlab.compiler._emit import EmittedMethod, emit_method
from etlab.compiler._et_graph import build_et_graph
from etlab.compiler._memory_planning import MemoryPlan
from etlab.compiler._named_data import collect_named_data, place_named_data, ptd_files
from etlab.schema import program as P


@dataclass
class CompiledProgram:
    """Everything to_executorch produces: the program, its segments, per method the emitted plan, the planned graph
    and memory plan, and the .ptd files of external constants."""

    program: P.Program
    segments: list[bytes | P.Pieces]
    methods: dict[str, EmittedMethod]
    et_programs: dict[str, ExportedProgram]
    memory_plans: dict[str, MemoryPlan]
    data_files: dict[str, bytes] = field(default_factory=dict)  # .ptd name (without extension) -> bytes
    constant_methods: dict = field(default_factory=dict)
    named_alignment: int = 1  # the alignment the program's named-data segments need


def _et_program(name: str, edge: ExportedProgram,
                config: ExecutorchBackendConfig) -> tuple[ExportedProgram, MemoryPlan]:
    gm = build_et_graph(edge)
    gm.meta["method"] = name
    gm.meta["num_mutation_outputs"] = sum(1 for s in edge.graph_signature.output_specs
                                          if s.kind != OutputKind.USER_OUTPUT)
    planner = config.memory_planning_pass
    planner._graph_signature = edge.graph_signature
    result = planner(gm)
    plan = gm.meta.get("memory_plan")
    if plan is None:
        plan = result if isinstance(result, MemoryPlan) else None
    if plan is None:
        raise ValueError("memory_planning_pass did not plan the graph (call the parent class's run())")
    et = copy.copy(edge)  # a shallow copy sharing signature/state; only the graph differs
    et._graph_module = gm
    return et, plan


def _constant_method_plan(name: str, value) -> P.ExecutionPlan:
    """A method with no instructions that returns a constant (an int, float, bool, or list of them)."""
    values, outputs = [], []
    items = value if isinstance(value, (list, tuple)) else [value]
    for v in items:
        if isinstance(v, bool):
            values.append(P.EValue(P.Bool(v)))
        elif isinstance(v, int):
            values.append(P.EValue(P.Int(v)))
        elif isinstance(v, float):
            values.append(P.EValue(P.Double(v)))
        elif isinstance(v, str):
            values.append(P.EValue(P.String(v)))
        else:
            raise TypeError(f"constant method {name!r}: values must be int, float, bool or str, got {type(v).__name__}")
        outputs.append(len(values) - 1)
    return P.ExecutionPlan(name=name, values=values, inputs=[], outputs=outputs,
                           chains=[P.Chain(inputs=[], outputs=[], instructions=[])], operators=[], delegates=[],
                           non_const_buffer_sizes=[0], container_meta_type=P.ContainerMetadata("", ""))


def compile_program(edge_programs: dict[str, ExportedProgram], constant_methods: dict | None,
                    config: ExecutorchBackendConfig) -> CompiledProgram:
    """Plans memory for every method, emits them, and assembles the program with its constant and delegate segments:
    the core of to_executorch."""
    constants = ConstantStore(alignment=config.constant_tensor_alignment or 16, external=config.external_constants)
    delegates = DelegateStore()
    methods, et_programs, plans = {}, {}, {}
    # Planned in the program's own method order (where shared mutable buffers land depends on it, as
    # upstream's), then placed across methods, then emitted in name order.
    planner = config.memory_planning_pass
    try:
        for name, edge in edge_programs.items():
            et_programs[name], plans[name] = _et_program(name, edge, config)
    except BaseException:
        if hasattr(planner, "discard_multimethod"):
            planner.discard_multimethod()  # the next compile with this planner starts clean
        raise
    if hasattr(planner, "run_multimethod"):
        planner.run_multimethod()
    for name in sorted(edge_programs):
        et = et_programs[name]
        methods[name] = emit_method(name, et.graph_module, et, constants, delegates, config)
    execution_plans = [m.plan for m in methods.values()]
    for name, value in (constant_methods or {}).items():
        if name in edge_programs:
            raise ValueError(f"constant method {name!r} has the same name as a method of the program")
        execution_plans.append(_constant_method_plan(name, value))
    execution_plans.sort(key=lambda p: p.name)

    segments: list[bytes | P.Pieces] = []
    data, offsets = constants.segment()
    if data is not None:
        segments.append(data)
    program = P.Program(version=0, execution_plan=execution_plans, constant_buffer=[], backend_delegate_data=[],
                        constant_segment=P.SubsegmentOffsets(segment_index=0, offsets=offsets))
    if config.extract_delegate_segments:
        first = len(segments)
        segments.extend(delegates.blobs)  # each segment starts on segment_alignment
        for plan in execution_plans:
            for d in plan.delegates or ():
                d.processed.index += first
    else:
        program.backend_delegate_data = [P.BackendDelegateInlineData(data=b) for b in delegates.blobs]
    named = collect_named_data(edge_programs[name] for name in sorted(edge_programs))
    named_alignment = place_named_data(program, segments, named)
    return CompiledProgram(program, segments, methods, et_programs, plans, ptd_files(constants, named),
                           dict(constant_methods or {}), named_alignment)

