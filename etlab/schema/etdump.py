"""The .etdp run trace (ETDump): typed model and (de)serialization.

The file is a size-prefixed FlatBuffer (identifier ED00). Tensor values carry only metadata and
an offset; their bytes live in a separate debug buffer file written next to it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from etlab.errors import FormatError
from etlab.schema._codec import TableCodec, make_enum
from etlab.schema._scalars import Bool, Double, Int
from etlab.schema._scalars import Null as Null  # tables of etdump.fbs: the codec needs them here
from etlab.schema._scalars import String as String

# etlab's runtime ends a run that dropped logged values (debug buffer full) with a zero-length
# profile event of this name; its delegate_debug_metadata is the count in ASCII digits.
DROPPED_DEBUG_VALUES = "etlab::dropped_debug_values"
# Event names the ExecuTorch runtime writes by convention (not graph nodes):
# around methods (they belong to no node) ...
LOAD_METHOD, METHOD_INIT, METHOD_EXECUTE = "Program::load_method", "Method::init", "Method::execute"
FRAMEWORK_EVENT_NAMES = frozenset({METHOD_INIT, LOAD_METHOD, METHOD_EXECUTE, DROPPED_DEBUG_VALUES})
# ... the per-instruction wrapper (its time is the kernel's plus dispatch) and a delegate call.
OPERATOR_CALL = "OPERATOR_CALL"
DELEGATE_CALL = "DELEGATE_CALL"
# A kernel call is profiled as "native_call_<op>.<overload>" (the operator without its namespace), just
# before the OPERATOR_CALL of the same instruction. Written and read only through the two helpers below.
KERNEL_EVENT_PREFIX = "native_call_"


def kernel_event_name(operator: str) -> str:
    """The event a kernel call is profiled under.

    >>> kernel_event_name("aten::add.out")
    'native_call_add.out'
    """
    return KERNEL_EVENT_PREFIX + operator.split("::", 1)[-1]


def kernel_of_event(name: str) -> str | None:
    """The operator of a kernel event; None for any other event.

    >>> kernel_of_event("native_call_add.out")
    'add.out'
    >>> kernel_of_event("OPERATOR_CALL") is None
    True
    """
    return name[len(KERNEL_EVENT_PREFIX):] if name.startswith(KERNEL_EVENT_PREFIX) and len(name) > len(
        KERNEL_EVENT_PREFIX) else None


ScalarType = make_enum("scalar_type.ScalarType")
ValueType = make_enum("etdump.ValueType")



@dataclass
class Tensor:
    """A logged tensor's metadata (dtype, sizes, strides) and the offset of its bytes in the debug buffer."""

    scalar_type: ScalarType = ScalarType.FLOAT
    sizes: list[int] | None = field(default_factory=list)
    strides: list[int] | None = field(default_factory=list)
    offset: int = 0




@dataclass
class Float:
    """A logged float value."""

    float_val: float = 0.0




@dataclass
class TensorList:
    """A logged list of tensors."""

    tensors: list[Tensor] | None = field(default_factory=list)


@dataclass
class Value:
    """A logged value: `val` says which of the fields holds it; `output` marks a method output."""

    val: ValueType = ValueType.Null
    tensor: Tensor | None = None
    tensor_list: TensorList | None = None
    int_value: Int | None = None
    float_value: Float | None = None
    double_value: Double | None = None
    bool_value: Bool | None = None
    output: Bool | None = None


@dataclass
class DebugEvent:
    """A value an instruction or a delegate produced at run time, logged for numerical debugging: where it came from
    (chain, instruction or delegate debug id, name) and the value."""

    chain_index: int = 0
    instruction_id: int = -1
    debug_entry: Value | None = None
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str | None = None
    name: str | None = None


@dataclass
class AllocationEvent:
    """An allocation during the run: which allocator and how many bytes."""

    allocator_id: int = 0
    allocation_size: int = 0


@dataclass
class ProfileEvent:
    """A timed span (start and end ticks) of an instruction, a delegate or a framework step, with the ids that join
    it back to the program."""

    name: str | None = None
    chain_index: int = 0
    instruction_id: int = -1
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str | None = None
    delegate_debug_metadata: bytes | memoryview | None = None
    start_time: int = 0
    end_time: int = 0


@dataclass
class Event:
    """One entry of a run block: a profile, allocation or debug event (exactly one set)."""

    profile_event: ProfileEvent | None = None
    allocation_event: AllocationEvent | None = None
    debug_event: DebugEvent | None = None


@dataclass
class Allocator:
    """A named memory allocator that allocation events refer to by index."""

    name: str | None = None


@dataclass
class RunData:
    """One block of a run (e.g. one method's executions): its events in order, the allocators they name, and the
    bundled input it ran when run from a bundled program."""

    name: str | None = None
    bundled_input_index: int = -1
    allocators: list[Allocator] | None = field(default_factory=list)
    events: list[Event] | None = field(default_factory=list)
    threads: int = 0  # etlab only: intra-op threads the block ran with (0: not recorded)


@dataclass
class DebugBufferDigest:
    """etlab's binding of an ETDump to its debug buffer (upstream's readers skip it): the buffer's size
    and SHA-256, recorded when both are written, so that a reader refuses a buffer from another run."""

    size: int = 0
    sha256: bytes | memoryview | None = None


@dataclass
class ETDump:
    """The root of an .etdp file: the run blocks a traced run wrote."""

    version: int = 0
    run_data: list[RunData] | None = field(default_factory=list)
    debug_buffer: DebugBufferDigest | None = None


def debug_buffer_digest(data) -> DebugBufferDigest:
    """What an ETDump records of the debug buffer written with it (`data`: its bytes)."""
    view = memoryview(data).cast("B")
    return DebugBufferDigest(size=len(view), sha256=hashlib.sha256(view).digest())


_CODEC = TableCodec("etdump", {name: cls for name, cls in globals().items() if isinstance(cls, type)})


SEVERAL_KINDS = "holds more than one of profile_event, debug_event and allocation_event (an event is one of them)"


def _check_events(etdump: ETDump, what: str) -> ETDump:
    """An Event is one kind of event: readers that keep one row per event (the Inspector's) could
    not say which fields belong to which, so a file that sets several is rejected."""
    for r, run in enumerate(etdump.run_data or ()):
        for i, ev in enumerate(run.events or ()):
            if (ev.profile_event is not None) + (ev.debug_event is not None) + (ev.allocation_event is not None) > 1:
                raise FormatError(f"{what}: run {r} event {i} {SEVERAL_KINDS}")
    return etdump


def deserialize_etdump(data, *, what: str = "etdump") -> ETDump:
    """Parses a size-prefixed .etdp buffer (bytes/memoryview/mmap)."""
    return _check_events(_CODEC.decode(data, what=what, size_prefixed=True), what)


def serialize_etdump(etdump: ETDump) -> bytes:
    """The size-prefixed .etdp bytes of `etdump` (identifier ED00), as upstream's runtime writes them."""
    return _CODEC.encode(etdump, size_prefixed=True)
