"""The contract's replies about a program: the .pte viewer (methods, operators, memory plan, delegation) and the
ETRecord viewer (its graphs, module tree and delegate calls). The delegation part is _delegation.delegation_view's."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ._files import Versioned
from ._graph import Graph


class OperatorCount(TypedDict):
    """How many kernel calls of one operator a method's instructions make."""

    name: str
    calls: int


class DelegateCount(TypedDict):
    """How many delegate calls of one delegate (by index and backend) a method makes."""

    index: int
    backend: str
    calls: int


class MethodSummary(TypedDict):
    """One method of a program: its values, operators with call counts, delegates and arenas."""

    name: str
    inputs: list[str]
    outputs: list[str]
    instructions: int
    values: int
    operators: list[OperatorCount]
    delegates: list[DelegateCount]
    arena_bytes: list[int]
    constant_bytes: int


class MemoryBlock(TypedDict):
    """One planned tensor (etlab.facts.pte_memory.PlannedBlock): its arena, place and live steps."""

    value: int
    memory_id: int
    offset: int
    size: int
    first: int
    last: int
    shape: list[int]
    dtype: str


# --- delegation (_delegation.delegation_view) ---------------------------------------------------------


class BackendShare(TypedDict):
    """What one backend took: its partitions and the nodes in them."""

    backend: str
    partitions: int
    nodes: int


class LeftOutNode(TypedDict):
    """A node no backend took, with the partitioner's reason and hint, its module and source line."""

    node: str
    op: str
    reason: str
    hint: str
    module: str
    source: str
    handle: int | None


class RefusalGroup(TypedDict):
    """The nodes left out for one category of reason, with the group's full count (`nodes` may be capped)."""

    category: str
    count: int
    nodes: list[LeftOutNode]


class Delegation(TypedDict):
    """What each backend took and why nodes were left out; `source` names the ETRecord it is from."""

    method: str
    delegated_nodes: int
    left_out: int
    backends: list[BackendShare]
    groups: list[RefusalGroup]
    unexplained: list[LeftOutNode]
    unexplained_count: int
    source: str


# --- the viewers ---------------------------------------------------------------------------------------


class PteView(Versioned):
    """GET /etlab/api/view/pte. A program without methods has only methods (empty), graph (null), memory,
    signature, segments."""

    methods: list[MethodSummary]
    graph: Graph | None
    memory: list[MemoryBlock]
    signature: str
    segments: int
    version: NotRequired[int]
    segment_bytes: NotRequired[int]
    method: NotRequired[str]
    steps: NotRequired[int]
    delegation: Delegation | None


class ModuleRow(TypedDict):
    """A row of the ETRecord viewer's module tree: a module or delegate group, its depth and how many nodes it holds."""

    id: str
    label: str
    kind: str
    type: str
    depth: int
    nodes: int


class DelegateAt(TypedDict):
    """Which backend the delegate call at a runtime instruction runs."""

    instruction: int
    backend: str


class EtrecordView(Versioned):
    """GET /etlab/api/view/etrecord."""

    methods: list[str]
    method: str
    kinds: list[str]
    graphs: list[Graph]
    modules: list[ModuleRow]
    instructions: int
    delegates: list[DelegateAt]
    signature: str
    delegation: Delegation | None
