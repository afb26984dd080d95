"""Backend delegation, ahead-of-time side: partitioners tag nodes, backends preprocess partitions.

The flow (names mirror upstream ExecuTorch's `exir.backend`):

1. A `Partitioner` tags the nodes a backend should take (`node.meta["delegation_tag"]`) and maps
   each tag to a `DelegationSpec(backend_id, compile_specs)`.
2. `to_backend(edge_program, partitioner)` cuts each tag's nodes out into an ExportedProgram of its
   own (parameters and buffers used only there move with them), hands it to the backend's
   `BackendDetails.preprocess`, wraps the result into a `LoweredBackendModule` and replaces the
   nodes with `executorch_call_delegate(lowered_module_<i>, *inputs)` plus one getitem per output.
3. Backends are looked up by `backend_id`, the name of the `BackendDetails` subclass.

`DelegateMappingBuilder` helps a backend record which original debug handles each of its own
operations came from, so profiling events reported by the backend at run time map back to the
user's source.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, overload

import torch
from torch.export import ExportedProgram

from etlab.compiler._config import EdgeCompileConfig
from etlab.compiler._decompose import is_edge_op
from etlab.compiler._delegation_lowering import (
    DelegationError,
    WorkingProgram,
    check_partitioner_kept_graph,
    collect_partition,
    nodes_by_tag,
    program_with_shared_state,
    splice_delegate,
)
from etlab.compiler._errors import CompileError
from etlab.compiler._named_data import NamedDataStoreOutput
from etlab.facts.lowered import DELEGATION_REFUSAL_META, CompileSpec, LoweredBackendModule

__all__ = [
    "BackendDetails",
    "DelegateMappingBuilder",
    "DelegationError",
    "DelegationSpec",
    "PartitionResult",
    "Partitioner",
    "PreprocessResult",
    "get_backend",
    "registered_backend_ids",
    "to_backend",
]

# Modules whose import registers the backends etlab ships; imported on the first failed lookup so
# `to_backend("DemoBackend", ...)` works without the caller importing the backend first.
_BUILTIN_BACKEND_MODULES = ("etlab.compiler.backends",)


@dataclass(frozen=True)
class DelegationSpec:
    """Which backend takes a tagged partition, and the options it is compiled with."""

    backend_id: str
    compile_specs: list[CompileSpec] = field(default_factory=list)


@dataclass
class PartitionResult:
    """What a partitioner returns: the program with nodes tagged, and each tag's DelegationSpec."""

    tagged_exported_program: ExportedProgram
    partition_tags: dict[str, DelegationSpec]


def tag_groups(groups: Sequence[Sequence[torch.fx.Node]], order: dict[torch.fx.Node, int], spec: DelegationSpec,
               prefix: str, refuse) -> dict[str, DelegationSpec]:
    """What a partitioner does with the node groups it found: each group, in graph order, tagged
    `<prefix><i>` with `spec`, unless `refuse(nodes)` gives a `DelegationRefusal` (a group with nothing
    to compute), which each of its nodes then carries instead. Returns the tag -> spec map."""
    tags: dict[str, DelegationSpec] = {}
    for nodes in sorted(groups, key=lambda group: order[group[0]]):
        refusal = refuse(nodes)
        if refusal is not None:
            for node in nodes:
                node.meta[DELEGATION_REFUSAL_META] = refusal
            continue
        tag = f"{prefix}{len(tags)}"
        for node in nodes:
            node.meta["delegation_tag"] = tag
        tags[tag] = spec
    return tags


