"""Property tests: the four format loaders on damaged and random input (issue #2, "Untrusted input").

Every mutation of a small valid file must either parse or raise `FormatError` naming the file;
any other exception is a loader bug. A parse that succeeds must not hand out views past the
input buffer. Hypothesis runs derandomized so CI sees the same examples every time.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterator
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etlab import FormatError
from etlab.schema import bundled_program as bp
from etlab.schema import etdump as ed
from etlab.schema import flat_tensor as ft
from etlab.schema import program as pte

WHAT = "fuzzed.bin"
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


# -- small but representative files ---------------------------------------------------------------


@cache
def sample_pte() -> bytes:
    """Every union member kind that has its own payload, nested tables, strings, byte vectors,
    an extended header and two segments (one holding the constants)."""
    tensor = pte.Tensor(
        scalar_type=pte.ScalarType.FLOAT, sizes=[2, 3], dim_order=[0, 1],
        allocation_info=pte.AllocationDetails(memory_id=1, memory_offset_low=64),
        shape_dynamism=pte.TensorShapeDynamism.DYNAMIC_BOUND,
        extra_tensor_info=pte.ExtraTensorInfo(fully_qualified_name="w", location=pte.TensorDataLocation.EXTERNAL),
    )
    plan = pte.ExecutionPlan(
        name="forward", container_meta_type=pte.ContainerMetadata("in", "out"),
        values=[pte.EValue(tensor), pte.EValue(pte.Int(7)), pte.EValue(pte.DoubleList([1.5])),
                pte.EValue(pte.BoolList([True, False])), pte.EValue(pte.String("hi")), pte.EValue(pte.Null()),
                pte.EValue(pte.TensorList([0])), pte.EValue(pte.OptionalTensorList([0, -1]))],
        inputs=[0], outputs=[0],
        chains=[pte.Chain(
            inputs=[0], outputs=[0],
            instructions=[pte.Instruction(pte.KernelCall(op_index=0, args=[0, 1])), pte.Instruction(pte.MoveCall(0, 0)),
                          pte.Instruction(pte.DelegateCall(0, [0])), pte.Instruction(pte.JumpFalseCall(3, 0))],
            stacktrace=[pte.FrameList([pte.Frame("f.py", 3, "fn", "x = y")])],
        )],
        operators=[pte.Operator("aten::add", "out")],
        delegates=[pte.BackendDelegate("B", pte.BackendDelegateDataReference(pte.DataLocation.INLINE, 0),
                                       [pte.CompileSpec("k", b"\x01\x02")])],
        non_const_buffer_sizes=[0, 128],
        non_const_buffer_device=[pte.NonConstBufferDevice(1)],
    )
    prog = pte.Program(
        version=0, execution_plan=[plan], constant_buffer=[],
        backend_delegate_data=[pte.BackendDelegateInlineData(b"abc")],
        constant_segment=pte.SubsegmentOffsets(0, [0, 16]),
        named_data=[pte.NamedData("n", 1)],
    )
    return pte.serialize_pte(prog, [b"\x11" * 20, b"\x22" * 7], segment_alignment=16)


@cache
def sample_ptd() -> bytes:
    layout = ft.TensorLayout(ft.ScalarType.FLOAT, [2, 2], [0, 1])
    flat = ft.FlatTensor(version=0, named_data=[ft.NamedData("w", 0, layout), ft.NamedData("b", 1, None)])
    return ft.serialize_ptd(flat, [np.arange(4, dtype=np.float32).tobytes(), b"xyz"], segment_alignment=16)


@cache
def sample_etdp() -> bytes:
    t = ed.Tensor(ed.ScalarType.FLOAT, [2], [1], 0)
    events = [
        ed.Event(profile_event=ed.ProfileEvent(name="op", chain_index=0, instruction_id=1,
                                               delegate_debug_metadata=b"m", start_time=1, end_time=2)),
        ed.Event(allocation_event=ed.AllocationEvent(0, 16)),
        ed.Event(debug_event=ed.DebugEvent(debug_entry=ed.Value(ed.ValueType.Tensor, tensor=t), name="x")),
        ed.Event(debug_event=ed.DebugEvent(
            debug_entry=ed.Value(ed.ValueType.TensorList, tensor_list=ed.TensorList([t])), delegate_debug_id_str="d")),
    ]
    run = ed.RunData(name="r", bundled_input_index=-1, allocators=[ed.Allocator("a")], events=events)
    return ed.serialize_etdump(ed.ETDump(version=0, run_data=[run]))


@cache
def sample_bpte() -> bytes:
    case = bp.BundledMethodTestCase(
        inputs=[bp.Value(bp.Tensor(bp.ScalarType.FLOAT, [1], b"\0\0\x80?", [0])), bp.Value(bp.Int(3))],
        expected_outputs=[bp.Value(bp.Double(1.0)), bp.Value(bp.Bool(True))],
    )
    bundled = bp.BundledProgram(program=sample_pte(), method_test_suites=[bp.BundledMethodTestSuite("forward", [case])])
    return bp.serialize_bundled_program(bundled)


SAMPLES: dict[str, tuple[Callable[[], bytes], Callable]] = {
    "pte": (sample_pte, pte.deserialize_pte),
    "ptd": (sample_ptd, ft.deserialize_ptd),
    "etdp": (sample_etdp, ed.deserialize_etdump),
    "bpte": (sample_bpte, bp.deserialize_bundled_program),
}


# -- the property every input must satisfy --------------------------------------------------------


def _views(obj) -> Iterator[memoryview]:
    if isinstance(obj, memoryview):
        yield obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _views(getattr(obj, f.name))
    elif isinstance(obj, list):
        for x in obj:
            yield from _views(x)


def assert_views_inside(result, data: bytes) -> None:
    """Zero-copy fields of `result` must lie inside `data` (never past it, never elsewhere)."""
    base = np.frombuffer(data, np.uint8).ctypes.data
    for mv in _views(result):
        if mv.nbytes:
            start = np.frombuffer(mv, np.uint8).ctypes.data
            assert base <= start and start + mv.nbytes <= base + len(data), "decoded view lies outside the input"


def check_rejection(e: FormatError) -> None:
    assert str(e).startswith(f"{WHAT}: "), f"error does not name the file: {e}"
    # TableCodec.decode turns reader exceptions that slip past the verifier into FormatError
    # `from` the original; that backstop firing means the verifier missed a defect.
    assert e.__cause__ is None, f"verifier missed a defect; the reader failed with {e.__cause__!r}"


def parse_or_reject(kind: str, data: bytes):
    """Parses `data`; FormatError (naming the file) is fine, anything else fails the test."""
    load = SAMPLES[kind][1]
    try:
        result = load(data, what=WHAT)
    except FormatError as e:
        check_rejection(e)
        return None
    assert_views_inside(result, data)
    if kind == "bpte" and result.program:  # the embedded .pte is untrusted too
        try:
            assert_views_inside(pte.deserialize_pte(result.program, what=WHAT), data)
        except FormatError as e:
            check_rejection(e)
    return result


@pytest.mark.parametrize("kind", SAMPLES)
def test_sample_parses(kind: str):
    assert parse_or_reject(kind, SAMPLES[kind][0]()) is not None


def test_samples_cover_the_containers():
    parsed = pte.deserialize_pte(sample_pte())
    assert parsed.header is not None and [bytes(s) for s in parsed.segments] == [b"\x11" * 20, b"\x22" * 7]
    kinds = {type(v.val).__name__ for v in parsed.program.execution_plan[0].values}
    assert kinds == {"Tensor", "Int", "DoubleList", "BoolList", "String", "Null", "TensorList", "OptionalTensorList"}
    assert bytes(ft.deserialize_ptd(sample_ptd()).segments[1]) == b"xyz"
    assert bytes(bp.deserialize_bundled_program(sample_bpte()).program) == sample_pte()


@pytest.mark.parametrize("kind", SAMPLES)
def test_truncation_at_every_length(kind: str):
    data = SAMPLES[kind][0]()
    for n in range(len(data)):
        parse_or_reject(kind, data[:n])


@pytest.mark.parametrize("kind", SAMPLES)
def test_truncated_flatbuffer_is_rejected(kind: str):
    """Cutting into the FlatBuffer itself (not just segment bytes or trailing padding) never parses."""
    data = SAMPLES[kind][0]()
    if kind == "pte":
        end = pte.read_extended_header(data).program_size
    elif kind == "ptd":
        end = sum(struct.unpack_from("<QQ", data, 16))  # flatbuffer_offset + flatbuffer_size
    elif kind == "etdp":
        end = len(data)  # the size prefix covers every byte
    else:
        end = len(data.rstrip(b"\0"))  # the last string's NUL terminator is not needed to parse
    for n in range(end):
        with pytest.raises(FormatError) as info:
            SAMPLES[kind][1](data[:n], what=WHAT)
        check_rejection(info.value)


@pytest.mark.parametrize("kind", SAMPLES)
@FUZZ
@given(data=st.data())
def test_random_bit_flips(kind: str, data):
    blob = bytearray(SAMPLES[kind][0]())
    bits = data.draw(st.lists(st.integers(0, len(blob) * 8 - 1), min_size=1, max_size=8), label="bits")
    for b in bits:
        blob[b // 8] ^= 1 << (b % 8)
    parse_or_reject(kind, bytes(blob))


@pytest.mark.parametrize("kind", SAMPLES)
@FUZZ
@given(data=st.data())
def test_random_byte_overwrites(kind: str, data):
    """Whole words overwritten with boundary values: where offsets and lengths live."""
    blob = bytearray(SAMPLES[kind][0]())
    for _ in range(data.draw(st.integers(1, 4), label="n")):
        at = data.draw(st.integers(0, len(blob) - 4), label="at")
        word = data.draw(st.sampled_from([0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                                          len(blob), len(blob) - at, at]), label="word")
        blob[at : at + 4] = struct.pack("<I", word & 0xFFFFFFFF)
    parse_or_reject(kind, bytes(blob))


MAGIC = {"pte": b"ET12", "ptd": b"FT01", "etdp": b"ED00", "bpte": b"BP08"}


@pytest.mark.parametrize("kind", SAMPLES)
@FUZZ
@given(data=st.data())
def test_random_bytes_behind_valid_magic(kind: str, data):
    body = data.draw(st.binary(min_size=0, max_size=400), label="body")
    root = data.draw(st.integers(0, 64) | st.integers(0, 2**32 - 1), label="root")
    head = struct.pack("<I", root) + MAGIC[kind]
    if kind == "pte" and data.draw(st.booleans(), label="eh00"):
        total = len(head) + 32 + len(body)
        program_size = data.draw(st.integers(8, total), label="program_size")
        head += struct.pack("<4sIQQQ", b"eh00", 32, program_size, program_size, total - program_size)
    elif kind == "ptd":
        total = len(head) + 40 + len(body)
        fb_size = data.draw(st.integers(0, total - 48), label="fb_size")
        head += struct.pack("<4sIQQQQ", b"FH01", 40, 48, fb_size, 48 + fb_size, total - 48 - fb_size)
    blob = head + body
    if kind == "etdp":
        prefix = data.draw(st.sampled_from([len(blob), 0, 2**32 - 1]) | st.integers(0, len(blob)), label="prefix")
        blob = struct.pack("<I", prefix) + blob
    parse_or_reject(kind, blob)
