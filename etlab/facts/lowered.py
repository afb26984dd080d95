"""What a delegated partition becomes in the graph: a `LoweredBackendModule` held as a submodule,
called through the `executorch_call_delegate` operator.

    call_function(executorch_call_delegate, (get_attr lowered_module_0, *inputs)) -> tuple of outputs

The emitter turns each such call into a `DelegateCall` whose args are the input value indices
followed by the output value indices, and the module into a `BackendDelegate` entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch._C import DispatchKey
from torch._ops import HigherOrderOperator
from torch._subclasses.fake_tensor import FakeTensorMode

# node.meta key on an edge graph recorded before lowering (upstream's XNNPACK ETRecords): the
# (backend name, delegate-call instruction id) that took the node; set by etlab.etrecord.
DELEGATE_PARTITION_META = "delegate_partition"

# node.meta key a partitioner sets on each node it considered and left out of every partition: a
# `DelegationRefusal` saying why, read by the delegation explainer (devtools, views, Lab, CLI).
DELEGATION_REFUSAL_META = "delegation_refusal"

# The kinds of reason a backend gives for leaving a node out, from the user's point of view.
REFUSAL_CATEGORIES = ("operator", "dtype", "dynamic_shape", "argument", "quantization", "partition_size",
                      "excluded_by_user", "other")


@dataclass(frozen=True)
class DelegationRefusal:
    """Why `backend` did not take a node: a category (one of REFUSAL_CATEGORIES), a sentence naming
    what about the node is unsupported, and what the user can do about it."""

    backend: str
    category: str
    reason: str
    hint: str = ""

    def __post_init__(self):
        if self.category not in REFUSAL_CATEGORIES:
            raise ValueError(f"unknown refusal category {self.category!r}; expected one of {REFUSAL_CATEGORIES}")


@dataclass(frozen=True)
class DataEntry:
    """Where one key's bytes are: an index into the store's buffers, with the alignment asked for."""

    buffer_index: int
    alignment: int = 1
    tensor_layout: object = None  # etlab.schema.flat_tensor.TensorLayout, for tensors; None for opaque blobs


@dataclass
class NamedDataStoreOutput:
    """A store's contents: unique buffers, the keys stored in the .pte, and per .ptd name its keys
    (the compiler's NamedDataStore writes it; here so the ETRecord, a lower layer, can rebuild it)."""

    buffers: list[bytes] = field(default_factory=list)
    pte_data: dict[str, DataEntry] = field(default_factory=dict)
    external_data: dict[str, dict[str, DataEntry]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.pte_data) + sum(len(v) for v in self.external_data.values())


@dataclass(frozen=True)
class CompileSpec:
    """A backend option: a key and opaque bytes, stored verbatim in the .pte."""

    key: str
    value: bytes


class LoweredBackendModule(torch.nn.Module):
    """A partition after `BackendDetails.preprocess`: the backend's bytes plus the original graph.

    `original_module` (the partition as an ExportedProgram) keeps the delegated graph runnable in
    eager mode and inspectable by the devtools; `debug_handle_map` maps the backend's own
    identifiers to the debug handles of the original nodes they came from; `named_data_store_output`
    (upstream's name) holds the keyed blobs the payload refers to (XNNPACK's weights), which
    `to_executorch` stores in the .pte's named data or in .ptd files.
    """

    def __init__(self, backend_id: str, processed_bytes: bytes, compile_specs: list[CompileSpec],
                 original_module: torch.export.ExportedProgram, debug_handle_map: dict | None = None,
                 named_data_store_output=None):
        super().__init__()
        self.backend_id = backend_id
        self.processed_bytes = bytes(processed_bytes)
        self.compile_specs = list(compile_specs)
        self.original_module = original_module
        self.debug_handle_map = debug_handle_map or {}
        self.named_data_store_output = named_data_store_output

    def forward(self, *args):
        """Calls the delegate (`executorch_call_delegate`), so a graph that holds this module traces and runs like the
        program the runtime will execute."""
        return executorch_call_delegate(self, *args)

    def eager_module(self) -> torch.nn.Module:
        """`original_module` as a runnable module, built on first use (unlifting a program is slow)."""
        cached = self.__dict__.get("_eager_module")
        if cached is None:
            cached = self.original_module.module()
            # Kept out of nn.Module's registry so it is neither a submodule nor in any state_dict.
            object.__setattr__(self, "_eager_module", cached)
        return cached


@dataclass
class DelegateCallInfo:
    """Metadata the emitter records per DelegateCall, for the ETRecord and Inspector."""

    backend_id: str
    delegate_index: int
    debug_handle_map: dict = field(default_factory=dict)


class _ExecutorchCallDelegate(HigherOrderOperator):
    def __init__(self):
        super().__init__("executorch_call_delegate")

    def __call__(self, lowered_module, *args):
        return super().__call__(lowered_module, *args)


executorch_call_delegate = _ExecutorchCallDelegate()


def _run_original(lowered_module: LoweredBackendModule, *args):
    out = lowered_module.eager_module()(*args)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@executorch_call_delegate.py_impl(DispatchKey.CompositeExplicitAutograd)
def _call_delegate_eager(lowered_module, *args):
    return _run_original(lowered_module, *args)


@executorch_call_delegate.py_impl(DispatchKey.Autograd)
def _call_delegate_autograd(lowered_module, *args):
    with torch._C._AutoDispatchBelowAutograd():
        return executorch_call_delegate(lowered_module, *args)


@executorch_call_delegate.py_impl(FakeTensorMode)
def _call_delegate_fake(mode, lowered_module, *args):
    with mode:
        return _run_original(lowered_module, *args)


# --- finding lowered modules in a graph ---------------------------------------------------------


def is_delegate_call(node: torch.fx.Node) -> bool:
    """A call of `executorch_call_delegate` (ours, or a same-named operator from a deserialized graph)."""
    if node.op != "call_function":
        return False
    target = node.target
    name = target.name() if isinstance(target, HigherOrderOperator) else getattr(target, "__name__", None)
    return target is executorch_call_delegate or name == "executorch_call_delegate"


def lowered_module_of(gm: torch.nn.Module, node: torch.fx.Node) -> LoweredBackendModule | None:
    """The LoweredBackendModule a node refers to: a get_attr of one, or a delegate call (its first argument)."""
    if is_delegate_call(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    if node.op != "get_attr":
        return None
    try:
        mod = gm.get_submodule(str(node.target))
    except AttributeError:
        return None
    return mod if isinstance(mod, LoweredBackendModule) else None


def lowered_modules(gm: torch.fx.GraphModule) -> list[tuple[str, str, LoweredBackendModule]]:
    """(graph path, attribute, module) of each LoweredBackendModule read by gm or a graph nested in it."""
    found = []
    for path, sub in gm.named_modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            mod = lowered_module_of(sub, node) if node.op == "get_attr" else None
            if mod is not None:
                found.append((path, str(node.target), mod))
    return found