class Partitioner(ABC):
    """Decides which nodes of an edge program go to which backend.

    `partition` sets `node.meta["delegation_tag"] = tag` on each node to delegate and returns the
    tags' DelegationSpecs. It must not otherwise change the graph. Parameter/buffer placeholders
    need no tag: those used only by one partition move into it automatically. Only nodes of the
    top-level graph are delegated, not those inside control-flow (torch.cond) branches.
    """

    def __call__(self, exported_program: ExportedProgram) -> PartitionResult:
        return self.partition(exported_program)

    @abstractmethod
    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tag the nodes to delegate; return the program and the tag -> DelegationSpec map."""

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[torch._ops.OpOverload], object | None]:
        """Ops the backend wants kept whole by `to_edge_transform_and_lower`, plus an optional
        node filter `fn(node) -> bool` choosing which of their nodes stay whole. Default: none."""
        return [], None


def keep_whole_config(config: EdgeCompileConfig, partitioners: Sequence[Partitioner],
                      ep: ExportedProgram) -> EdgeCompileConfig:
    """The EdgeCompileConfig one method is lowered with under `to_edge_transform_and_lower`: the ops the
    partitioners' `ops_to_not_decompose(ep)` name are edge ops, kept whole where a partitioner's filter
    accepts the node (no filter: every node of the op), decomposed where none does."""
    wanted: dict = {}  # op -> the filters of the partitioners naming it (None: every node)
    for p in partitioners:
        ops, node_filter = p.ops_to_not_decompose(ep)
        for op in ops:
            if not isinstance(op, torch._ops.OpOverload):
                raise DelegationError(f"{type(p).__name__}.ops_to_not_decompose returned {op!r}; expected "
                                      "torch OpOverloads (torch.ops.aten.linear.default)")
            wanted.setdefault(op, []).append(node_filter)
    if not wanted:
        return config

    def keep(node: torch.fx.Node) -> bool:
        return any(f is None or f(node) for f in wanted.get(node.target, ()))

    new = [op for op in wanted if op not in config._preserve_ops]
    listed = config._core_aten_ops_exception_list
    return replace(config, _preserve_ops=[*config._preserve_ops, *new], _preserve_node=keep,
                   _core_aten_ops_exception_list=[*listed, *(op for op in new if op not in listed)])


def edge_config_after_keep_whole(config: EdgeCompileConfig, configs) -> EdgeCompileConfig:
    """The EdgeProgramManager's config after lowering with `keep_whole_config`s: their ops stay edge ops
    (a later `transform` re-lowers the graph and must not decompose them), as upstream merges them."""
    extra = [op for c in configs for op in c._core_aten_ops_exception_list
             if op not in config._core_aten_ops_exception_list]
    return replace(config, _core_aten_ops_exception_list=[*config._core_aten_ops_exception_list,
                                                          *dict.fromkeys(extra)]) if extra else config


def check_kept_whole_delegated(ep: ExportedProgram, base: EdgeCompileConfig, kept: EdgeCompileConfig,
                               method: str) -> None:
    """A node kept whole for a backend (no portable kernel is expected for `linear`) and then left
    undelegated is a CompileError naming it, its op, source line and the partitioner's refusal."""
    extra = set(kept._preserve_ops) - set(base._preserve_ops)
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in extra or is_edge_op(node.target, base):
            continue
        refusal = node.meta.get(DELEGATION_REFUSAL_META)
        why = f": {refusal.reason}" if refusal is not None else ""
        raise CompileError.at(node, f"method {method!r}: node {node.name} was kept whole for a partitioner "
                              f"(ops_to_not_decompose) but not delegated{why}; the portable program has no "
                              "kernel for it")


@dataclass
class PreprocessResult:
    """A backend's compiled partition: opaque bytes for its runtime half, the map from the backend's
    debug identifiers (int or str) to the original nodes' debug handles, and the named data the
    bytes refer to by key (a `NamedDataStore`'s output; upstream's field name), which `to_executorch`
    writes into the .pte or the .ptd files its entries are tagged for."""

    processed_bytes: bytes = b""
    debug_handle_map: dict[int | str, tuple[int, ...]] | None = None
    data_store_output: NamedDataStoreOutput | None = None


class BackendDetails(ABC):
    """Base of every backend's ahead-of-time half; subclassing registers it under its class name.

    Subclasses implement `@staticmethod preprocess(edge_program, compile_specs) -> PreprocessResult`.
    Defining a second subclass with the same name replaces the first (re-running a notebook cell).
    """

    _registry: ClassVar[dict[str, type[BackendDetails]]] = {}
    # True for backends that compile the constants they read into their payload (packed weights):
    # a constant other nodes read too is then copied into the partition instead of passed in.
    copies_shared_constants: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("preprocess") is None:
            raise TypeError(f"backend {cls.__name__} must define `@staticmethod preprocess(edge_program, "
                            "compile_specs) -> PreprocessResult`")
        BackendDetails._registry[cls.__name__] = cls

    @staticmethod
    @abstractmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        """Compile one partition (a self-contained ExportedProgram) into the backend's bytes."""


