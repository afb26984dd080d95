"""The user-facing pipeline: to_edge -> EdgeProgramManager -> to_executorch -> ExecutorchProgramManager."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch.export import ExportedProgram
from torch.fx import GraphModule

from etlab.compiler._config import EdgeCompileConfig, ExecutorchBackendConfig
from etlab.compiler._edge import to_edge_program
from etlab.compiler._errors import CompileError
from etlab.compiler._gc import with_young_heap_gc, young_heap_gc
from etlab.compiler._memory_planning import MemoryPlan
from etlab.compiler._program import CompiledProgram, compile_program
from etlab.schema import program as P
from etlab.schema import serialize_pte, write_atomic


def _as_methods(programs, what: str = "programs") -> dict[str, ExportedProgram]:
    if isinstance(programs, ExportedProgram):
        return {"forward": programs}
    if isinstance(programs, Mapping):
        if not programs:
            raise ValueError(f"{what}: the dict of methods is empty")
        for name, ep in programs.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"{what}: method names must be non-empty strings, got {name!r}")
            if not isinstance(ep, ExportedProgram):
                raise TypeError(f"{what}[{name!r}] must be a torch.export.ExportedProgram, got {type(ep).__name__}")
        return dict(programs)
    raise TypeError(f"{what} must be an ExportedProgram or a dict of method name -> ExportedProgram, "
                    f"got {type(programs).__name__}")


def _per_method(value, methods: Sequence[str], what: str) -> dict[str, list]:
    """A pass list / partitioner given once or per method -> {method: [items]}."""
    if isinstance(value, Mapping):
        unknown = set(value) - set(methods)
        if unknown:
            raise ValueError(f"{what} names unknown methods {sorted(unknown)}; methods are {sorted(methods)}")
        return {m: list(v) if isinstance(v, (list, tuple)) else [v] for m, v in value.items()}
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return {m: items for m in methods}


@dataclass
class ETRecordSources:
    """What an ETRecord is built from: the programs at each stage and the emitter's debug maps."""

    exported_program: dict[str, ExportedProgram] | None
    edge_dialect_program: dict[str, ExportedProgram]
    debug_handle_map: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    delegate_map: dict[str, dict[int, dict]] = field(default_factory=dict)
    instruction_id_to_num_outs_map: dict[str, dict[int, int]] = field(default_factory=dict)


class EdgeProgramManager:
    """The methods of a program in the Edge dialect."""

    def __init__(self, edge_programs: dict[str, ExportedProgram], constant_methods: dict | None = None,
                 compile_config: EdgeCompileConfig | None = None, *, aten_programs=None,
                 generate_etrecord: bool = False):
        self._edge_programs = dict(edge_programs)
        self._constant_methods = dict(constant_methods or {})
        self.compile_config = compile_config or EdgeCompileConfig()
        self._aten_programs = aten_programs
        self._generate_etrecord = generate_etrecord

    @property
    def aten_programs(self) -> dict[str, ExportedProgram]:
        """The exported (ATen) programs per method, kept when compiled with generate_etrecord=True ({} otherwise)."""
        return dict(self._aten_programs or {})

    @property
    def methods(self) -> set[str]:
        """The names of the program's methods (upstream's property), e.g. {'forward'}; what `exported_program(name)`
        accepts."""
        return set(self._edge_programs)

    def exported_program(self, method_name: str = "forward") -> ExportedProgram:
        """The edge-dialect program of a method (a KeyError lists the methods)."""
        if method_name not in self._edge_programs:
            raise KeyError(f"no method {method_name!r}; methods are {sorted(self._edge_programs)}")
        return self._edge_programs[method_name]

    def _derive(self, programs: dict[str, ExportedProgram]) -> EdgeProgramManager:
        return EdgeProgramManager(programs, self._constant_methods, self.compile_config,
                                  aten_programs=self._aten_programs, generate_etrecord=self._generate_etrecord)

    @with_young_heap_gc
    def transform(self, passes, compile_config: EdgeCompileConfig | None = None) -> EdgeProgramManager:
        """Runs graph passes (callables GraphModule -> PassResult/GraphModule/None), once or per method.

        The result is re-lowered and re-verified: nodes a pass adds get debug handles and decompositions.
        """
        config = compile_config or self.compile_config
        per = _per_method(passes, sorted(self.methods), "transform passes")
        out = dict(self._edge_programs)
        for name, method_passes in per.items():
            ep = self._edge_programs[name]
            gm = ep.graph_module
            from etlab.facts.fx import copy_graph_module

            gm = copy_graph_module(gm)
            for p in method_passes:
                if not callable(p):
                    raise TypeError(f"transform pass {p!r} is not callable")
                result = p(gm)
                new_gm = getattr(result, "graph_module", result)
                if isinstance(new_gm, GraphModule):
                    gm = new_gm
            gm.recompile()
            rebuilt = ExportedProgram(root=gm, graph=gm.graph, graph_signature=ep.graph_signature,
                                      state_dict=ep.state_dict, range_constraints=ep.range_constraints,
                                      module_call_graph=ep.module_call_graph, example_inputs=ep.example_inputs,
                                      constants=ep.constants, verifiers=list(ep.verifiers))
            out[name] = to_edge_program(rebuilt, config)
        return self._derive(out)

    @with_young_heap_gc
    def to_backend(self, partitioner) -> EdgeProgramManager:
        """Delegates the partitions a Partitioner tags (once, as a list, or per method) to their backends."""
        from etlab.compiler._delegation import to_backend

        per = _per_method(partitioner, sorted(self.methods), "partitioner")
        out = dict(self._edge_programs)
        for name, partitioners in per.items():
            ep = out[name]
            for p in partitioners:
                ep = to_backend(ep, p)
            out[name] = ep
        return self._derive(out)

    @with_young_heap_gc
    def to_executorch(self, config: ExecutorchBackendConfig | None = None) -> ExecutorchProgramManager:
        """Plans memory and emits every method: the ExecutorchProgramManager whose `.buffer` is the .pte
        (`config` as upstream's ExecutorchBackendConfig: memory planning, mutable buffers, ...)."""
        config = config or ExecutorchBackendConfig()
        if not isinstance(config, ExecutorchBackendConfig):
            raise TypeError(f"config must be an ExecutorchBackendConfig, got {type(config).__name__}")
        compiled = compile_program(self._edge_programs, self._constant_methods, config)
        return ExecutorchProgramManager(compiled, config, self)


