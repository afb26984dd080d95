"""The format loaders on crafted hostile input: exact defects, exact messages, bounded cost.

Each case patches one field of a small valid file, found through the flatc-generated reader, so
that the expected message (which names the file and the defect) can be spelled out in full.
Failing parses run under tracemalloc: a declared size of 2^31 or 2^64 must not be allocated.
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from etlab import FormatError
from etlab.schema import bundled_program as bp
from etlab.schema import etdump as ed
from etlab.schema import flat_tensor as ft
from etlab.schema import load_file, load_pte
from etlab.schema import program as pte
from etlab.schema._generated.bundled_program.BundledProgram import BundledProgram as GenBundled
from etlab.schema._generated.bundled_program.Tensor import Tensor as GenBundledTensor
from etlab.schema._generated.etdump.ETDump import ETDump as GenETDump
from etlab.schema._generated.flat_tensor.FlatTensor import FlatTensor as GenFlatTensor
from etlab.schema._generated.layouts import LAYOUTS
from etlab.schema._generated.program.Program import Program as GenProgram
from etlab.schema._generated.program.Tensor import Tensor as GenPteTensor

WHAT = "case.bin"
U32_MAX, U64_MAX = 2**32 - 1, 2**64 - 1

# -- small valid files ----------------------------------------------------------------------------


def make_pte(constant_segment: pte.SubsegmentOffsets | None = None) -> bytes:
    tensor = pte.Tensor(scalar_type=pte.ScalarType.FLOAT, sizes=[2], dim_order=[0])
    plan = pte.ExecutionPlan(
        name="forward",
        values=[pte.EValue(tensor), pte.EValue(pte.Int(7)), pte.EValue(pte.String("hi"))],
        inputs=[0], outputs=[0],
        chains=[pte.Chain(inputs=[0], outputs=[0], instructions=[pte.Instruction(pte.KernelCall(0, [0, 1]))])],
        operators=[pte.Operator("aten::add", "out")],
        non_const_buffer_sizes=[0, 64],
    )
    prog = pte.Program(
        execution_plan=[plan], backend_delegate_data=[pte.BackendDelegateInlineData(b"blob")],
        constant_segment=constant_segment or pte.SubsegmentOffsets(0, [0, 16]), named_data=[pte.NamedData("n", 1)],
    )
    return pte.serialize_pte(prog, [b"\x11" * 20, b"\x22" * 7], segment_alignment=16)


def make_ptd() -> bytes:
    flat = ft.FlatTensor(named_data=[ft.NamedData("w", 0, ft.TensorLayout(ft.ScalarType.FLOAT, [2], [0])),
                                     ft.NamedData("b", 1, None)])
    return ft.serialize_ptd(flat, [np.ones(2, np.float32).tobytes(), b"xyz"], segment_alignment=16)


def make_etdp() -> bytes:
    profile = ed.ProfileEvent(name="op", delegate_debug_metadata=b"meta", start_time=1, end_time=2)
    event = ed.Event(profile_event=profile)
    debug = ed.Event(debug_event=ed.DebugEvent(debug_entry=ed.Value(ed.ValueType.Int, int_value=ed.Int(3))))
    return ed.serialize_etdump(ed.ETDump(run_data=[ed.RunData(name="run", events=[event, debug])]))


def make_bpte() -> bytes:
    case = bp.BundledMethodTestCase(inputs=[bp.Value(bp.Tensor(bp.ScalarType.FLOAT, [1], b"\0\0\x80?", [0]))],
                                    expected_outputs=[bp.Value(bp.Int(1))])
    return bp.serialize_bundled_program(
        bp.BundledProgram(program=make_pte(), method_test_suites=[bp.BundledMethodTestSuite("forward", [case])]))


# -- locating fields through the generated reader -------------------------------------------------


def _field(obj, ns: str, table: str, name: str) -> int:
    """Absolute position of a present field of a generated-reader table object."""
    slot = next(row[1] for row in LAYOUTS["tables"][ns][table] if row[0] == name)
    o = obj._tab.Offset(4 + 2 * slot)
    assert o, f"{table}.{name} is absent from the sample"
    return obj._tab.Pos + o


def _target(data: bytes, pos: int) -> int:
    """Where the offset stored at `pos` points (a string's or vector's length word, or a table)."""
    return pos + struct.unpack_from("<I", data, pos)[0]


def _put(data: bytes, fmt: str, pos: int, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


def _as(cls, table):
    """A union member (a bare flatbuffers Table from the reader) as the generated class `cls`."""
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    return obj


def _plan(data: bytes):
    return GenProgram.GetRootAs(data, 0).ExecutionPlan(0)


# Each case: () -> (loader, mutated file, the exact message after "case.bin: ").
Case = Callable[[], tuple[Callable, bytes, str]]


def pte_vector_len() -> tuple:
    d = make_pte()
    at = _target(d, _field(_plan(d), "program", "ExecutionPlan", "non_const_buffer_sizes"))
    return (pte.deserialize_pte, _put(d, "<I", at, 2**31),
            f"ExecutionPlan.non_const_buffer_sizes: vector of {2**31} elements at offset {at} runs past the end "
            "of the buffer")


def pte_table_vector_len() -> tuple:
    d = make_pte()
    at = _target(d, _field(GenProgram.GetRootAs(d, 0), "program", "Program", "execution_plan"))
    return (pte.deserialize_pte, _put(d, "<I", at, 2**31),
            f"Program.execution_plan: vector of {2**31} elements at offset {at} runs past the end of the buffer")


def pte_byte_vector_len() -> tuple:
    d = make_pte()
    blob = GenProgram.GetRootAs(d, 0).BackendDelegateData(0)
    at = _target(d, _field(blob, "program", "BackendDelegateInlineData", "data"))
    return (pte.deserialize_pte, _put(d, "<I", at, U32_MAX),
            f"BackendDelegateInlineData.data: vector of {U32_MAX} elements at offset {at} runs past the end of the "
            "buffer")


def pte_string_len() -> tuple:
    d = make_pte()
    at = _target(d, _field(_plan(d).Operators(0), "program", "Operator", "name"))
    return (pte.deserialize_pte, _put(d, "<I", at, U32_MAX),
            f"Operator.name: string of {U32_MAX} bytes at offset {at} runs past the end of the buffer")


def pte_string_not_utf8() -> tuple:
    d = make_pte()
    at = _target(d, _field(_plan(d).Operators(0), "program", "Operator", "name"))
    return (pte.deserialize_pte, _put(d, "<B", at + 4, 0xFF),
            f"Operator.name: string at offset {at} is not UTF-8 (invalid start byte)")


def pte_union_tag() -> tuple:
    d = make_pte()
    ev = _plan(d).Values(1)
    at = ev._tab.Pos + ev._tab.Offset(4)  # val_type, the tag slot in front of `val`
    return (pte.deserialize_pte, _put(d, "<B", at, 200),
            "EValue.val has union tag 200, but program.KernelTypes has 11 members")


def pte_enum() -> tuple:
    d = make_pte()
    tensor = _as(GenPteTensor, _plan(d).Values(0).Val())
    at = _field(tensor, "program", "Tensor", "scalar_type")
    return (pte.deserialize_pte, _put(d, "<b", at, 100),
            "Tensor.scalar_type has value 100, which is not a scalar_type.ScalarType")


def pte_root_offset() -> tuple:
    d = make_pte()
    return (pte.deserialize_pte, _put(d, "<I", 0, U32_MAX),
            f"Program table at offset {U32_MAX} lies outside the buffer ({pte.read_extended_header(d).program_size} "
            "bytes)")


def pte_vtable_soffset() -> tuple:
    d = make_pte()
    root = struct.unpack_from("<I", d, 0)[0]
    return (pte.deserialize_pte, _put(d, "<i", root, -(2**31)),
            f"Program table vtable at offset {root + 2**31} lies outside the buffer "
            f"({pte.read_extended_header(d).program_size} bytes)")


def pte_vtable_size() -> tuple:
    d = make_pte()
    root = struct.unpack_from("<I", d, 0)[0]
    vt = root - struct.unpack_from("<i", d, root)[0]
    return (pte.deserialize_pte, _put(d, "<H", vt, 0xFFFE), f"Program table at offset {root} has a malformed vtable "
            "(size 65534)")


def pte_table_size() -> tuple:
    d = make_pte()
    root = struct.unpack_from("<I", d, 0)[0]
    vt = root - struct.unpack_from("<i", d, root)[0]
    return (pte.deserialize_pte, _put(d, "<H", vt + 2, 0xFFFF),
            f"Program table at offset {root} claims 65535 bytes, past the end of the buffer")


def pte_segment_offset() -> tuple:
    d = make_pte()
    at = _field(GenProgram.GetRootAs(d, 0).Segments(1), "program", "DataSegment", "offset")
    base = pte.read_extended_header(d).segment_base_offset
    return (pte.deserialize_pte, _put(d, "<Q", at, U64_MAX - 15),
            f"segment 1 (offset {U64_MAX - 15}, size 7) lies outside the file ({len(d)} bytes, segments start at "
            f"{base})")


def pte_segment_size() -> tuple:
    d = make_pte()
    at = _field(GenProgram.GetRootAs(d, 0).Segments(0), "program", "DataSegment", "size")
    base = pte.read_extended_header(d).segment_base_offset
    return (pte.deserialize_pte, _put(d, "<Q", at, U64_MAX),
            f"segment 0 (offset 0, size {U64_MAX}) lies outside the file ({len(d)} bytes, segments start at {base})")


def pte_program_size() -> tuple:
    d = make_pte()
    return (pte.deserialize_pte, _put(d, "<Q", 16, len(d) + 1),
            f"extended header program_size {len(d) + 1} is outside the file ({len(d)} bytes)")


def pte_program_size_huge() -> tuple:
    d = make_pte()
    return (pte.deserialize_pte, _put(d, "<Q", 16, U64_MAX),
            f"extended header program_size {U64_MAX} is outside the file ({len(d)} bytes)")


def pte_segment_base() -> tuple:
    d = _put(make_pte(), "<Q", 32, 0)  # segment_data_size 0: "not recorded", as older writers leave it
    return (pte.deserialize_pte, _put(d, "<Q", 24, U64_MAX - 4095),
            f"segment 0 (offset 0, size 20) lies outside the file ({len(d)} bytes, segments start at "
            f"{U64_MAX - 4095})")


def pte_segment_data_size() -> tuple:
    d = make_pte()
    base = pte.read_extended_header(d).segment_base_offset
    return (pte.deserialize_pte, _put(d, "<Q", 32, U64_MAX),
            f"extended header places {U64_MAX} bytes of segment data at offset {base}, past the end of the file "
            f"({len(d)} bytes; truncated?)")


def pte_truncated_segments() -> tuple:
    d = make_pte()
    base = pte.read_extended_header(d).segment_base_offset
    size = len(d) - base
    return (pte.deserialize_pte, d[:-3],
            f"extended header places {size} bytes of segment data at offset {base}, past the end of the file "
            f"({len(d) - 3} bytes; truncated?)")


def pte_header_length() -> tuple:
    return pte.deserialize_pte, _put(make_pte(), "<I", 12, 8), "extended header claims 8 bytes, at least 24 needed"


def pte_no_header_but_segments() -> tuple:
    return (pte.deserialize_pte, _put(make_pte(), "<4s", 8, b"xx00"),
            "program lists 2 segments but has no extended header")


def pte_constant_offset() -> tuple:
    d = make_pte()
    sub = GenProgram.GetRootAs(d, 0).ConstantSegment()
    at = _target(d, _field(sub, "program", "SubsegmentOffsets", "offsets")) + 4 + 8  # offsets[1]
    return (pte.deserialize_pte, _put(d, "<Q", at, U64_MAX),
            f"constant_segment offset 1 ({U64_MAX}) lies past the end of segment 0 (20 bytes, 2 segments in the file)")


def pte_named_data_index() -> tuple:
    d = make_pte()
    at = _field(GenProgram.GetRootAs(d, 0).NamedData(0), "program", "NamedData", "segment_index")
    return (pte.deserialize_pte, _put(d, "<I", at, U32_MAX),
            f"named data 'n' refers to segment {U32_MAX}, but there are 2")


def pte_wrong_identifier() -> tuple:
    return (pte.deserialize_pte, _put(make_pte(), "<4s", 4, b"BP08"),
            "not a .pte file (identifier b'BP08', expected b'ET12')")


def pte_wrong_version() -> tuple:
    return (pte.deserialize_pte, _put(make_pte(), "<4s", 4, b"ET99"),
            "unsupported .pte version b'ET99'; this reader handles b'ET12'")


def ptd_flatbuffer_size() -> tuple:
    d = make_ptd()
    return (ft.deserialize_ptd, _put(d, "<Q", 24, U64_MAX),
            f"header places data past the end of the file ({len(d)} bytes)")


def ptd_segment_base() -> tuple:
    d = make_ptd()
    return (ft.deserialize_ptd, _put(d, "<Q", 32, U64_MAX),
            f"header places data past the end of the file ({len(d)} bytes)")


def ptd_segment_size() -> tuple:
    d = make_ptd()
    at = _field(GenFlatTensor.GetRootAs(d, 0).Segments(0), "flat_tensor", "DataSegment", "size")
    data_size = struct.unpack_from("<Q", d, 40)[0]
    return (ft.deserialize_ptd, _put(d, "<Q", at, U64_MAX),
            f"segment 0 (offset 0, size {U64_MAX}) lies outside the segment data ({data_size} bytes)")


def ptd_named_index() -> tuple:
    d = make_ptd()
    at = _field(GenFlatTensor.GetRootAs(d, 0).NamedData(1), "flat_tensor", "NamedData", "segment_index")
    return (ft.deserialize_ptd, _put(d, "<I", at, U32_MAX),
            f"named data 'b' refers to segment {U32_MAX}, but there are 2")


def ptd_header_length() -> tuple:
    return ft.deserialize_ptd, _put(make_ptd(), "<I", 12, 8), "FH01 header claims 8 bytes, at least 40 needed"


def ptd_wrong_magic() -> tuple:
    return (ft.deserialize_ptd, _put(make_ptd(), "<4s", 8, b"eh00"),
            "not a .ptd file (expected identifier b'FT01' and header b'FH01')")


def _etdump_run(d: bytes):
    return GenETDump.GetRootAs(d, 4).RunData(0)


def etdp_size_prefix() -> tuple:
    d = make_etdp()
    return (ed.deserialize_etdump, _put(d, "<I", 0, U32_MAX),
            f"size prefix says {U32_MAX} bytes but only {len(d) - 4} follow")


def etdp_events_len() -> tuple:
    d = make_etdp()
    at = _target(d, _field(_etdump_run(d), "etdump", "RunData", "events"))
    # the verifier sees the buffer after the size prefix, so its offsets are 4 less
    return (ed.deserialize_etdump, _put(d, "<I", at, 2**31),
            f"RunData.events: vector of {2**31} elements at offset {at - 4} runs past the end of the buffer")


def etdp_name_len() -> tuple:
    d = make_etdp()
    at = _target(d, _field(_etdump_run(d), "etdump", "RunData", "name"))
    return (ed.deserialize_etdump, _put(d, "<I", at, U32_MAX),
            f"RunData.name: string of {U32_MAX} bytes at offset {at - 4} runs past the end of the buffer")


def etdp_metadata_len() -> tuple:
    d = make_etdp()
    prof = _etdump_run(d).Events(0).ProfileEvent()
    at = _target(d, _field(prof, "etdump", "ProfileEvent", "delegate_debug_metadata"))
    return (ed.deserialize_etdump, _put(d, "<I", at, 2**31),
            f"ProfileEvent.delegate_debug_metadata: vector of {2**31} elements at offset {at - 4} runs past the end "
            "of the buffer")


def etdp_enum() -> tuple:
    d = make_etdp()
    value = _etdump_run(d).Events(1).DebugEvent().DebugEntry()
    at = _field(value, "etdump", "Value", "val")
    return ed.deserialize_etdump, _put(d, "<b", at, 99), "Value.val has value 99, which is not a etdump.ValueType"


def etdp_wrong_identifier() -> tuple:
    return (ed.deserialize_etdump, _put(make_etdp(), "<4s", 8, b"XX00"),
            "file identifier is b'XX00', expected b'ED00' (not a .etdump FlatBuffer)")


def bpte_tensor_data_len() -> tuple:
    d = make_bpte()
    tensor = _as(GenBundledTensor, GenBundled.GetRootAs(d, 0).MethodTestSuites(0).TestCases(0).Inputs(0).Val())
    at = _target(d, _field(tensor, "bundled_program", "Tensor", "data"))
    return (bp.deserialize_bundled_program, _put(d, "<I", at, 2**31),
            f"Tensor.data: vector of {2**31} elements at offset {at} runs past the end of the buffer")


def bpte_program_len() -> tuple:
    d = make_bpte()
    at = _target(d, _field(GenBundled.GetRootAs(d, 0), "bundled_program", "BundledProgram", "program"))
    return (bp.deserialize_bundled_program, _put(d, "<I", at, U32_MAX),
            f"BundledProgram.program: vector of {U32_MAX} elements at offset {at} runs past the end of the buffer")


def bpte_wrong_identifier() -> tuple:
    return (bp.deserialize_bundled_program, _put(make_bpte(), "<4s", 4, b"ET12"),
            "file identifier is b'ET12', expected b'BP08' (not a .bundled_program FlatBuffer)")


def bpte_too_short() -> tuple:
    return bp.deserialize_bundled_program, make_bpte()[:7], "7 bytes is too short for a FlatBuffer"


CASES: list[Case] = [
    pte_vector_len, pte_table_vector_len, pte_byte_vector_len, pte_string_len, pte_string_not_utf8, pte_union_tag,
    pte_enum, pte_root_offset, pte_vtable_soffset, pte_vtable_size, pte_table_size, pte_segment_offset,
    pte_segment_size, pte_program_size, pte_program_size_huge, pte_segment_base, pte_segment_data_size,
    pte_truncated_segments, pte_header_length, pte_no_header_but_segments, pte_constant_offset, pte_named_data_index,
    pte_wrong_identifier, pte_wrong_version,
    ptd_flatbuffer_size, ptd_segment_base, ptd_segment_size, ptd_named_index, ptd_header_length, ptd_wrong_magic,
    etdp_size_prefix, etdp_events_len, etdp_name_len, etdp_metadata_len, etdp_enum, etdp_wrong_identifier,
    bpte_tensor_data_len, bpte_program_len, bpte_wrong_identifier, bpte_too_short,
]


def failing_parse(load: Callable, data: bytes) -> tuple[FormatError, int]:
    """Runs a parse that must fail; returns the error and the peak memory it took."""
    tracemalloc.start()
    try:
        with pytest.raises(FormatError) as info:
            load(data, what=WHAT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return info.value, peak


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_defect_is_named_and_cheap(case: Case):
    load, data, message = case()
    err, peak = failing_parse(load, data)
    assert str(err) == f"{WHAT}: {message}"
    assert err.__cause__ is None  # found by the checks, not by the reader tripping over it
    assert peak < 10 * len(data) + (1 << 20), f"failing parse of {len(data)} bytes peaked at {peak} bytes"


# -- what must still parse ------------------------------------------------------------------------


def test_byte_vectors_stay_inside_the_flatbuffer():
    """A byte vector may reach the end of the FlatBuffer region but not into the segments behind it."""
    d = make_pte()
    program_size = pte.read_extended_header(d).program_size
    at = _target(d, _field(GenProgram.GetRootAs(d, 0).BackendDelegateData(0), "program", "BackendDelegateInlineData",
                           "data"))
    longest = program_size - at - 4
    view = pte.deserialize_pte(_put(d, "<I", at, longest)).program.backend_delegate_data[0].data
    assert len(view) == longest
    with pytest.raises(FormatError, match="runs past the end of the buffer"):
        pte.deserialize_pte(_put(d, "<I", at, longest + 1))


def test_24_byte_extended_header_is_accepted():
    """Upstream reads headers written before segment_data_size existed (length 24)."""
    parsed = pte.deserialize_pte(_put(make_pte(), "<I", 12, 24))
    assert parsed.header.length == 24 and parsed.header.segment_data_size == 0
    assert [bytes(s) for s in parsed.segments] == [b"\x11" * 20, b"\x22" * 7]


def test_absent_constant_segment_is_empty():
    """Upstream names a constant segment it never writes when a program has no constants."""
    parsed = pte.deserialize_pte(make_pte(pte.SubsegmentOffsets(segment_index=2, offsets=[0])))
    assert parsed.program.constant_segment.offsets == [0]
    with pytest.raises(FormatError, match=r"constant_segment offset 1 \(8\) lies past the end of segment 2 \(0 bytes"):
        pte.deserialize_pte(make_pte(pte.SubsegmentOffsets(segment_index=2, offsets=[0, 8])))


# -- files on disk: the message names the path ----------------------------------------------------


@pytest.mark.parametrize("make, suffix", [(make_pte, ".pte"), (make_ptd, ".ptd"), (make_etdp, ".etdp"),
                                          (make_bpte, ".bpte")])
def test_errors_name_the_path(tmp_path, make, suffix):
    path = tmp_path / f"model{suffix}"
    data = make()
    path.write_bytes(data)
    assert load_file(path) is not None
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError) as info:
        load_file(path)
    assert str(info.value).startswith(f"{path}: ")


def test_load_pte_names_the_path(tmp_path):
    path = tmp_path / "bad.pte"
    path.write_bytes(_put(make_pte(), "<Q", 16, 10**9))
    with pytest.raises(FormatError) as info:
        load_pte(path)
    size = path.stat().st_size
    assert str(info.value) == f"{path}: extended header program_size {10**9} is outside the file ({size} bytes)"


def test_empty_file_and_directory(tmp_path):
    empty = tmp_path / "empty.pte"
    empty.write_bytes(b"")
    with pytest.raises(FormatError, match=r"empty\.pte: 0 bytes is too short for a \.pte file"):
        load_pte(empty)
    with pytest.raises(FormatError, match="no ET12, FT01, BP08 or ED00 identifier"):
        load_file(empty)
    with pytest.raises(FormatError, match="is a directory"):
        load_file(tmp_path)
