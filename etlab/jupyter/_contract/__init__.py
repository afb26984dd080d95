"""The JSON the server extension answers, as TypedDicts: the one contract between etlab/jupyter and the
JupyterLab extension. `_contract_ts` generates labextension/src/contract.d.ts from this package (never
edited by hand; `make labextension` regenerates it, a test checks it is current) and `check` holds a
value to these types (the tests run it on what every endpoint answers for real files).

The types live by what they describe: `_files` (versions, stat, errors, the artifacts browser), `_graph` (a drawn
graph), `_program` (the .pte and ETRecord viewers, delegation), `_run` (the .etdp viewer, comparisons), `_bundle`
(bundled programs, verify); `_check` holds values to them. This package names them all, and REPLIES.

Only the standard library here, and only relative imports between these modules: the generator loads the package
from its folder before etlab is installed. Python's int and float are both TypeScript's `number`; a non-finite
float is sent as null (`_store.clean_json`), hence `float | None` wherever a measurement may be missing or NaN.
"""

from __future__ import annotations

from ._bundle import (
    BpteView,
    BundledCase,
    BundledSuite,
    BundledValue,
    CaseVerdict,
    OutputVerdict,
    Tolerance,
    VerifyReport,
)
from ._check import ContractError, check, fields, is_typeddict
from ._files import ArtifactFile, ArtifactGroup, Artifacts, ErrorReply, Stat, Versioned
from ._graph import Graph, GraphGroup, GraphNode, Latency
from ._program import (
    BackendShare,
    DelegateAt,
    DelegateCount,
    Delegation,
    EtrecordView,
    LeftOutNode,
    MemoryBlock,
    MethodSummary,
    ModuleRow,
    OperatorCount,
    PteView,
    RefusalGroup,
)
from ._run import (
    Column,
    CompareRow,
    CompareView,
    EtdpGraphs,
    EtdpView,
    Focus,
    MemoryOwner,
    MemoryPhase,
    MemoryStep,
    ObservedMemory,
    ProfileRow,
    RunBlock,
    RunSummary,
    Span,
)

# Every reply type, in the order the generated .d.ts lists them (the types they use come first there).
REPLIES = (Stat, ErrorReply, PteView, EtdpView, EtdpGraphs, EtrecordView, BpteView, VerifyReport, CompareView,
           Artifacts)

__all__ = [
    "REPLIES",
    "ArtifactFile",
    "ArtifactGroup",
    "Artifacts",
    "BackendShare",
    "BpteView",
    "BundledCase",
    "BundledSuite",
    "BundledValue",
    "CaseVerdict",
    "Column",
    "CompareRow",
    "CompareView",
    "ContractError",
    "DelegateAt",
    "DelegateCount",
    "Delegation",
    "ErrorReply",
    "EtdpGraphs",
    "EtdpView",
    "EtrecordView",
    "Focus",
    "Graph",
    "GraphGroup",
    "GraphNode",
    "Latency",
    "LeftOutNode",
    "MemoryBlock",
    "MemoryOwner",
    "MemoryPhase",
    "MemoryStep",
    "MethodSummary",
    "ModuleRow",
    "ObservedMemory",
    "OperatorCount",
    "OutputVerdict",
    "ProfileRow",
    "PteView",
    "RefusalGroup",
    "RunBlock",
    "RunSummary",
    "Span",
    "Stat",
    "Tolerance",
    "VerifyReport",
    "Versioned",
    "check",
    "fields",
    "is_typeddict",
]