class ExecutorchProgramManager:
    """A compiled program: the .pte bytes, the planned graphs and the maps the devtools need."""

    def __init__(self, compiled: CompiledProgram, config: ExecutorchBackendConfig, edge: EdgeProgramManager):
        self._compiled = compiled
        self.config = config
        self._edge = edge
        self._buffer: bytes | None = None

    @property
    def edge_program_manager(self) -> EdgeProgramManager:
        """The EdgeProgramManager this program was compiled from."""
        return self._edge

    @property
    def methods(self) -> set[str]:
        """The names of the compiled program's methods, the entry points a runtime `Program` can load."""
        return set(self._compiled.et_programs)

    @property
    def executorch_program(self) -> P.Program:
        """The program as the schema's dataclasses (`etlab.schema.program.Program`): the execution plans before
        serialization, for inspecting what the .pte will hold."""
        return self._compiled.program

    @property
    def buffer(self) -> bytes:
        """The .pte file's bytes, serialized once on first use (delegate blobs and constants as aligned segments) and
        cached: write them with `write_to_file` or load them with `etlab.runtime`."""
        if self._buffer is None:
            # Delegate blobs are whole segments: a stricter delegate alignment raises the segment alignment.
            alignment = max(self.config.segment_alignment, self.config.delegate_alignment or 0,
                            self._compiled.named_alignment)
            with young_heap_gc():
                self._buffer = serialize_pte(self._compiled.program, self._compiled.segments,
                                             segment_alignment=alignment)
        return self._buffer

    def write_to_file(self, f) -> None:
        """Writes the .pte to an open binary file, or atomically to a path."""
        if isinstance(f, (str, os.PathLike)):
            write_atomic(f, self.buffer)
        else:
            f.write(self.buffer)

    def exported_program(self, method_name: str = "forward") -> ExportedProgram:
        """The planned ExecuTorch graph of a method (out-variant ops, meta['spec'] on every tensor)."""
        if method_name not in self._compiled.et_programs:
            raise KeyError(f"no method {method_name!r}; methods are {sorted(self._compiled.et_programs)}")
        return self._compiled.et_programs[method_name]

    @property
    def memory_plans(self) -> dict[str, MemoryPlan]:
        """Per method: arena sizes (non_const_buffer_sizes) and the lower bound of each arena."""
        return dict(self._compiled.memory_plans)

    @property
    def debug_handle_map(self) -> dict[str, dict[int, list[int]]]:
        """Per method: instruction index -> debug handles of the edge nodes it runs."""
        return {name: dict(m.debug_handle_map) for name, m in self._compiled.methods.items()}

    @property
    def delegate_map(self) -> dict[str, dict[int, dict]]:
        """Per method: DelegateCall instruction index -> {'name': backend id, 'delegate_map': ids -> handles}."""
        return {name: dict(m.delegate_map) for name, m in self._compiled.methods.items()}

    @property
    def instruction_id_to_num_outs_map(self) -> dict[str, dict[int, int]]:
        """Per method, instruction index -> how many outputs it writes: the Inspector needs it to pair an ETDump's
        logged outputs with the instruction that produced them."""
        return {name: dict(m.instruction_id_to_num_outs_map) for name, m in self._compiled.methods.items()}

    @property
    def data_files(self) -> dict[str, bytes]:
        """External data files by name (without extension): {'_default_external_constant': ptd bytes} for
        constants stored outside the .pte, plus one file per tag of delegates' external named data."""
        return dict(self._compiled.data_files)

    def write_tensor_data_to_file(self, outdir) -> list[Path]:
        """Writes each external data file to `outdir/<name>.ptd` (atomically); returns the paths."""
        outdir = Path(outdir)
        if outdir.exists() and not outdir.is_dir():
            raise NotADirectoryError(f"write_tensor_data_to_file: {outdir} is not a directory")
        return [write_atomic(outdir / f"{name}.ptd", data) for name, data in self.data_files.items()]

    def get_etrecord(self):
        """The ETRecord of this compilation (`etlab.etrecord.ETRecord`; `.save(path)` writes it).

        The one place the compiler reaches up a layer, lazily, so upstream's
        `to_edge(..., generate_etrecord=True)...get_etrecord().save(path)` reads the same here.
        """
        from etlab.etrecord import ETRecord

        return ETRecord.from_sources(self.etrecord_sources())

    def etrecord_sources(self) -> ETRecordSources:
        """What an ETRecord is built from; raises CompileError unless generate_etrecord was set."""
        if not self._edge._generate_etrecord:
            raise CompileError("get_etrecord() needs the programs kept at compile time: call to_edge(..., "
                               "generate_etrecord=True) (or to_edge_transform_and_lower(..., generate_etrecord=True))")
        return ETRecordSources(
            exported_program=self._edge._aten_programs,
            edge_dialect_program=dict(self._edge._edge_programs),
            debug_handle_map=self.debug_handle_map,
            delegate_map=self.delegate_map,
            instruction_id_to_num_outs_map=self.instruction_id_to_num_outs_map,
        )