def registered_backend_ids() -> list[str]:
    """Names of every BackendDetails subclass defined so far."""
    return sorted(BackendDetails._registry)


def get_backend(backend_id: str) -> type[BackendDetails]:
    """The BackendDetails subclass named `backend_id`; a DelegationError lists the known ones."""
    if not isinstance(backend_id, str):
        raise TypeError(f"backend_id must be a str (a BackendDetails subclass name), got {type(backend_id).__name__}")
    if backend_id not in BackendDetails._registry:
        for module in _BUILTIN_BACKEND_MODULES:
            importlib.import_module(module)
    try:
        return BackendDetails._registry[backend_id]
    except KeyError:
        known = ", ".join(registered_backend_ids()) or "none"
        raise DelegationError(f"unknown backend id {backend_id!r}: no BackendDetails subclass has that name "
                              f"(known: {known})") from None


class DelegateMappingBuilder:
    """Builds a backend's debug_handle_map: delegate debug identifier -> original debug handles.

    With `generated_identifiers=True` the builder hands out identifiers 0, 1, 2, ... and refuses
    caller-chosen ones; otherwise every entry needs a caller-chosen identifier (an int or a str,
    e.g. the name of the backend's own op). Mixing the two styles in one builder is an error.
    """

    def __init__(self, generated_identifiers: bool = False):
        self.generated_identifiers = generated_identifiers
        self._handles: dict[int | str, set[int]] = {}
        self._next_generated = 0

    def insert_delegate_mapping_entry(self, nodes: torch.fx.Node | Sequence[torch.fx.Node] | None = None,
                                      handles: int | Sequence[int | None] | None = None,
                                      identifier: int | str | None = None) -> int | str:
        """Record that `identifier` covers `nodes` (their meta["debug_handle"]) or `handles`.

        Exactly one of `nodes` and `handles` is given; missing handles are skipped, but at least
        one must remain. Returns the identifier (the generated one in generated mode).
        """
        if (nodes is None) == (handles is None):
            raise DelegationError("insert_delegate_mapping_entry needs exactly one of `nodes` or `handles`")
        if self.generated_identifiers and identifier is not None:
            raise DelegationError(f"this DelegateMappingBuilder generates identifiers; it cannot take the manual "
                                  f"identifier {identifier!r}")
        if not self.generated_identifiers:
            if identifier is None:
                raise DelegationError("this DelegateMappingBuilder uses manual identifiers: pass `identifier=` "
                                      "(or create it with generated_identifiers=True)")
            if isinstance(identifier, bool) or not isinstance(identifier, (int, str)):
                raise DelegationError(f"a delegate identifier must be an int or a str, got {identifier!r}")
            if identifier in self._handles:
                raise DelegationError(f"delegate identifier {identifier!r} was already inserted")

        if nodes is not None:
            node_list = [nodes] if isinstance(nodes, torch.fx.Node) else list(nodes)
            found = {node.meta.get("debug_handle") for node in node_list}
            what = f"nodes {[node.name for node in node_list]}"
        else:
            found = set(handles) if isinstance(handles, (list, tuple, set)) else {handles}
            what = f"handles {handles!r}"
        found.discard(None)
        if not found:
            raise DelegationError(f"no debug handles in {what}; nothing to map")
        bad = [h for h in found if isinstance(h, bool) or not isinstance(h, int)]
        if bad:
            raise DelegationError(f"debug handles must be ints, got {bad!r} from {what}")

        if self.generated_identifiers:
            identifier = self._next_generated
            self._next_generated += 1
        self._handles[identifier] = found
        return identifier

    def get_delegate_mapping(self) -> dict[int | str, tuple[int, ...]]:
        """Identifier -> sorted tuple of original debug handles."""
        return {key: tuple(sorted(handles)) for key, handles in self._handles.items()}


