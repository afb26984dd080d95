"""The formats module on files we build ourselves (no upstream needed)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from etlab import FormatError
from etlab.schema import bundled_program as bp
from etlab.schema import etdump as ed
from etlab.schema import flat_tensor as ft
from etlab.schema import program as pte
from etlab.schema._generated.program.Program import Program as GenProgram


def small_program() -> pte.Program:
    tensor = pte.Tensor(scalar_type=pte.ScalarType.FLOAT, sizes=[2, 3], dim_order=[0, 1],
                        allocation_info=pte.AllocationDetails(memory_id=1, memory_offset_low=64))
    plan = pte.ExecutionPlan(
        name="forward",
        container_meta_type=pte.ContainerMetadata("in", "out"),
        values=[pte.EValue(tensor), pte.EValue(pte.Int(7)), pte.EValue(pte.DoubleList([1.5, -2.0])),
                pte.EValue(pte.BoolList([True, False])), pte.EValue(pte.String("hi")), pte.EValue(pte.Null()),
                pte.EValue(pte.OptionalTensorList([0, -1]))],
        inputs=[0], outputs=[0],
        chains=[pte.Chain(inputs=[0], outputs=[0], instructions=[
            pte.Instruction(pte.KernelCall(op_index=0, args=[0, 1, 0])),
            pte.Instruction(pte.JumpFalseCall(cond_value_index=3, destination_instruction=0)),
            pte.Instruction(pte.MoveCall(0, 0)), pte.Instruction(pte.FreeCall(0)),
            pte.Instruction(pte.DelegateCall(0, [0])),
        ])],
        operators=[pte.Operator("aten::add", "out")],
        delegates=[pte.BackendDelegate("TestBackend", pte.BackendDelegateDataReference(pte.DataLocation.INLINE, 0),
                                       [pte.CompileSpec("k", b"\x01\x02")])],
        non_const_buffer_sizes=[0, 128],
    )
    return pte.Program(version=0, execution_plan=[plan], constant_buffer=[pte.Buffer(b"")],
                       backend_delegate_data=[pte.BackendDelegateInlineData(b"blob")],
                       constant_segment=pte.SubsegmentOffsets(0, [0, 0]))


def test_pte_roundtrip_with_segments():
    prog = small_program()
    blob = pte.serialize_pte(prog, [b"\xaa" * 100, b"\xbb" * 5000], segment_alignment=4096)
    parsed = pte.deserialize_pte(blob)
    assert parsed.header.segment_base_offset % 4096 == 0
    assert [bytes(s) for s in parsed.segments] == [b"\xaa" * 100, b"\xbb" * 5000]
    assert parsed.program == prog
    # The flatc-generated reader agrees with our model about the same bytes.
    gen = GenProgram.GetRootAs(blob, 0)
    assert gen.ExecutionPlan(0).Name() == b"forward"
    assert gen.ExecutionPlan(0).NonConstBufferSizes(1) == 128


def test_pte_without_segments_has_no_header():
    blob = pte.serialize_pte(small_program())
    assert blob[8:12] != b"eh00"
    assert pte.deserialize_pte(blob).header is None


def test_byte_vectors_honor_force_align():
    prog = pte.Program(constant_buffer=[pte.Buffer(b"x" * n) for n in (1, 3, 17)],
                       backend_delegate_data=[pte.BackendDelegateInlineData(b"y" * 5)])
    blob = pte.serialize_pte(prog)
    for buf in pte.deserialize_pte(blob).program.constant_buffer:
        assert np.frombuffer(buf.storage, np.uint8).ctypes.data % 16 == 0 or len(buf.storage) == 0
    bundled = bp.BundledProgram(program=blob + b"\0" * 3, method_test_suites=[])
    out = bp.serialize_bundled_program(bundled)
    view = bp.deserialize_bundled_program(out).program
    start = np.frombuffer(view, np.uint8).ctypes.data - np.frombuffer(out, np.uint8).ctypes.data
    assert start % 32 == 0


def test_ptd_roundtrip_and_named_lookup():
    layout = ft.TensorLayout(ft.ScalarType.FLOAT, [2, 2], [0, 1])
    flat = ft.FlatTensor(version=0, named_data=[ft.NamedData("w", 0, layout), ft.NamedData("blob", 1, None)])
    data = [np.arange(4, dtype=np.float32).tobytes(), b"opaque"]
    blob = ft.serialize_ptd(flat, data)
    parsed = ft.deserialize_ptd(blob)
    assert blob[8:12] == b"FH01"
    assert parsed.flat_tensor == flat
    named = parsed.named()
    assert bytes(named["w"][1]) == data[0] and named["w"][0] == layout and named["blob"][0] is None


def test_etdump_roundtrip_is_size_prefixed():
    run = ed.RunData(name="Execute", allocators=[ed.Allocator("method")], events=[
        ed.Event(profile_event=ed.ProfileEvent(name="OPERATOR_CALL", chain_index=0, instruction_id=3,
                                               start_time=10, end_time=25, delegate_debug_metadata=b"\x01")),
        ed.Event(allocation_event=ed.AllocationEvent(0, 64)),
        ed.Event(debug_event=ed.DebugEvent(chain_index=0, instruction_id=3, debug_entry=ed.Value(
            val=ed.ValueType.Tensor, tensor=ed.Tensor(ed.ScalarType.FLOAT, [2], [1], 0)))),
    ])
    dump = ed.ETDump(version=0, run_data=[run])
    blob = ed.serialize_etdump(dump)
    assert struct.unpack_from("<I", blob)[0] == len(blob) - 4 and blob[8:12] == b"ED00"
    assert ed.deserialize_etdump(blob) == dump


def test_absent_fields_survive_a_roundtrip():
    dump = ed.ETDump(run_data=[ed.RunData(name=None, allocators=None, events=None)])
    again = ed.deserialize_etdump(ed.serialize_etdump(dump))
    assert again.run_data[0].events is None and again.run_data[0].name is None


@pytest.mark.parametrize("reader,blob", [
    (pte.deserialize_pte, b"\x00" * 4),
    (pte.deserialize_pte, b"\x08\x00\x00\x00BP08" + b"\x00" * 8),
    (ft.deserialize_ptd, b"\x00" * 64),
    (ed.deserialize_etdump, b"\xff\xff\x00\x00\x00\x00\x00\x00ED00"),
    (bp.deserialize_bundled_program, b"\x08\x00\x00\x00ET12" + b"\x00" * 8),
])
def test_wrong_or_short_files_raise_format_error(reader, blob):
    with pytest.raises(FormatError, match="thefile"):
        reader(blob, what="thefile")


def test_unknown_enum_value_is_a_format_error():
    blob = bytearray(pte.serialize_pte(small_program()))
    good = pte.deserialize_pte(bytes(blob))
    assert good.program.execution_plan[0].values[0].val.scalar_type == pte.ScalarType.FLOAT
    prog = small_program()
    prog.execution_plan[0].values[0].val.scalar_type = 99  # not a ScalarType
    with pytest.raises(FormatError, match=r"Tensor.scalar_type has value 99"):
        pte.deserialize_pte(pte.serialize_pte(prog), what="bad.pte")


def test_delegate_data_reference_out_of_range_is_a_format_error():
    prog = small_program()
    prog.execution_plan[0].delegates[0].processed = pte.BackendDelegateDataReference(pte.DataLocation.SEGMENT, 3)
    blob = pte.serialize_pte(prog, [b"a", b"b"])
    with pytest.raises(FormatError, match=r"bad.pte: delegate 'TestBackend' of method 'forward' refers to segments "
                                          r"index 3, but there are 2"):
        pte.deserialize_pte(blob, what="bad.pte")