@with_young_heap_gc
def to_edge(programs, constant_methods: dict | None = None, compile_config: EdgeCompileConfig | None = None,
            generate_etrecord: bool = False) -> EdgeProgramManager:
    """Lowers exported program(s) to the Edge dialect. `programs`: an ExportedProgram ('forward') or a dict
    (method name -> ExportedProgram). `generate_etrecord=True` keeps the ATen graphs for the ETRecord.

    >>> import torch
    >>> class AddMul(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return x * y + x
    >>> exported = torch.export.export(AddMul(), (torch.ones(2, 2), torch.ones(2, 2)))
    >>> edge = to_edge(exported)
    >>> sorted(edge.methods)
    ['forward']
    >>> [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    ['aten.mul.Tensor', 'aten.add.Tensor']
    >>> bytes(edge.to_executorch().buffer[4:8])  # the .pte, ready for etlab.runtime
    b'ET12'
    """
    methods = _as_methods(programs)
    config = compile_config or EdgeCompileConfig()
    edge = {name: to_edge_program(ep, config) for name, ep in methods.items()}
    return EdgeProgramManager(edge, constant_methods, config, aten_programs=methods if generate_etrecord else None,
                              generate_etrecord=generate_etrecord)


@with_young_heap_gc
def to_edge_transform_and_lower(programs, transform_passes=None, partitioner=None,
                                constant_methods: dict | None = None,
                                compile_config: EdgeCompileConfig | None = None,
                                generate_etrecord: bool = False) -> EdgeProgramManager:
    """to_edge, then the transform passes, then delegation to the partitioner(s)' backends.

    As upstream's: the ops each partitioner's `ops_to_not_decompose` names stay whole in the Edge
    graph where its filter accepts the node (an XNNPACK `linear` is one node, not permute + addmm),
    and one of them left undelegated afterwards is a CompileError.

    >>> import torch
    >>> from etlab.compiler.backends import DemoPartitioner
    >>> class AddMul(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return x * y + x
    >>> exported = torch.export.export(AddMul(), (torch.ones(2, 2), torch.ones(2, 2)))
    >>> edge = to_edge_transform_and_lower(exported, partitioner=[DemoPartitioner()])
    >>> [n.target.__name__ for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    ['executorch_call_delegate', 'getitem']
    """
    from etlab.compiler._delegation import (
        check_kept_whole_delegated,
        edge_config_after_keep_whole,
        keep_whole_config,
    )

    if not partitioner:
        edge = to_edge(programs, constant_methods, compile_config, generate_etrecord)
        return edge.transform(transform_passes) if transform_passes else edge
    methods = _as_methods(programs)
    config = compile_config or EdgeCompileConfig()
    per = _per_method(partitioner, sorted(methods), "partitioner")
    configs = {name: keep_whole_config(config, per.get(name, []), ep) for name, ep in methods.items()}
    edge = EdgeProgramManager({name: to_edge_program(ep, configs[name]) for name, ep in methods.items()},
                              constant_methods, edge_config_after_keep_whole(config, configs.values()),
                              aten_programs=methods if generate_etrecord else None,
                              generate_etrecord=generate_etrecord)
    if transform_passes:
        edge = edge.transform(transform_passes)
    edge = edge.to_backend(partitioner)
    for name in edge.methods:
        check_kept_whole_delegated(edge.exported_program(name), config, configs[name], name)
    return edge


PassType = Callable[[GraphModule], object]