def _preprocess(backend_id: str, program: ExportedProgram, compile_specs: list[CompileSpec]) -> LoweredBackendModule:
    backend = get_backend(backend_id)
    specs = list(compile_specs or [])
    for spec in specs:
        if not isinstance(spec, CompileSpec):
            raise TypeError(f"compile_specs for backend {backend_id!r} must be CompileSpec objects, got {spec!r}")
    # The backend may rewrite the graph it is given; the LoweredBackendModule keeps the untouched one.
    result = backend.preprocess(program_with_shared_state(program), specs)
    if not isinstance(result, PreprocessResult):
        raise DelegationError(f"{backend_id}.preprocess must return a PreprocessResult, got {type(result).__name__}")
    if not isinstance(result.processed_bytes, (bytes, bytearray, memoryview)):
        raise DelegationError(f"{backend_id}.preprocess returned processed_bytes of type "
                              f"{type(result.processed_bytes).__name__}; expected bytes")
    store = result.data_store_output
    if store is not None and not isinstance(store, NamedDataStoreOutput):
        raise DelegationError(f"{backend_id}.preprocess returned data_store_output of type {type(store).__name__}; "
                              "expected a NamedDataStoreOutput (NamedDataStore().get_named_data_store_output())")
    return LoweredBackendModule(backend_id, bytes(result.processed_bytes), specs, program,
                                dict(result.debug_handle_map or {}), store if store else None)


@overload
def to_backend(edge_program: ExportedProgram, partitioner: Partitioner, /) -> ExportedProgram: ...


@overload
def to_backend(backend_id: str, edge_program: ExportedProgram,
               compile_specs: list[CompileSpec], /) -> LoweredBackendModule: ...


def to_backend(first, second, compile_specs=None, /):
    """Delegate parts of an edge program to backends.

    - `to_backend(edge_program, partitioner) -> ExportedProgram`: lower every partition the
      partitioner tags; the input program is left unchanged.
    - `to_backend(backend_id, edge_program, compile_specs) -> LoweredBackendModule`: lower the
      whole program into one backend.
    """
    if isinstance(first, str):
        if not isinstance(second, ExportedProgram):
            raise TypeError(f"to_backend({first!r}, edge_program, compile_specs): edge_program must be an "
                            f"ExportedProgram, got {type(second).__name__}")
        return _preprocess(first, second, compile_specs or [])
    if not isinstance(first, ExportedProgram):
        raise TypeError("to_backend takes (edge_program, partitioner) or (backend_id, edge_program, compile_specs); "
                        f"the first argument is a {type(first).__name__}")
    if compile_specs is not None:
        raise TypeError("to_backend(edge_program, partitioner) takes no compile_specs; "
                        "they belong in the partitioner's DelegationSpecs")
    if not isinstance(second, Partitioner):
        raise TypeError(f"to_backend(edge_program, partitioner): partitioner must be an etlab Partitioner, "
                        f"got {type(second).__name__}")
    return _partition_and_lower(first, second)


def _partition_and_lower(edge_program: ExportedProgram, partitioner: Partitioner) -> ExportedProgram:
    # The partitioner tags a copy: same tensors, fresh graph and node meta.
    offered = program_with_shared_state(edge_program)
    result = partitioner(offered)
    name = type(partitioner).__name__
    if not isinstance(result, PartitionResult):
        raise DelegationError(f"{name}.partition must return a PartitionResult, got {type(result).__name__}")
    if not isinstance(result.partition_tags, dict):
        raise DelegationError(f"{name}.partition returned partition_tags of type "
                              f"{type(result.partition_tags).__name__}; expected dict[str, DelegationSpec]")
    for tag, spec in result.partition_tags.items():
        if not isinstance(spec, DelegationSpec):
            raise DelegationError(f"{name}: partition tag {tag!r} maps to {spec!r}, not a DelegationSpec")
    tagged = result.tagged_exported_program
    check_partitioner_kept_graph(edge_program, tagged, name)

    work = WorkingProgram.from_program(tagged)
    tagged_nodes = nodes_by_tag(work.graph_module.graph, result.partition_tags, name)
    for tag, spec in result.partition_tags.items():
        nodes = tagged_nodes.get(tag)
        if not nodes:
            continue
        cut = collect_partition(work, tag, nodes, get_backend(spec.backend_id).copies_shared_constants)
        lowered = _preprocess(spec.backend_id, cut.program, spec.compile_specs)
        splice_delegate(work, cut, lowered)
    for node in work.graph_module.graph.nodes:
        node.meta.pop("delegation_tag", None)
    return work.to_program()
